# Session 42 (~260 s, any Hopper card, after next_call.sh on the same machine: its trees): the 16-bit
# Hopper forwards with the rotated loop (.ab/t/rot) against main, bench/ab.py's forward rows, 2 rounds.
# Prediction: d128-d256 rows +0-8%, d64 unchanged (not rotated), none slower by more than 2%.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
timeout 280 python bench/ab.py --old .ab/t/main --new .ab/t/rot --rows 'fwd_*' --rounds 2 --cache $R/.ab/cache \
  --json $OUT/ab_fwd.json > $OUT/ab_fwd.txt 2>&1; echo "ab rc=$? at $(( $(date +%s) - t0 )) s"; tail -25 $OUT/ab_fwd.txt
