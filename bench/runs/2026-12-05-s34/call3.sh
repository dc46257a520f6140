export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 330 python -m pytest -v -m gpu -n 8 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$?"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | head
echo "at $(( $(date +%s) - t0 )) s"
timeout 90 python bench/training.py --seqlens 4096 --repeats 20 --per-call 2>&1 | grep -E "plain|dropout|sinks|max"
echo "end at $(( $(date +%s) - t0 )) s"
