# Session 38's fourth call: the named-barrier probe's modes one a process under racecheck (which hand-offs
# racecheck's model reports), then ncu of kvc_mla_sm90 in .ab/t/mla2 at 128 heads: the warps' stall
# reasons and the per-instruction stall samples of the SASS.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
for m in 0 1 2; do PYTHONPATH=$R timeout 40 compute-sanitizer --tool racecheck python tests/sanitize_named_barrier.py $m > $OUT/probe_$m.txt 2>&1; echo "mode $m rc=$?"; grep -E "sums|SUMMARY" $OUT/probe_$m.txt; grep -A1 "Race reported" $OUT/probe_$m.txt | grep -o "at handoff+0x[0-9a-f]*" | paste -sd' '; done
cd .ab/t/mla2
PYTHONPATH=$PWD timeout 80 ncu -k regex:kvc_mla_sm90 -s 1 -c 1 --page raw --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed python $R/bench/runs/2026-12-06-s37/mla_time.py 128 > $OUT/ncu_stalls.txt 2>&1; echo "ncu stalls rc=$?"; grep -E "stalled|tensor|dram" $OUT/ncu_stalls.txt | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -24
PYTHONPATH=$PWD timeout 100 ncu -k regex:kvc_mla_sm90 -s 1 -c 1 --section SourceCounters --section WarpStateStats --page source --print-source sass --csv python $R/bench/runs/2026-12-06-s37/mla_time.py 128 > $OUT/ncu_source.csv 2>&1; echo "ncu source rc=$?"; wc -l $OUT/ncu_source.csv
