# Session 30, call B: decode/cascade rows, FP8 rows, sanitizers of the paged producer, dropout profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python bench/decode.py --quick --json $OUT/decode.json > $OUT/decode.txt 2>&1; echo "decode rc=$?"; tail -8 $OUT/decode.txt
timeout 100 python bench/fp8.py --headdims 64,128 --seqlens 4096,16384 --per-call > $OUT/fp8.txt 2>&1; echo "fp8 rc=$?"; tail -12 $OUT/fp8.txt
timeout 80 compute-sanitizer --tool memcheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/memcheck_kvc.txt 2>&1; echo "memcheck kvcache rc=$?"; tail -2 $OUT/memcheck_kvc.txt
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/racecheck_kvc.txt 2>&1; echo "racecheck kvcache rc=$?"; tail -3 $OUT/racecheck_kvc.txt
timeout 90 ncu --clock-control none -k regex:sm90_fwd --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats python bench/runs/2026-12-05-s29/dropout_ncu.py > $OUT/ncu_dropout.txt 2>&1
grep -E "Duration|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued" $OUT/ncu_dropout.txt
timeout 60 python bench/runs/2026-12-05-s30/paged_probe.py > $OUT/paged_probe.txt 2>&1; cat $OUT/paged_probe.txt
timeout 90 ncu --clock-control none -k regex:sm90_fwd --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats python bench/runs/2026-12-05-s30/paged_probe.py --ncu > $OUT/ncu_paged.txt 2>&1
grep -E "sm90_fwd|Duration|Issue Slots Busy|Warp Cycles Per Issued|L2 Hit|DRAM Throughput|Memory Throughput" $OUT/ncu_paged.txt | cut -c1-150
