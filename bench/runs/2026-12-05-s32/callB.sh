# Session 32, call B: dropout drawn while the products run (the 8-bit draws packed a word per 32-key
# block). Precompile, the dropout tests, the training rows, ncu of the four forwards, the sanitizers.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s32
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 120 python -m pytest -q -m gpu -n 8 -p no:cacheprovider -rfE tests/test_gpu_training.py tests/test_training.py 2>&1 | tail -3
timeout 60 python bench/training.py --seqlens 4096 --repeats 10 2>&1 | grep -E "plain|dropout"
timeout 80 ncu --clock-control none -k regex:sm90_fwd --section SpeedOfLight --section WarpStateStats \
  --section InstructionStats python $S/dropout_ncu2.py > $OUT/ncu_dropout2.txt 2>&1
grep -E "sm90_fwd|Duration|Executed Instructions  |Warp Cycles Per Issued" $OUT/ncu_dropout2.txt | cut -c1-100
echo "sanitizers at $(( $(date +%s) - t0 )) s"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 python $S/sanitize_dropout.py > $OUT/memcheck_dropout.txt 2>&1; echo "memcheck rc=$?"; tail -2 $OUT/memcheck_dropout.txt
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 python $S/sanitize_dropout.py > $OUT/racecheck_dropout.txt 2>&1; echo "racecheck rc=$?"; tail -2 $OUT/racecheck_dropout.txt
echo "end at $(( $(date +%s) - t0 )) s"
