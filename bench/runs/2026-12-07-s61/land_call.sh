# Session 61's landing call (H200, ~300 s): precompile and the whole GPU suite on the working tree (the
# float32 forward's graph by parts); its tree hash, the summary line and failures.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
echo "tree hash: $(ls -d cupyflash kernels_cu tests README.md | xargs -I{} find {} -type f -not -name '*.pyc' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 330 python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -aE "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
echo "done at $(el) s"
