# Session 50's third call (~300 s, either card, no carry): ragged_source.sh (ncu stall samples per
# instruction of the document and ragged rows, forward and backward; pass a pending patch as $1 to
# profile HEAD + it), then the bfloat16 racecheck of the Hopper kernels.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 200 bash bench/runs/2026-12-06-s49/ragged_source.sh "$@" 2>&1 | tail -130
echo "ncu at $(( $(date +%s) - t0 )) s"
PYTHONPATH=$PWD timeout $(( 570 - ($(date +%s) - t0) )) /usr/local/cuda/bin/compute-sanitizer --tool racecheck \
  python tests/sanitize_attention.py sm90:bfloat16 2>&1 | tail -4
echo "done at $(( $(date +%s) - t0 )) s"
