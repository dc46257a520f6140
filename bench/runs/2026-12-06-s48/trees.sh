# Sourced by persistent_ab.sh and short.sh (R: the repository root): /tmp/PA = HEAD + the pending landing
# patches (while pending), /tmp/PB = PA + the persistent backward's patch.
rm -rf /tmp/PA /tmp/PB && mkdir -p /tmp/PA
git archive HEAD cupyflash kernels_cu bench tests README.md setup.cfg | tar -x -C /tmp/PA
if [ ! -f /tmp/PA/kernels_cu/sm90/bwd_key_order.cu ]; then
  for p in 2026-12-06-s42/pending/i25_fp8_d64_three_consumers 2026-12-06-s44/pending/i24_lse_pair_minus_inf \
           2026-12-06-s45/pending/readme_m192_minus_inf 2026-12-06-s44/pending/i22_bwd_exp_select \
           2026-12-06-s45/pending/i24_bwd_key_order 2026-12-06-s46/pending/i24_mask_loads \
           2026-12-06-s47/pending/i26_paged_walk_ahead; do
    (cd /tmp/PA && patch -p1 -s < $R/bench/runs/$p.patch) || exit 1
  done
fi
cp -r /tmp/PA /tmp/PB
(cd /tmp/PB && patch -p1 -s < $R/bench/runs/2026-12-06-s48/pending/i24_persistent_bwd.patch) || exit 1
find /tmp/PA /tmp/PB -name '*.orig' -delete
