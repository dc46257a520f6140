# Session 36, call 2 (warm after call 1): racecheck of the KV-cache kernels (MLA, e4m3: needed before
# they land), split_keys (.ab/t/split): its bitwise check, speed against the planes pass and GPU test;
# then the MLA and e4m3 decode rows and the float32 rows beside torch (root: the pending patches).
export PYTHONUNBUFFERED=1
R=$PWD
P=$R/bench/runs/2026-12-05-s33/pre.py
t0=$(date +%s)
(cd .ab/t/split && PYTHONPATH=$PWD timeout 60 python $P fp32 16 > /dev/null) &
PYTHONPATH=$R timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/racecheck_kvc.txt 2>&1; echo "racecheck kvc rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/racecheck_kvc.txt
wait
(cd .ab/t/split && PYTHONPATH=$PWD timeout 180 python $R/bench/runs/2026-12-05-s36/split_check.py > $OUT/split_check.txt 2>&1); echo "split rc=$? at $(( $(date +%s) - t0 )) s"; tail -22 $OUT/split_check.txt
(cd .ab/t/split && PYTHONPATH=$PWD timeout 60 python -m pytest -q -p no:cacheprovider tests/test_gpu_features.py -k splits_keys > $OUT/split_tests.txt 2>&1); echo "split tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/split_tests.txt
PYTHONPATH=$R timeout 90 python bench/decode.py --quick --rows mla fp8 > $OUT/decode.txt 2>&1; tail -12 $OUT/decode.txt | cut -c1-160
F="--dtypes fp32 --headdims 64,128 --seqlens 1024,4096 --causal 0,1"
PYTHONPATH=$R timeout $(( 590 - ($(date +%s) - t0) )) python bench/bench.py $F --out $OUT/fp32_new > $OUT/bench_new.txt 2>&1
tail -10 $OUT/bench_new.txt | cut -c1-160
echo "end at $(( $(date +%s) - t0 )) s"
