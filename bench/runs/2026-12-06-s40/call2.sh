# Session 40, call 2: `both` (main + Hopper MLA v2 + cF seesaw + per-warp decode) precompiled, then
# its whole GPU suite. Carry [".ab/t"].
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
cd .ab/t/both
PYTHONPATH=$PWD python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
PYTHONPATH=$PWD timeout $(( 585 - ($(date +%s) - t0) )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
