# Session 50's second call (~450 s, either card, no carry), after first.sh (or the landing call):
# (1) paged_ab_landed.sh: the landed paged walk against the walk before it (issue 26);
# (2) issue 22's float32 table beside torch's memory-efficient and math float32 with the landed branch-free
#     backward (the README's float32 row and issue 22's floors: 2x torch's memory-efficient on every row);
# (3) the forward clocks probe (runs/2026-12-06-s47/fwd_probe: where the float32 forward's 1k causal rows
#     spend a CTA's time).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
timeout 170 bash bench/runs/2026-12-06-s49/paged_ab_landed.sh 2>&1 | tail -30
echo "paged A/B at $(el) s"
mkdir -p $OUT/fp32
timeout 170 python bench/bench.py --dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096 \
  --out $OUT/fp32 2>&1 | tail -12
echo "fp32 table at $(el) s"
left=$(( 580 - $(el) )); [ $left -gt 60 ] && timeout $left bash bench/runs/2026-12-06-s47/fwd_probe/run.sh 2>&1 | tail -30
echo "done at $(el) s"
