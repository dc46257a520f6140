# Session 45's measuring call (~550 s, either card; trees: ../2026-12-06-s44/build_trees.sh, then qpf and ord,
# each main + its patch in pending/; carry [".ab/t"]). Correctness of sel, qpf and ord is the landing
# call's whole suite (../2026-12-06-s42/land_call.sh), which runs next on an H200 with the winners.
# 1. cand: the GPU test of session 44's -inf fix (fails on main: NaN float32 gradients).
# 2. float32 table: main with torch's peers, sel (the float32 Hopper backward's exponentials without a branch
#    each) without, qpf (the float32 forward's producer prefetches the next work tile's Q rows into L2)
#    forward only. Predictions: sel backward d128 causal 1k 1.90 -> 2.05-2.2x torch's memory-efficient;
#    qpf forward d128 causal 1k +1..3%.
# 3. ord (the Hopper backward's key tiles longest walk first under a block mask): its test and the
#    document row of bench/mods.py beside main's (with FlexAttention). Prediction: backward +8-11% (a
#    simulation of the launch: tiles fastest ends 12.9% past the even split, the tail's sorted order 0.6%).
export PYTHONUNBUFFERED=1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
P=$PWD/bench/runs/2026-12-06-s45/precompile.py; F=planes,delta,dq_convert,split
for t in main sel qpf; do (cd .ab/t/$t && PYTHONPATH=$PWD python $P float32, $F plain) & done; wait
echo "precompiled at $(el) s"
(cd .ab/t/cand && PYTHONPATH=$PWD timeout 100 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_gpu_mods.py \
  -k minus_infinity > $OUT/cand_minus_inf.txt 2>&1; echo "cand -inf test rc=$? at $(el) s"; tail -1 $OUT/cand_minus_inf.txt)
A="--dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096"
(cd .ab/t/main && PYTHONPATH=$PWD timeout 80 python bench/bench.py $A 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_main.txt)
(cd .ab/t/sel && PYTHONPATH=$PWD timeout 45 python bench/bench.py $A --no-peers 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_sel.txt)
(cd .ab/t/qpf && PYTHONPATH=$PWD timeout 30 python bench/bench.py $A --no-peers --no-backward 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_qpf.txt)
echo "== ord ($(el) s)"
(cd .ab/t/ord && PYTHONPATH=$PWD timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_mods.py \
  -k "longest_walk" > $OUT/ord_tests.txt 2>&1; echo "ord test rc=$? at $(el) s"
  tail -1 $OUT/ord_tests.txt; grep -E "^E " $OUT/ord_tests.txt | cut -c1-200 | head -6)
(cd .ab/t/ord && PYTHONPATH=$PWD timeout $(( 575 - $(el) - 130 )) python bench/mods.py --rows document --no-peers 2>&1 | tail -7 | tee $OUT/doc_ord.txt)
(cd .ab/t/main && PYTHONPATH=$PWD timeout $(( 585 - $(el) )) python bench/mods.py --rows document 2>&1 | tail -7 | tee $OUT/doc_main.txt)
echo "done at $(el) s"
