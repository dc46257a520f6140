# Session 29, call 1: every switch on (cupyflash/_gates.py defaults True); the whole GPU suite, 4 xdist workers
# after one precompile on 16 threads.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,memory.total --format=csv,noheader
python -c "import pytest, xdist; print('xdist', xdist.__version__)"
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
left=$(( 575 - ($(date +%s) - t0) ))
echo "suite limit $left s"
timeout $left python -m pytest -q -m gpu -n 4 --dist loadfile -p no:cacheprovider -rfE --durations=15 \
  --junitxml=$OUT/gpu_suite.xml tests > $OUT/gpu_suite.txt 2>&1
echo "rc=$?"
grep -E "^(FAILED|ERROR)" $OUT/gpu_suite.txt | cut -c1-220 | head -40
tail -22 $OUT/gpu_suite.txt | cut -c1-200
