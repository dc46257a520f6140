# Session 35, call D (the budget's last ~400 s): main + pending/i22_bwd_planes_v2.patch (the float32
# backward's K/V split, dQ in X only with one stage, dQ into dq): its GPU tests, then the float32
# backward's speed against main (.ab/t/main) on one machine.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
PYTHONPATH=$PWD python bench/runs/2026-12-05-s33/pre.py fp32 16 > /dev/null
PYTHONPATH=$PWD timeout 120 python -m pytest -q -m gpu -n 8 --dist load -p no:cacheprovider tests/test_gpu.py \
  tests/test_gpu_features.py tests/test_gpu_mods.py -k "float32 or dq_in_place" > $OUT/tests.txt 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/tests.txt; grep -E "^FAILED|^ERROR" $OUT/tests.txt | cut -c1-200 | head
F="--dtypes fp32 --headdims 64,128 --seqlens 1024,4096 --causal 0,1 --no-peers"
(cd .ab/t/main && PYTHONPATH=$PWD timeout 80 python bench/bench.py $F --out $OUT/fp32_main > $OUT/bench_main.txt 2>&1)
PYTHONPATH=$PWD timeout 60 python bench/bench.py $F --out $OUT/fp32_new > $OUT/bench_new.txt 2>&1
grep -E "^\[" $OUT/bench_main.txt $OUT/bench_new.txt | sed -E 's/ \(.*//' | cut -c1-160
echo "end at $(( $(date +%s) - t0 )) s"
