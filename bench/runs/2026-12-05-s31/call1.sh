export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 120 python -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_kvcache.py tests/test_gpu_features.py -k "paged or varlen_paged" 2>&1 | tail -4
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/memcheck_kvc.txt 2>&1; echo "memcheck rc=$?"; tail -1 $OUT/memcheck_kvc.txt
timeout 45 python bench/runs/2026-12-05-s30/paged_probe.py 2>&1 | tail -7
timeout 80 python bench/decode.py --quick --json $OUT/decode.json > $OUT/decode.txt 2>&1; echo "decode rc=$?"; tail -8 $OUT/decode.txt
