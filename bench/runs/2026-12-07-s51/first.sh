# Session 51's first call (~230 s, H200 for the tables; either card for the A/B): session 50's chain of
# issue 24's four pending patches (next_chain.sh: both document rows, three rounds, FlexAttention in T0's
# first round), then passes.sh (each kernel of the document rows' calls, timed alone by ncu).
export PYTHONUNBUFFERED=1
t0=$(date +%s)
bash bench/runs/2026-12-06-s50/next_chain.sh
echo "chain at $(( $(date +%s) - t0 )) s"
timeout 120 bash bench/runs/2026-12-07-s51/passes.sh
echo "done at $(( $(date +%s) - t0 )) s"
