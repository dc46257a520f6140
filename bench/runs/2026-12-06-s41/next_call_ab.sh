# Session 42 (~560 s, any Hopper card, after next_call.sh on the same machine: its trees): the 16-bit
# Hopper forwards with the rotated loop (.ab/t/rot) against main, bench/ab.py's forward rows, 2 rounds.
# Prediction: d128-d256 rows +0-8%, d64 unchanged (not rotated), none slower by more than 2%.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
timeout 240 python bench/ab.py --old .ab/t/main --new .ab/t/rot --rows 'fwd_*' --rounds 2 --cache $R/.ab/cache \
  --json $OUT/ab_fwd.json > $OUT/ab_fwd.txt 2>&1; echo "ab rc=$? at $(( $(date +%s) - t0 )) s"; tail -25 $OUT/ab_fwd.txt
# Issue 22's precision="tf32" forward (the K-major loop: d128's 64-key tiles are rotated, d64's 128-key
# ones are not): main against rot, d64/d128 at 4k, causal both; target 250 TFLOP/s at d128 4k (H100 s28:
# 228 causal, 289 non-causal). Prediction: d128 +5-15%, d64 unchanged.
for t in main rot; do
  echo "== tf32 $t"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 100 python bench/bench.py --dtypes fp32 --precision tf32 --headdims 64,128 \
     --seqlens 4096 --causal 0,1 --no-backward --no-peers --out $OUT/tf32_$t 2>&1 | grep -E "^\|? *fp32|TFLOP" | head -6)
done
# Issue 26's paged prefill (512 causal queries x 32k, pages 16: 444 TFLOP/s against 651 dense on an H100,
# floor 0.9x): the pages' rows main against rot (the 16-bit rotation covers it), then ncu of pages 16
# against 64 (session 30's open question: the TMA unit's box rate or the producer's issue?).
P30=bench/runs/2026-12-05-s30
for t in main rot; do (cd .ab/t/$t && PYTHONPATH=$PWD timeout 90 python $R/$P30/paged_probe.py 2>&1 | sed "s/^/$t /" | tail -6); done
M='regex:sm__(pipe_tma_cycles_active|inst_executed_pipe_tma|pipe_tensor_cycles_active|issue_active)\.avg\.pct_of_peak_sustained_active$,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex.sum'
(cd .ab/t/main && PYTHONPATH=$PWD timeout 120 /usr/local/cuda/bin/ncu --section WarpStateStats --metrics "$M" -k regex:sm90_fwd -c 2 \
   python $R/$P30/paged_probe.py --ncu > $OUT/paged_ncu.txt 2>&1; grep -E "sm90_fwd|pct|sum|Stall (Long|Wait|Barrier)" $OUT/paged_ncu.txt | sed -E 's/  +/ /g' | cut -c1-140 | head -30)
