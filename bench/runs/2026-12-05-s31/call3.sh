# Session 31, call 3: the fused merge kernel (tests, memcheck), the cascade row, then the whole suite.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_merge.py 2>&1 | tail -3
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_merge.py -k merge_kernel > $OUT/memcheck_merge.txt 2>&1; echo "memcheck rc=$?"; grep "ERROR SUMMARY" $OUT/memcheck_merge.txt | tail -1
timeout 90 python bench/decode.py --quick --rows cascade --json $OUT/cascade.json 2>&1 | tail -2
timeout 270 python -m pytest -q -m gpu -n 8 --dist load -p no:cacheprovider -rfE tests > $OUT/gpu_suite.txt 2>&1
grep -E "passed|failed" $OUT/gpu_suite.txt | tail -3
