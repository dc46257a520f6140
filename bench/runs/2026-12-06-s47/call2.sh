# Session 48's second call (~380 s, either card, no carry), on the warm machine right after the landing
# call: the A/Bs of the paged walk and of the mask bits shift. Outputs under $OUT/paged_ab and $OUT/mods_ab.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
mkdir -p $OUT/paged_ab $OUT/mods_ab
OUT=$OUT/paged_ab timeout 250 bash bench/runs/2026-12-06-s47/paged_ab.sh 2>&1 | tee $OUT/paged_ab/log.txt | tail -40
echo "paged A/B at $(( $(date +%s) - t0 )) s"
OUT=$OUT/mods_ab timeout 300 bash bench/runs/2026-12-06-s47/mods_ab.sh bench/runs/2026-12-06-s47/pending/i24_mask_bits_shift.patch \
  2>&1 | tee $OUT/mods_ab/log.txt | tail -30
echo "shift A/B at $(( $(date +%s) - t0 )) s"
echo "done at $(( $(date +%s) - t0 )) s"
