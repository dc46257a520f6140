# Session 48's third call (~250 s, either card, no carry): the forward clocks probe (issue 22) and the
# paged walk's per-instruction stalls (issue 26).
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 300 bash bench/runs/2026-12-06-s47/fwd_probe/run.sh 2>&1 | tail -40
echo "probe at $(( $(date +%s) - t0 )) s"
timeout 250 bash bench/runs/2026-12-06-s47/paged_source.sh 2>&1 | tail -60
echo "done at $(( $(date +%s) - t0 )) s"
