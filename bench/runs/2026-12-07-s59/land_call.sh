# Session 59's landing call for the paired paged prefill (pages of at most 32 rows; working tree = the
# pairs branch): precompile, the whole GPU suite, memcheck and racecheck of sanitize_kvcache.py (paired
# and unpaired prefills), memcheck of sanitize_attention.py sm90:bfloat16, while LIMIT allows.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; CS=/usr/local/cuda/bin/compute-sanitizer; L=${LIMIT:-520}
echo "tree hash: $(ls -d cupyflash kernels_cu tests README.md | xargs -I{} find {} -type f -not -name '*.pyc' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 330 python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -aE "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
echo "kvcache memcheck: $(timeout 40 $CS --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1) at $(el) s"
[ $(( L - $(el) )) -gt 40 ] && { timeout $(( L - $(el) - 5 )) $CS --tool racecheck --print-limit 400 python tests/sanitize_kvcache.py > $OUT/race.txt 2>&1; echo "kvcache racecheck: $(grep -E "RACECHECK SUMMARY" $OUT/race.txt) at $(el) s"; }
[ -d /tmp/A ] && [ $(( L - $(el) )) -gt 30 ] && { (cd /tmp/A && PYTHONPATH=/tmp/A timeout 40 $CS --tool racecheck --print-limit 400 python tests/sanitize_kvcache.py > $OUT/race_A.txt 2>&1); echo "HEAD kvcache racecheck: $(grep -E "RACECHECK SUMMARY" $OUT/race_A.txt) at $(el) s"; }
[ $(( L - $(el) )) -gt 30 ] && echo "sm90:bfloat16 memcheck: $(timeout $(( L - $(el) - 3 )) $CS --tool memcheck python tests/sanitize_attention.py sm90:bfloat16 2>&1 | tail -1) at $(el) s"
echo "done at $(el) s"
