# Session 47's A/B of session 46's two pending patches against the landing tree, one half a call (either
# card; no carry): `bash ab_call.sh fp32` (~350 s: the float32 forward's Q prefetch, issue 22) or
# `bash ab_call.sh mods` (~450 s: the mask_mod loads and the ragged row, issue 24). L5 = main + the five
# landing patches (already in HEAD once they land), L7 = L5 + the two. fp32 precompiles both trees'
# variants (~95 s each); mods compiles its few variants on demand (the user-function ones take longest).
# Predictions (bench/NOTES.md, session 46): the mask loads (the partial tiles' mask loop waited out 32
# load latencies a forward tile, 8 now): ragged forward and backward +3-8%, document (no partial blocks)
# and relbias (a score_mod: its loads stay predicated) unchanged. The Q prefetch (the consumers' split of
# each work tile's rows read device memory, ~1-2 us a work tile): float32 forward +1-4% on the 1k rows
# (d128 causal 1k 1.94x -> ~2.0x torch's memory-efficient on the H200), 4k within 1%, backward unchanged.
# Also to run on L7 once: memcheck `tests/sanitize_attention.py sm90` (land_all.sh with the two does).
export PYTHONUNBUFFERED=1
mode=${1:?fp32 or mods}
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
R=$PWD
rm -rf /tmp/L5 /tmp/L7 && mkdir -p /tmp/L5
git archive HEAD cupyflash kernels_cu bench tests README.md setup.cfg | tar -x -C /tmp/L5
if [ ! -f /tmp/L5/kernels_cu/sm90/bwd_key_order.cu ]; then  # the five not landed yet
  for p in 2026-12-06-s42/pending/i25_fp8_d64_three_consumers 2026-12-06-s44/pending/i24_lse_pair_minus_inf \
           2026-12-06-s45/pending/readme_m192_minus_inf 2026-12-06-s44/pending/i22_bwd_exp_select \
           2026-12-06-s45/pending/i24_bwd_key_order; do
    (cd /tmp/L5 && patch -p1 -s < $R/bench/runs/$p.patch) || exit 1
  done
fi
cp -r /tmp/L5 /tmp/L7
for p in i24_mask_loads i22_fwd_q_prefetch_tensor; do
  (cd /tmp/L7 && patch -p1 -s < $R/bench/runs/2026-12-06-s46/pending/$p.patch) || exit 1
done
find /tmp/L5 /tmp/L7 -name '*.orig' -delete
if [ "$mode" = fp32 ]; then
  # (CuPy's disk cache keys on the options, which hold the tree's -I path: /tmp/L7 compiles anew even
  # after land_all.sh built the same sources in the working tree.)
  for t in L5 L7; do
    (cd /tmp/$t && PYTHONPATH=/tmp/$t python -c "
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)")
  done
  echo "precompiled at $(el) s"
  B="bench/bench.py --dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096"
  for round in 1 2; do
    (cd /tmp/L5 && PYTHONPATH=/tmp/L5 timeout 120 python $B $([ $round = 2 ] && echo --no-peers) 2>&1 | tail -20 > $OUT/fp32_L5_$round.txt)
    (cd /tmp/L7 && PYTHONPATH=/tmp/L7 timeout 120 python $B --no-peers 2>&1 | tail -20 > $OUT/fp32_L7_$round.txt)
    echo "round $round at $(el) s"
  done
  (cd /tmp/L7 && PYTHONPATH=/tmp/L7 timeout 120 python $B --no-peers --per-call 2>&1 | tail -20 > $OUT/fp32_L7_per_call.txt)
  for f in fp32_L5_1 fp32_L7_1 fp32_L5_2 fp32_L7_2 fp32_L7_per_call; do echo "== $f"; cat $OUT/$f.txt; done
else
  ROWS=ragged,document,relbias
  (cd /tmp/L5 && PYTHONPATH=/tmp/L5 timeout 260 python /tmp/L7/bench/mods.py --rows $ROWS --out $OUT/mods_L5 2>&1 | tail -14 | tee $OUT/mods_L5.txt)
  echo "L5 at $(el) s"
  (cd /tmp/L7 && PYTHONPATH=/tmp/L7 timeout 200 python bench/mods.py --rows $ROWS --no-peers --out $OUT/mods_L7 2>&1 | tail -10 | tee $OUT/mods_L7.txt)
fi
echo "done at $(el) s"
