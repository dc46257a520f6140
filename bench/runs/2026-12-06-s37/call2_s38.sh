# Session 38's second call (issue 22), warm after call_s38.sh: split_keys' GPU test in its own tree
# (.ab/t/split: main + runs/2026-12-05-s36/pending/i22_fwd_split_keys.patch, applied with patch -p1) and
# the float32 rows (main; split tree) beside torch, each step only while time is left.
export PYTHONUNBUFFERED=1
R=$PWD
t0=$(date +%s)
LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
(cd .ab/t/split && PYTHONPATH=$PWD timeout 90 python -m pytest -q -p no:cacheprovider tests/test_gpu_features.py -k splits_keys > $OUT/split_tests.txt 2>&1); echo "split tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/split_tests.txt
F="--dtypes fp32 --headdims 128 --seqlens 1024,4096 --causal 1"
PYTHONPATH=$R timeout $(( $(left) - 60 )) python bench/bench.py $F --out $OUT/fp32_new > $OUT/bench_new.txt 2>&1; tail -8 $OUT/bench_new.txt | cut -c1-160
(cd .ab/t/split && PYTHONPATH=$PWD timeout $(( $(left) - 3 )) python bench/bench.py $F --no-peers --out $OUT/fp32_split > $OUT/bench_split.txt 2>&1); grep -h "fp32 d" $OUT/bench_split.txt | cut -c1-150
echo "end at $(( $(date +%s) - t0 )) s"
