# Session 54, call 3 (~570 s, no carry). The working tree (T2): HEAD + pending/i24_landing_s54.patch (the
# s53 landing and the walk ranges; call 1: suite passed on an H100) + pending/i24_dq_claims.patch (the
# unzeroed dQ buffers). Precompile, the claims' own tests, then the GPU suite and memcheck (on an H200 a
# pass lands the tree), then the ncu A/B of T1 (the tree without the claims) against T2.
export PYTHONUNBUFFERED=1
R=$PWD; H=$R/bench/runs/2026-12-07-s54
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
echo "tree hash: $(git ls-files -co --exclude-standard cupyflash kernels_cu tests README.md | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
rm -rf /tmp/T1 && mkdir -p /tmp/T1 && cp -r cupyflash kernels_cu bench tests README.md ARCHITECTURE.md setup.cfg /tmp/T1
(cd /tmp/T1 && patch -R -p1 -s < $H/pending/i24_dq_claims.patch) || exit 1
export PYTHONPATH=$R
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout 120 python -m pytest -q -x -m gpu -p no:cacheprovider tests/test_gpu_mods.py -k "query_tiles_no_key or document_mask or hopper_backward" 2>&1 | tail -4
[ ${PIPESTATUS[0]} -eq 0 ] || { echo "claims tests failed at $(el) s"; exit 1; }
echo "claims tests passed at $(el) s"
timeout $(( 400 - $(el) )) python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
(cd /tmp/T1 && PYTHONPATH=/tmp/T1 timeout 200 python bench/mods.py --rows ragged,document --no-peers --quick --repeats 1 \
  --warmup 0 --out /tmp/warm_T1 > /tmp/warm_T1.log 2>&1 || tail -3 /tmp/warm_T1.log) &
echo "== memcheck sanitize_attention.py sm90"
timeout $(( 470 - $(el) )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90 2>&1 | tail -2
wait; echo "memcheck and T1 warm at $(el) s"
unset PYTHONPATH
REPS=${REPS:-1} TREES="/tmp/T1 $R" timeout $(( 590 - $(el) )) bash $H/ncu_ab.sh 2>&1 | tail -6
echo "done at $(el) s"
