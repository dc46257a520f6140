# Session 32, call D: back-to-back forward times of the three dropout trees (fwd_times.py).
export PYTHONUNBUFFERED=1
S=$PWD/bench/runs/2026-12-05-s32
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
for t in early late direct; do (cd .ab/t/$t && PYTHONPATH=$PWD python $S/pre.py drop 5 > /dev/null 2>&1) & done; wait
for t in early direct late early direct; do
  echo "== $t"; (cd .ab/t/$t && PYTHONPATH=$PWD timeout 60 python $S/fwd_times.py)
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
