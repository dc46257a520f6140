# Session 45's first call (~450 s, either card; trees from ../2026-12-06-s44/build_trees.sh plus qpf and ord
# (see call2.sh), carry [".ab/t"]).
# 1. cand: the GPU test of session 44's -inf fix (fails on main: NaN float32 gradients).
# 2. sel: its float32 GPU tests, then the float32 table, main with torch's peers and sel without.
#    Prediction: backward d128 causal 1k 1.90 -> 2.05-2.2x torch's memory-efficient; forwards unchanged.
export PYTHONUNBUFFERED=1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
P=$PWD/bench/runs/2026-12-06-s45/precompile.py; F=planes,delta,dq_convert,split
(cd .ab/t/main && PYTHONPATH=$PWD python $P float32, $F plain) & (cd .ab/t/sel && PYTHONPATH=$PWD python $P float32, $F) & wait
echo "precompiled at $(el) s"
(cd .ab/t/cand && PYTHONPATH=$PWD timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_mods.py \
  -k minus_infinity > $OUT/cand_minus_inf.txt 2>&1; echo "cand -inf test rc=$? at $(el) s"; tail -1 $OUT/cand_minus_inf.txt)
(cd .ab/t/sel && PYTHONPATH=$PWD timeout 200 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_gpu.py \
  tests/test_gpu_features.py tests/test_gpu_mods.py tests/test_gpu_training.py -k "float32" > $OUT/sel_tests.txt 2>&1
  echo "sel tests rc=$? at $(el) s"; tail -1 $OUT/sel_tests.txt; grep -E "^E |FAILED" $OUT/sel_tests.txt | cut -c1-200 | head -8)
A="--dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096"
(cd .ab/t/main && PYTHONPATH=$PWD timeout 70 python bench/bench.py $A 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_main.txt)
(cd .ab/t/sel && PYTHONPATH=$PWD timeout 50 python bench/bench.py $A --no-peers 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_sel.txt)
echo "done at $(el) s"
