# Session 36, call 1 (H200): main + pending h100_tested_kernels.patch + i22_bwd_planes_v2.patch:
# precompile, the float32 accuracy over 20 inputs, the whole GPU suite, then racecheck on the new kernels.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 80 python bench/runs/2026-12-05-s34/wide_float32_seeds.py 20 > $OUT/seeds.txt 2>&1
echo "seeds: $(tail -1 $OUT/seeds.txt) at $(( $(date +%s) - t0 )) s"
timeout 330 python -m pytest -v -m gpu -n 8 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -30
