# Issue 26: why paged prefill with 128-key pages in order (the dense cache's bytes at its addresses) runs
# 10% slower than the dense cache (session 46). ncu of both sm90_fwd launches of paged_ncu.py (~90 s,
# either card): duration, stall reasons, issue, the memory workload, and the source counters.
S=$(dirname "$0")
M='gpu__time_duration.sum,sm__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum'
PYTHONPATH=$PWD timeout 300 /usr/local/cuda/bin/ncu --clock-control none --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  --section SourceCounters --print-details all --metrics "$M" -k regex:'^sm90_fwd$' -c 2 \
  python $S/paged_ncu.py > $OUT/paged_ncu.txt 2>&1
grep -E "sm90_fwd|max \|dense|duration|pct_of_peak|hit_rate|bytes_read|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall" \
  $OUT/paged_ncu.txt | grep -vE " 0$| 0\.00$|n/a" | sed -E 's/  +/ /g' | cut -c1-150 | head -60
