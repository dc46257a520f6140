# Session 42's second call (~560 s): the whole GPU suite of `all` = main + the Hopper MLA kernel (s39 v2)
# + the per-warp decode (s39 dW) + the forced family's FP8 error (s40) + the rotated K-major loop and
# the FP8 tiles (s41) if next_call.sh showed them right and faster,
# and only where next_call.sh showed them winning: the rotated 16-bit loop (with test_compile's ceilings
# raised to its spills) and the decode candidate that won (isw, blk or p32): build_trees.sh builds `all` =
# both + the K-major rotation + the FP8 tiles; patch the winners into it (cd .ab/t/all && patch -p1 -s < ...).
# On an H200 a pass lands `all` (quote the line and the card); on an H100 it is recorded (the owner's
# answer on the card rule is still awaited).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
cd .ab/t/all && export PYTHONPATH=$PWD
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout $(( 590 - ($(date +%s) - t0) )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
