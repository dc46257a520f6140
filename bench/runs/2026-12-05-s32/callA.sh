# Session 32, call A: the 8-bit Philox4x32-7 dropout (issue 23). Precompile, the dropout GPU tests, the
# training rows, the merge host profile (issue 26), the whole suite with a line per test, then an ncu of
# the plain and dropout forwards (instructions, issue slots) as session 29's.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s32
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 120 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -rfE tests/test_gpu_training.py tests/test_training.py 2>&1 | tail -4
timeout 60 python bench/training.py --seqlens 4096 --repeats 10 2>&1 | tail -13
timeout 30 python $S/merge_prof.py > $OUT/merge_prof.txt 2>&1; head -32 $OUT/merge_prof.txt | cut -c1-150
echo "suite starts at $(( $(date +%s) - t0 )) s"
timeout 250 python -m pytest -v -m gpu -n 8 --dist load -p no:cacheprovider tests > $OUT/gpu_suite.txt 2>&1
grep -E "FAILED|ERROR" $OUT/gpu_suite.txt | head -10; tail -1 $OUT/gpu_suite.txt
echo "ncu starts at $(( $(date +%s) - t0 )) s"
timeout 60 ncu --clock-control none -k regex:sm90_fwd --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section InstructionStats python bench/runs/2026-12-05-s29/dropout_ncu.py > $OUT/ncu_dropout.txt 2>&1
grep -E "sm90_fwd|Duration|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued" $OUT/ncu_dropout.txt | cut -c1-120
echo "end at $(( $(date +%s) - t0 )) s"
