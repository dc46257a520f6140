# Session 38's third call: is kvc_mla_sm90's racecheck report racecheck's model? The named-barrier probe
# (tests/sanitize_named_barrier.py), then sanitize_kvcache under racecheck in .ab/t/mla_sync (the MLA tree
# with every bar.arrive of mla_sm90.cu a bar.sync); the Hopper kernel's MLA times (and forced to 16 and 32 heads), the same in .ab/t/mla2 (S box by box, the rope box refilled after S), ncu of it at 128 heads; racecheck of the
# float32 forward and backward (sanitize_attention.py sm90:float32) with the time left.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-480}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
PYTHONPATH=$R timeout 60 compute-sanitizer --tool racecheck python tests/sanitize_named_barrier.py > $OUT/race_probe.txt 2>&1; echo "probe rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "sums|RACECHECK SUMMARY|Error" $OUT/race_probe.txt | head -8
cd .ab/t/mla_sync && PYTHONPATH=$PWD timeout 120 compute-sanitizer --tool racecheck python tests/sanitize_kvcache.py > $OUT/race_mla_sync.txt 2>&1; echo "mla_sync racecheck rc=$? at $(( $(date +%s) - t0 )) s"; tail -2 $OUT/race_mla_sync.txt; grep -c "kvc_mla_sm90" $OUT/race_mla_sync.txt
cd $R/.ab/t/mla && PYTHONPATH=$PWD timeout 80 python $R/bench/runs/2026-12-06-s37/mla_time.py 128 16 > $OUT/mla_time.txt 2>&1; PYTHONPATH=$PWD timeout 60 python $R/bench/runs/2026-12-06-s37/mla_time.py --force-sm90 16 32 >> $OUT/mla_time.txt 2>&1; (cd $R/.ab/t/mla2 && PYTHONPATH=$PWD timeout 60 python $R/bench/runs/2026-12-06-s37/mla_time.py 128 16 > $OUT/mla2_time.txt 2>&1); echo "mla2 (per-box S, rope refilled early):"; cat $OUT/mla2_time.txt | cut -c1-160; echo "mla time at $(( $(date +%s) - t0 )) s"; cat $OUT/mla_time.txt | cut -c1-160
PYTHONPATH=$PWD timeout 120 ncu -k regex:kvc_mla_sm90 -s 1 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters --section Occupancy python $R/bench/runs/2026-12-06-s37/mla_time.py 128 > $OUT/ncu_mla128.txt 2>&1; echo "ncu rc=$? at $(( $(date +%s) - t0 )) s"
cd $R && PYTHONPATH=$R timeout $(( $(left) - 3 )) compute-sanitizer --tool racecheck python tests/sanitize_attention.py sm90:float32 > $OUT/race_f32.txt 2>&1; echo "racecheck f32 rc=$? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/race_f32.txt
echo "end at $(( $(date +%s) - t0 )) s"
