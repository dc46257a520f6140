export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 95 python bench/runs/2026-12-05-s34/wide_float32.py 2>&1 | tail -4
echo "end at $(( $(date +%s) - t0 )) s"
