# Session 30, call A: main with the three pending patches applied (dropout pairs, cascade routing, FP8 plans)
# and the cheaper dropout keep bits. Each step bounded so that the whole call ends inside 600 s.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 290 python -m pytest -q -m gpu -n 8 --dist loadfile -p no:cacheprovider -rfE --durations=10 \
  --junitxml=$OUT/gpu_suite.xml tests > $OUT/gpu_suite.txt 2>&1; echo "suite rc=$?"
grep -E "^(FAILED|ERROR)" $OUT/gpu_suite.txt | cut -c1-220 | head -20; tail -1 $OUT/gpu_suite.txt
timeout 60 python bench/training.py --seqlens 4096 --repeats 10 > $OUT/training.txt 2>&1; echo "training rc=$?"; grep -E "plain|dropout" $OUT/training.txt
timeout 75 python bench/decode.py --quick --json $OUT/decode.json > $OUT/decode.txt 2>&1; echo "decode rc=$?"; tail -8 $OUT/decode.txt
timeout 40 python bench/fp8.py --headdims 128 --seqlens 4096 --per-call > $OUT/fp8.txt 2>&1; echo "fp8 rc=$?"; tail -6 $OUT/fp8.txt
