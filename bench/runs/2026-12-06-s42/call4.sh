# Session 42's last call (~500 s, trees of build_trees.sh under .ab/t: main = the pre-landing main, rot = it
# + the rotated loops). Issue 22's tf32 forward (the K-major loop, d128's 64-key tiles rotated), main
# against rot; issue 26's paged prefill rows main against rot; then bench/ab.py's 16-bit forward rows,
# one round, in what time is left. Predictions (session 41): tf32 d128 +5-15%, d64 unchanged; bf16 rows
# +0-8%. (The FP8 rows of call 1 moved by less than their noise.)
export PYTHONUNBUFFERED=1
R=$PWD; P30=bench/runs/2026-12-05-s30
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
for t in main rot main rot; do
  echo "== tf32 $t"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 80 python bench/bench.py --dtypes fp32 --precision tf32 --headdims 64,128 \
     --seqlens 4096 --causal 0,1 --no-backward --no-peers --out $OUT/tf32_$t 2>&1 | grep -E "^\|? *fp32|TFLOP" | head -6)
done
for t in main rot; do (cd .ab/t/$t && PYTHONPATH=$PWD timeout 70 python $R/$P30/paged_probe.py 2>&1 | sed "s/^/$t /" | tail -6); done
left=$(( 470 - ($(date +%s) - t0) ))
timeout $left python bench/ab.py --old .ab/t/main --new .ab/t/rot --rows 'fwd_*' --rounds 1 --cache $R/.ab/cache \
  --json $OUT/ab_fwd.json > $OUT/ab_fwd.txt 2>&1; echo "ab rc=$? at $(( $(date +%s) - t0 )) s"; tail -25 $OUT/ab_fwd.txt
