# Session 42 (~400 s, any Hopper card, after next_call.sh on the same machine: its trees): the 16-bit
# Hopper forwards with the rotated loop (.ab/t/rot) against main, bench/ab.py's forward rows, 2 rounds.
# Prediction: d128-d256 rows +0-8%, d64 unchanged (not rotated), none slower by more than 2%.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
timeout 280 python bench/ab.py --old .ab/t/main --new .ab/t/rot --rows 'fwd_*' --rounds 2 --cache $R/.ab/cache \
  --json $OUT/ab_fwd.json > $OUT/ab_fwd.txt 2>&1; echo "ab rc=$? at $(( $(date +%s) - t0 )) s"; tail -25 $OUT/ab_fwd.txt
# Issue 22's precision="tf32" forward (the K-major loop: d128's 64-key tiles are rotated, d64's 128-key
# ones are not): main against rot, d64/d128 at 4k, causal both; target 250 TFLOP/s at d128 4k (H100 s28:
# 228 causal, 289 non-causal). Prediction: d128 +5-15%, d64 unchanged.
for t in main rot rot main; do
  echo "== tf32 $t"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 100 python bench/bench.py --dtypes fp32 --precision tf32 --headdims 64,128 \
     --seqlens 4096 --causal 0,1 --no-backward --no-peers --out $OUT/tf32_$t 2>&1 | grep -E "^\|? *fp32|TFLOP" | head -6)
done
