# Session 57, call 2 (any Hopper card). (1) Issue 25: land_fp8.sh's suite ran out of time at 92% (no
# failure) on the slack tree (this working tree = HEAD + runs/2026-12-07-s55/pending/i25_fp8_slack.patch);
# the slack changes only the FP8 forward, so: its variants precompiled, tests/test_fp8.py's GPU tests,
# memcheck of sanitize_attention.py sm90:float8_e4m3fn. (2) Issue 26: V in one box a page
# (pending/i26_values_one_box.patch on HEAD, /tmp/V): paged_order.py on this tree (A: the bf16 kernels are
# HEAD's) and on V, V's paged prefill tests, memcheck of sanitize_kvcache.py on V, a second round.
# Prediction (session 56's box-count model): pages of 16 from ~0.74x dense to ~0.82x, 64 and 128 +0-1%.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-480}; R=$PWD; CS=/usr/local/cuda/bin/compute-sanitizer
rm -rf /tmp/V && mkdir -p /tmp/V && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/V
(cd /tmp/V && git apply $R/bench/runs/2026-12-07-s57/pending/i26_values_one_box.patch) || exit 1
PYTHONPATH=$R python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
fp8 = [v for v in _families.VARIANTS if 'fp8' in v.kernel.name or 'e4m3' in str(v)]
_kernels.precompile(fp8, max_workers=16)
print(f'precompile {len(fp8)} FP8 variants {time.time() - t:.1f} s')"
PYTHONPATH=$R timeout 120 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -2
echo "FP8 memcheck: $(PYTHONPATH=$R timeout 80 $CS --tool memcheck python tests/sanitize_attention.py sm90:float8_e4m3fn 2>&1 | tail -1) at $(el) s"
po() { echo "== $1 paged_order at $(el) s"; (cd $1 && PYTHONPATH=$1 timeout 80 python $R/bench/runs/2026-12-06-s45/paged_order.py 2>&1 | tail -5); }
po $R; po /tmp/V
(cd /tmp/V && PYTHONPATH=/tmp/V timeout 100 python -m pytest -q -m gpu -n 5 -p no:cacheprovider tests/test_kvcache.py -k paged_prefill 2>&1 | tail -2)
echo "V kvcache memcheck: $(cd /tmp/V && PYTHONPATH=/tmp/V timeout 50 $CS --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1) at $(el) s"
for t in $R /tmp/V; do [ $(( L - $(el) )) -gt 30 ] && po $t; done
[ $(( L - $(el) )) -gt 60 ] && echo "FP8 racecheck: $(PYTHONPATH=$R timeout $(( L - $(el) )) $CS --tool racecheck python tests/sanitize_attention.py sm90:float8_e4m3fn 2>&1 | grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' | tail -1)"
echo "done at $(el) s"
