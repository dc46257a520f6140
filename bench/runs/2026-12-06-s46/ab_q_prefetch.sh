# Session 47's A/B of pending/i22_fwd_q_prefetch_tensor.patch (~560 s, either card; no carry), on landed
# main (the device's working tree is L; P = L + the patch in /tmp/P). The patch: the float32 Hopper
# forward's producer prefetches each work tile's q rows into L2 with one TMA tensor prefetch per 32
# columns (UTMAPF.L2.4D: 4 at head dim 128), when the previous tile's last S is issued, so the consumers'
# split of the rows (split_queries, ~1-2 us a work tile from device memory, 2,048 work tiles at d128
# causal 1k) reads L2. Session 45's row-by-row bulk prefetch (128 TMA operations a work tile) was mixed
# (-21% at d128 1k in one round). Prediction: forward +1-4% on the 1k rows (d128 causal 1k 1.94x -> 2.0x
# torch's memory-efficient on the H200), 4k rows within 1%, backward unchanged.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
L=$PWD; rm -rf /tmp/P && mkdir -p /tmp/P
git archive HEAD cupyflash kernels_cu bench tests README.md setup.cfg | tar -x -C /tmp/P
(cd /tmp/P && patch -p1 -s < $L/bench/runs/2026-12-06-s46/pending/i22_fwd_q_prefetch_tensor.patch) || exit 1
cd /tmp/P && PYTHONPATH=/tmp/P python -c "
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)"  # (P's headers differ: every variant is new)
echo "P precompiled at $(el) s"
PYTHONPATH=/tmp/P timeout 240 python -m pytest -q -n 16 -p no:cacheprovider -m gpu \
  -k "float32 or fp32 or tf32 or planes or random" tests > $OUT/p_tests.txt 2>&1
echo "P float32 tests rc=$? at $(el) s"; tail -1 $OUT/p_tests.txt; grep FAILED $OUT/p_tests.txt | head
B="bench/bench.py --dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096"
for round in 1 2; do
  (cd $L && PYTHONPATH=$L timeout 100 python $B $([ $round = 2 ] && echo --no-peers) 2>&1 | tail -20 > $OUT/L_$round.txt)
  (cd /tmp/P && PYTHONPATH=/tmp/P timeout 100 python $B --no-peers 2>&1 | tail -20 > $OUT/P_$round.txt)
  echo "round $round at $(el) s"
done
cat $OUT/L_1.txt; echo "== P round 1"; cat $OUT/P_1.txt; echo "== L round 2"; cat $OUT/L_2.txt; echo "== P round 2"; cat $OUT/P_2.txt
left=$(( 580 - $(el) ))
[ $left -gt 60 ] && (cd /tmp/P && PYTHONPATH=/tmp/P timeout $left /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  python tests/sanitize_attention.py sm90:float32 2>&1 | tail -2)
echo "done at $(el) s"
