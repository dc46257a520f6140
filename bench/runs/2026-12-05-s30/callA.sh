# Session 30, call A: main with the three pending patches applied (dropout pairs, cascade routing, FP8 plans).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 330 python -m pytest -q -m gpu -n 8 --dist loadfile -p no:cacheprovider -rfE --durations=10 \
  --junitxml=$OUT/gpu_suite.xml tests > $OUT/gpu_suite.txt 2>&1; echo "suite rc=$?"
grep -E "^(FAILED|ERROR)" $OUT/gpu_suite.txt | cut -c1-220 | head -20; tail -1 $OUT/gpu_suite.txt
timeout 70 python bench/training.py --seqlens 4096 --repeats 10 > $OUT/training.txt 2>&1; echo "training rc=$?"; grep -E "plain|dropout" $OUT/training.txt
