# Session 33, call 4: the float32 backward's lse as a float pair (working tree) against main (.ab/t/base):
# float32 GPU tests, bench rows (with torch's peers in the new tree's run), and call 3's lost dropout
# host-time lines.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s33
P=$PWD/$S
t0=$(date +%s)
python $S/pre.py fp32 16
(cd .ab/t/base && PYTHONPATH=$PWD python $P/pre.py fp32 16)
timeout 150 python -m pytest -v -m gpu -n 8 -p no:cacheprovider -k "float32 or fp32" tests/test_gpu.py tests/test_gpu_sm90.py tests/test_random.py > $OUT/fp32_tests.txt 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -2 $OUT/fp32_tests.txt
timeout 60 python $S/host_dropout.py > $OUT/host_dropout.txt 2>&1; head -4 $OUT/host_dropout.txt
A="--dtypes fp32 --headdims 64,128 --seqlens 1024,4096 --causal 0,1"
(cd .ab/t/base && PYTHONPATH=$PWD timeout 100 python bench/bench.py $A --no-peers --out $OUT/base > $OUT/bench_base.txt 2>&1)
timeout 150 python bench/bench.py $A --out $OUT/new > $OUT/bench_new.txt 2>&1
echo "end at $(( $(date +%s) - t0 )) s"
grep -E "cupyflash|torch|fp32" $OUT/bench_base.txt | head -40
grep -E "cupyflash|torch|fp32" $OUT/bench_new.txt | head -60
