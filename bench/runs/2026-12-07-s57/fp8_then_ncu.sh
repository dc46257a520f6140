# Session 57, call 2 (any Hopper card): land_fp8.sh's suite ran out of time at 92% (no failure) on the slack
# tree; the slack changes only the FP8 forward (kOffset 8, sm90/fwd_kmajor_mainloop.cuh). So: precompile the
# FP8 variants, the FP8 GPU tests, memcheck and racecheck of sanitize_attention.py sm90:float8_e4m3fn; then
# issue 26's ncu of pages of 16 (bench/runs/2026-12-07-s56/ncu_paged16.sh) on HEAD and the copies.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
export PYTHONPATH=$PWD
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
fp8 = [v for v in _families.VARIANTS if 'fp8' in v.kernel.name or 'e4m3' in str(v)]
_kernels.precompile(fp8, max_workers=16)
print(f'precompile {len(fp8)} FP8 variants {time.time() - t:.1f} s')"
timeout 150 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_fp8.py tests/test_dispatch.py 2>&1 | tail -3
echo "tests done at $(el) s"
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90:float8_e4m3fn 2>&1 | tail -1
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool racecheck python tests/sanitize_attention.py sm90:float8_e4m3fn 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY" | tail -1
echo "sanitizers done at $(el) s"
unset PYTHONPATH
bash bench/runs/2026-12-07-s56/ncu_paged16.sh
echo "done at $(el) s"
