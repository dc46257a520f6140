# Session 55, first call: on an H200 the landing call of T2 (session 54's land.sh, LIMIT 520);
# on any other card session 54's call 4 (the in-kernel conversion's tests, sanitizers, ncu A/B, mods.py).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
if [[ "$gpu" == *H200* ]]; then LIMIT=520 bash bench/runs/2026-12-07-s54/land.sh
else bash bench/runs/2026-12-07-s54/call4.sh; fi
