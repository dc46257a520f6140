# Session 45's sanitizer and FP8 call (~500 s, either card; carry [".ab/t"]).
# 1. memcheck and racecheck of sel's float32 Hopper kernels (tests/sanitize_attention.py sm90:float32;
#    racecheck's known false class is the stage hand-off of tests/sanitize_mbarrier.py).
# 2. bench/fp8.py d64 of main and cand (the 192-row CTAs), calls back to back; then cand each call alone.
# 3. paged_order.py (issue 26): pages in order against random pages (pages of 128 lose 18-20% to the dense
#    cache with the same boxes: placement, or the paged walk?).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
for tool in memcheck racecheck; do
  (cd .ab/t/sel && PYTHONPATH=$PWD timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 1 \
    python tests/sanitize_attention.py sm90:float32 > $OUT/sel_$tool.txt 2>&1
   echo "sel $tool rc=$? at $(el) s"; grep -E "SUMMARY|done|Race|Error" $OUT/sel_$tool.txt | sort | uniq -c | head -6)
done
for t in main cand; do
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 60 python bench/fp8.py --headdims 64 --seqlens 4096,16384 2>&1 | tail -6 | tee $OUT/fp8_$t.txt)
done
(cd .ab/t/cand && PYTHONPATH=$PWD timeout 60 python bench/fp8.py --headdims 64 --seqlens 4096,16384 --per-call 2>&1 | tail -6 | tee $OUT/fp8_cand_per_call.txt)
echo "== paged order ($(el) s)"
PYTHONPATH=$PWD timeout 80 python bench/runs/2026-12-06-s45/paged_order.py 2>&1 | tail -6 | tee $OUT/paged_order.txt
echo "done at $(el) s"
