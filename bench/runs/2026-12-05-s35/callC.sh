# Session 35, call C: main (session 34's three, MLA and e4m3 landed) + the float32 backward's three
# patches revised (dQ in X only with one stage, Tr::kDqInX: it cost d64 5-8% at 4k in call B): the GPU
# tests of what changed, and the float32 speed against main on one machine.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
P=$PWD/bench/runs/2026-12-05-s33/pre.py
PYTHONPATH=$PWD python $P f32 16 > /dev/null
PYTHONPATH=$PWD timeout 200 python -m pytest -q -m gpu -n 8 --dist load -p no:cacheprovider tests/test_gpu.py \
  tests/test_gpu_features.py tests/test_gpu_mods.py tests/test_fp8.py tests/test_kvcache.py tests/test_gpu_training.py \
  tests/test_training.py -k "float32 or fp32 or planes or mods or e4m3 or mla or kv or sm90 or training" > $OUT/tests.txt 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/tests.txt; grep -E "^FAILED|^ERROR" $OUT/tests.txt | cut -c1-200 | head
F="--dtypes fp32 --headdims 64,128 --seqlens 1024,4096 --causal 0,1 --no-peers"
(cd .ab/t/main && PYTHONPATH=$PWD timeout 90 python bench/bench.py $F --out $OUT/fp32_main > $OUT/bench_main.txt 2>&1)
PYTHONPATH=$PWD timeout 90 python bench/bench.py $F --out $OUT/fp32_new > $OUT/bench_new.txt 2>&1
grep -E "^\[" $OUT/bench_main.txt $OUT/bench_new.txt | sed -E 's/ \| CuPy.*//' | cut -c1-200
echo "end at $(( $(date +%s) - t0 )) s"
