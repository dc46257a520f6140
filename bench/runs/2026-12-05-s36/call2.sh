# Session 36's call 2 (for session 37, warm after call1b.sh): split_keys' GPU test (.ab/t/split), the MLA
# and e4m3 decode rows and the float32 rows beside torch (root: main + the pending patches).
export PYTHONUNBUFFERED=1
R=$PWD
t0=$(date +%s)
(cd .ab/t/split && PYTHONPATH=$PWD timeout 120 python -m pytest -q -p no:cacheprovider tests/test_gpu_features.py -k splits_keys > $OUT/split_tests.txt 2>&1); echo "split tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/split_tests.txt
PYTHONPATH=$R timeout 120 python bench/decode.py --quick --rows mla fp8 > $OUT/decode.txt 2>&1; tail -12 $OUT/decode.txt | cut -c1-160
F="--dtypes fp32 --headdims 64,128 --seqlens 1024,4096 --causal 0,1"
PYTHONPATH=$R timeout 200 python bench/bench.py $F --out $OUT/fp32_new > $OUT/bench_new.txt 2>&1
(cd .ab/t/split && PYTHONPATH=$PWD timeout 120 python bench/bench.py $F --no-peers --out $OUT/fp32_split > $OUT/bench_split.txt 2>&1)
tail -10 $OUT/bench_new.txt | cut -c1-160; grep -h "fp32 d" $OUT/bench_split.txt | cut -c1-150
echo "end at $(( $(date +%s) - t0 )) s"
