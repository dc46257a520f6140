# Session 48, after call2b.sh (~250 s, either card, no carry): the element bits in the Hopper backward's
# column fragments (pending/i24_element_bits_bwd.patch, on top of the shift and element bits patches):
# the mask tests, then the A/B against the tree with the forwards' bits alone. Static SASS (session 47):
# the bf16 d128 document-mask backward's consumer local accesses 2 -> 14, d64's 38 -> 0; prediction:
# ragged backward ~300 -> ~340-360 TFLOP/s on the H100 if those accesses stay off the tile loop, the
# document row's backward unchanged (its blocks are all full or empty: no bits read).
export PYTHONUNBUFFERED=1
t0=$(date +%s)
S=bench/runs/2026-12-06-s47/pending
rm -rf /tmp/EC && mkdir -p /tmp/EC && git archive HEAD | tar -x -C /tmp/EC
(cd /tmp/EC && if [ ! -f kernels_cu/sm90/bwd_key_order.cu ]; then
   for p in 2026-12-06-s42/pending/i25_fp8_d64_three_consumers 2026-12-06-s44/pending/i24_lse_pair_minus_inf \
            2026-12-06-s45/pending/readme_m192_minus_inf 2026-12-06-s44/pending/i22_bwd_exp_select \
            2026-12-06-s45/pending/i24_bwd_key_order 2026-12-06-s46/pending/i24_mask_loads; do patch -p1 -s < bench/runs/$p.patch; done
 fi
 for p in i24_mask_bits_shift i24_element_bits i24_element_bits_bwd; do patch -p1 -s < $S/$p.patch; done
 PYTHONPATH=/tmp/EC timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_mods.py 2>&1 | tail -4)
echo "tests at $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/mods_ab_bwd
BASE="$S/i24_mask_bits_shift.patch $S/i24_element_bits.patch" OUT=$OUT/mods_ab_bwd timeout 300 \
  bash bench/runs/2026-12-06-s47/mods_ab.sh $S/i24_element_bits_bwd.patch 2>&1 | tee $OUT/mods_ab_bwd/log.txt | tail -30
echo "done at $(( $(date +%s) - t0 )) s"
