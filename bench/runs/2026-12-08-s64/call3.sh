# Session 64's A/B of pending/fwd_mask_need_early.patch (any Hopper card; on the warm machine after
# auto.sh, before call2.sh, or alone): the Hopper forwards take a key tile's mask decision
# (Mask::key_cuts and the partial flag: loads of the work tile's Mask from shared memory, then compares)
# between issuing the tile's products and waiting for S, instead of after S arrives. Tree M = this tree +
# the patch, built in /tmp/M; the FP8 rows (the lever's target, issue 25) interleaved main, M, main, M;
# then bench/ab.py's 16-bit forward rows. `call3.sh prep` only builds and compiles.
export PYTHONUNBUFFERED=1; R=$PWD
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-400}
if [ "$1" = prep ] || [ ! -f /tmp/M/.compiled ]; then
  rm -rf /tmp/M && mkdir -p /tmp/M && cp -r cupyflash kernels_cu bench setup.cfg /tmp/M
  (cd /tmp/M && git apply $R/bench/runs/2026-12-08-s64/pending/fwd_mask_need_early.patch) || echo "M: the patch does not apply"
  # M's forwards (NVRTC only; main's come from the landing call's precompile or the first fp8.py run)
  (cd /tmp/M && PYTHONPATH=/tmp/M timeout 300 python -c "
from cupyflash import _families, _kernels
_kernels.precompile([v for v in _families.VARIANTS if v.kernel.name in ('sm90_fwd_fp8', 'fp8_transpose_values')
                     or v.key.startswith('sm90_fwd_bf16') and v.key.endswith('_mod_0_drop_0_top_0')], max_workers=8)") \
    > /tmp/M_pre.txt 2>&1 && touch /tmp/M/.compiled; echo "call3 prep: compiled at $(el) s"; tail -n 2 /tmp/M_pre.txt
  [ "$1" = prep ] && exit 0
fi
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  for T in $R /tmp/M; do
    [ $(( L - $(el) )) -gt 90 ] || break 2
    tag=$([ $T = $R ] && echo main || echo M)
    (cd $T && PYTHONPATH=$T timeout 120 python bench/fp8.py --headdims 64,128,256 --seqlens 4096,16384 \
      > $OUT/fp8_${tag}_r$round.txt 2>&1); echo "fp8 $tag round $round rc=$? at $(el) s"; tail -n 14 $OUT/fp8_${tag}_r$round.txt
  done
done
[ $(( L - $(el) )) -gt 120 ] && { timeout $(( L - $(el) - 10 )) python bench/ab.py --old . --new /tmp/M --rounds 3 \
  --rows 'fwd_d128*,fwd_d64_causal*,fwd_window,fwd_block25,fwd_varlen,fwd_gqa' --json $OUT/ab_fwd.json \
  > $OUT/ab_fwd.txt 2>&1; echo "ab rc=$? at $(el) s"; tail -n 16 $OUT/ab_fwd.txt; }
echo "call3 done at $(el) s"
