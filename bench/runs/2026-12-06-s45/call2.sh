# Session 45's second call (~560 s, either card; carry [".ab/t"]).
# 1. qpf (= main + pending/i22_fwd_q_prefetch.patch: the float32 forward's producer prefetches the next work
#    tile's Q rows into L2): the forward table beside main's. Prediction d128 causal 1k +1..3%.
# 2. ord (= main + the Hopper backward's key tiles longest walk first under a block mask,
#    pending/i24_bwd_key_order.patch): its tests, and the document row of bench/mods.py beside main's.
#    Prediction: backward +8-11% (a simulation of the launch: tiles fastest ends 12.9% past the even split
#    of the work, the tail pairs' sorted order 0.6%).
export PYTHONUNBUFFERED=1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
P=$PWD/bench/runs/2026-12-06-s45/precompile.py
(cd .ab/t/qpf && PYTHONPATH=$PWD python $P float32, planes,split plain) &
(cd .ab/t/main && PYTHONPATH=$PWD python $P float32, planes,split plain) & wait
echo "precompiled at $(el) s"
A="--dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096 --no-backward --no-peers"
for t in qpf main; do
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 70 python bench/bench.py $A 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_fwd_$t.txt)
done
echo "== ord: tests and the document row ($(el) s)"
(cd .ab/t/ord && PYTHONPATH=$PWD timeout 150 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/test_gpu_mods.py \
  -k "longest_walk or document or both_functions or other_head_dims" > $OUT/ord_tests.txt 2>&1; echo "ord tests rc=$? at $(el) s"
  tail -1 $OUT/ord_tests.txt; grep -E "^E |FAILED" $OUT/ord_tests.txt | cut -c1-200 | head -6)
(cd .ab/t/main && PYTHONPATH=$PWD timeout 170 python bench/mods.py --rows document 2>&1 | tail -8 | tee $OUT/doc_main.txt)
(cd .ab/t/ord && PYTHONPATH=$PWD timeout 110 python bench/mods.py --rows document --no-peers 2>&1 | tail -8 | tee $OUT/doc_ord.txt)
echo "done at $(el) s"
