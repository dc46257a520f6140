# Session 33, call 2: every variant precompiled, the dropout tests with -v (call 1's run, with only the
# d128 variants compiled, was cut at 400 s compiling), then the whole GPU suite with -v lines.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 100 python -m pytest -v -m gpu -n 8 -p no:cacheprovider -rfE tests/test_gpu_training.py tests/test_training.py > $OUT/dropout_tests.txt 2>&1
echo "dropout tests rc=$?"; tail -2 $OUT/dropout_tests.txt
echo "suite at $(( $(date +%s) - t0 )) s"
timeout $(( 520 - ($(date +%s) - t0) )) python -m pytest -v -m gpu -n 8 --dist load -p no:cacheprovider -rfE tests > $OUT/gpu_suite.txt 2>&1
echo "suite rc=$?"; tail -3 $OUT/gpu_suite.txt
echo "end at $(( $(date +%s) - t0 )) s"
