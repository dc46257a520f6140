export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 240 python -m pytest -q -m gpu -n 8 --dist load -p no:cacheprovider -rfE tests > $OUT/gpu_suite.txt 2>&1; tail -1 $OUT/gpu_suite.txt
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/racecheck_kvc.txt 2>&1; tail -1 $OUT/racecheck_kvc.txt
timeout 90 ncu --clock-control none -k regex:sm90_fwd --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section InstructionStats python bench/runs/2026-12-05-s29/dropout_ncu.py > $OUT/ncu_dropout.txt 2>&1
grep -E "Duration|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued" $OUT/ncu_dropout.txt
