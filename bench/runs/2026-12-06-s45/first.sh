# Session 45's first call on whatever card comes: on an H200 the landing call (../2026-12-06-s42/land_call.sh:
# the whole GPU suite and memcheck on the working tree, main + the FP8 d64 192-row CTAs + the float32 -inf
# fix + their README lines); on an H100 the measuring call (callP.sh, trees under .ab/t).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash bench/runs/2026-12-06-s42/land_call.sh
else
  bash bench/runs/2026-12-06-s45/callP.sh
fi
