# Session 35, call B: the e4m3 decode test after the softcap fix, then speed (main in .ab/t/main against
# the patched tree, one machine), then the sanitizers of the new kernels.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
PYTHONPATH=$PWD timeout 60 python -m pytest -q -m gpu -p no:cacheprovider tests/test_fp8.py -k "e4m3_kv_cache" 2>&1 | tail -2
F="--dtypes fp32 --headdims 64,128 --seqlens 1024,4096 --causal 0,1"
(cd .ab/t/main && PYTHONPATH=$PWD timeout 100 python bench/bench.py $F --no-peers --out $OUT/fp32_main > $OUT/bench_main.txt 2>&1)
PYTHONPATH=$PWD timeout 130 python bench/bench.py $F --out $OUT/fp32_new > $OUT/bench_new.txt 2>&1
grep -E "^ ?fp32" $OUT/bench_main.txt $OUT/bench_new.txt | head -20
echo "at $(( $(date +%s) - t0 )) s"
PYTHONPATH=$PWD timeout 100 python bench/decode.py --quick --rows mla fp8 > $OUT/decode.txt 2>&1; tail -9 $OUT/decode.txt
echo "at $(( $(date +%s) - t0 )) s"
PYTHONPATH=$PWD timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/memcheck_kvc.txt 2>&1; echo "memcheck kvc rc=$?"; tail -2 $OUT/memcheck_kvc.txt
echo "end at $(( $(date +%s) - t0 )) s"
