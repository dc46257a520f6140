# Session 48's call after call2.sh (~320 s, either card, no carry): the element bits patch (issue 24) on
# top of the landing tree and the shift patch: its GPU tests (tests/test_gpu_mods.py, the bits' own among
# them), then its A/B (mods_ab.sh: A = the landing tree,
# B = + shift + bits; call2.sh's A/B gives the shift's share). Output under $OUT/mods_ab_bits.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
# The element bits: their GPU tests first (the patch's own), then the A/B of shift + bits.
rm -rf /tmp/EB && mkdir -p /tmp/EB && git archive HEAD | tar -x -C /tmp/EB
(cd /tmp/EB && if [ ! -f kernels_cu/sm90/bwd_key_order.cu ]; then
   for p in 2026-12-06-s42/pending/i25_fp8_d64_three_consumers 2026-12-06-s44/pending/i24_lse_pair_minus_inf \
            2026-12-06-s45/pending/readme_m192_minus_inf 2026-12-06-s44/pending/i22_bwd_exp_select \
            2026-12-06-s45/pending/i24_bwd_key_order 2026-12-06-s46/pending/i24_mask_loads; do patch -p1 -s < bench/runs/$p.patch; done
 fi
 for p in i24_mask_bits_shift i24_element_bits; do patch -p1 -s < bench/runs/2026-12-06-s47/pending/$p.patch; done
 PYTHONPATH=/tmp/EB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_mods.py 2>&1 | tail -4)
echo "bits tests at $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/mods_ab_bits
OUT=$OUT/mods_ab_bits timeout 300 bash bench/runs/2026-12-06-s47/mods_ab.sh bench/runs/2026-12-06-s47/pending/i24_mask_bits_shift.patch \
  bench/runs/2026-12-06-s47/pending/i24_element_bits.patch 2>&1 | tee $OUT/mods_ab_bits/log.txt | tail -30
echo "done at $(( $(date +%s) - t0 )) s"
