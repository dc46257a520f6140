# Landing call for session 58 (any Hopper card; name it): the working tree = HEAD +
# bench/runs/2026-12-07-s55/pending/i25_fp8_slack.patch + bench/runs/2026-12-07-s57/pending/i26_values_one_box.patch
# (apply both first; tree hash printed). Precompile, the whole GPU suite (session 57's run on the slack
# alone ran out of time at 92% with nothing failed: the precompile took 138 s, so the suite gets 330 s
# here), memcheck of sanitize_kvcache.py (the paged prefill's new V layout) and of sanitize_attention.py
# sm90:float8_e4m3fn (the slack). Then ab_s58.sh on the same warm machine.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; CS=/usr/local/cuda/bin/compute-sanitizer
echo "tree hash: $(ls -d cupyflash kernels_cu tests README.md | xargs -I{} find {} -type f -not -name '*.pyc' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
export PYTHONPATH=$PWD
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 330 python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -aE "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
echo "kvcache memcheck: $(timeout 45 $CS --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1) at $(el) s"
echo "FP8 memcheck: $(timeout 70 $CS --tool memcheck python tests/sanitize_attention.py sm90:float8_e4m3fn 2>&1 | tail -1) at $(el) s"
