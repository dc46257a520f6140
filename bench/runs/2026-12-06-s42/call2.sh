# Session 42's second call (~480 s): the whole GPU suite of the working tree = main + the Hopper MLA
# kernel (s39 v2) + the per-warp decode (s39 dW) + the forced family's FP8 error (s40) + the cp.async
# L2::256B hint (s40), then memcheck of the KV-cache kernels. A pass lands it, naming the card.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
export PYTHONPATH=$PWD
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout $(( 470 - ($(date +%s) - t0) )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
left=$(( 560 - ($(date +%s) - t0) ))
[ $left -gt 40 ] && timeout $(( left - 10 )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -4
echo "done at $(( $(date +%s) - t0 )) s"
