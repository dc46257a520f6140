# Issue 25: where the FP8 forward's time goes (the poly_exp2 shares were slower: not SFU-bound alone).
# Pipes, issue, stall reasons of sm90_fwd_fp8 and of the bf16 sm90_fwd on the same row, into $OUT. ~60 s.
S=$(dirname "$0")
M='regex:sm__(pipe_.*_cycles_active|inst_executed_pipe_.*)\.avg\.pct_of_peak_sustained_active$,sm__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__inst_executed.sum'
for k in fp8 bf16; do
  case $k in fp8) re='sm90_fwd_fp8';; bf16) re='^sm90_fwd$';; esac
  timeout 150 /usr/local/cuda/bin/ncu --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section SourceCounters --print-details all --metrics "$M" -k regex:"$re" -c 1 python $S/fp8_ncu.py > $OUT/fp8_ncu_$k.txt 2>&1
  echo "== $k"; grep -E "pct_of_peak|duration|inst_executed.sum|Warp Cycles Per Issued|Issued Warp|No Eligible" $OUT/fp8_ncu_$k.txt \
    | grep -vE " 0$| 0\.00$|n/a" | sed -E 's/  +/ /g' | cut -c1-150
done
