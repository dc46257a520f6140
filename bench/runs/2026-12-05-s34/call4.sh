export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s34
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 150 python -m pytest -v -m gpu -n 8 --dist load -p no:cacheprovider -k "kvcache or cache or decode or cascade" tests > $OUT/kv_tests.txt 2>&1
echo "kv tests rc=$?"; tail -1 $OUT/kv_tests.txt; grep -E "FAILED|ERROR " $OUT/kv_tests.txt | head
echo "at $(( $(date +%s) - t0 )) s"
timeout 100 python $S/decode_shallow.py --quick --rows calls decode > $OUT/decode_shallow.txt 2>&1
timeout 100 python bench/decode.py --quick --rows calls decode > $OUT/decode_deep.txt 2>&1
timeout 100 python $S/decode_shallow.py --quick --rows decode > $OUT/decode_shallow2.txt 2>&1
echo "== shallow"; tail -12 $OUT/decode_shallow.txt; echo "== deep"; tail -12 $OUT/decode_deep.txt; echo "== shallow again"; tail -6 $OUT/decode_shallow2.txt
echo "at $(( $(date +%s) - t0 )) s"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/memcheck_kv.txt 2>&1
echo "memcheck rc=$?"; tail -1 $OUT/memcheck_kv.txt
echo "end at $(( $(date +%s) - t0 )) s"
