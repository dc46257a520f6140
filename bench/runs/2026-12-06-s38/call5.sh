# Session 39's second call (~500 s), warm after call4.sh: the whole GPU suite on main (the Hopper MLA kernel
# now serves MLA calls from 16 rows), kernels precompiled first; the failures listed.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-500}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
PYTHONPATH=$R python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
PYTHONPATH=$R timeout $(( $(left) - 5 )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -c PASSED $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
