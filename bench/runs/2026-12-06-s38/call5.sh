# Session 39's second call (~540 s), warm after call4.sh: the whole GPU suite in .ab/t/v2 (main + the Hopper
# MLA kernel, pending/i26_mla_sm90_v2.patch; built by call4.sh's header), kernels precompiled first, the
# failures listed; then memcheck and racecheck of tests/sanitize_kvcache.py there. Land v2 when it passes.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
cd .ab/t/v2
PYTHONPATH=$PWD python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
PYTHONPATH=$PWD timeout $(( $(left) - 100 )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -c PASSED $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
PYTHONPATH=$PWD timeout 40 compute-sanitizer --tool memcheck --error-exitcode 1 python tests/sanitize_kvcache.py > $OUT/memcheck.txt 2>&1; echo "memcheck rc=$?"; tail -1 $OUT/memcheck.txt
PYTHONPATH=$PWD timeout $(( $(left) - 3 )) compute-sanitizer --tool racecheck python tests/sanitize_kvcache.py > $OUT/racecheck.txt 2>&1; echo "racecheck rc=$?"; tail -1 $OUT/racecheck.txt
