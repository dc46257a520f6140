# Session 53's first call (~590 s, no carry). The working tree is HEAD + s52's pending/i24_landing.patch
# + s52's i24_ranked_front.patch (tree hash 643f9e6a2e4611e5). On an H200 (MODE=land): precompile, the GPU
# suite and memcheck of sanitize_attention.py sm90 (a pass lands the tree); meanwhile the A/B trees
# compile: T0 = the tree without ranked_front (the landing alone), T1 = this tree, T3 = T1 + s52's
# i24_kv_prefetch.patch, T4 = T1 + s53's pending/i24_bwd_store_staged.patch (dK/dV by TMA stores); then
# T4's dK/dV against T1's, bitwise (staged_check.py), and bench/mods.py's ragged and document rows on the
# four trees, rounds until the time is spent. On an H100: the same without the suite and memcheck, then
# s52's start probe on T1.
export PYTHONUNBUFFERED=1
R=$PWD; S=$R/bench/runs/2026-12-07-s52; H=$R/bench/runs/2026-12-07-s53
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
echo "tree hash: $(git ls-files -co --exclude-standard cupyflash kernels_cu tests README.md | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
rm -rf /tmp/T0 /tmp/T1 /tmp/T3 /tmp/T4 && mkdir -p /tmp/T1 && cp -r cupyflash kernels_cu bench tests README.md ARCHITECTURE.md setup.cfg /tmp/T1
cp -r /tmp/T1 /tmp/T0 && (cd /tmp/T0 && patch -R -p1 -s < $S/i24_ranked_front.patch) || exit 1
cp -r /tmp/T1 /tmp/T3 && (cd /tmp/T3 && patch -p1 -s < $S/i24_kv_prefetch.patch) || exit 1
cp -r /tmp/T1 /tmp/T4 && (cd /tmp/T4 && patch -p1 -s < $H/pending/i24_bwd_store_staged.patch) || exit 1
TREES="T0 T1 T3 T4"
pre() {  # pre TREE WORKERS: every variant of a tree (the kernel cache keys hold the tree's path)
  (cd $1 && PYTHONPATH=$1 timeout 250 python -c "
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=$2)" > $1.pre.log 2>&1 || tail -3 $1.pre.log) & }
warm() {  # the A/B trees' kernels: T4's every variant (for the check), the others' mods rows
  pre /tmp/T4 ${1:-12}; [ -n "$1" ] && pre $R $1
  for t in $TREES; do
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 250 python bench/mods.py --rows ragged,document --no-peers --quick --repeats 1 \
      --warmup 0 --out /tmp/warm_$t > /tmp/warm_$t.log 2>&1 || tail -3 /tmp/warm_$t.log) &
  done; }
check() {
  # T1 is the working tree itself, whose kernels the precompile built
  (PYTHONPATH=$R timeout 120 python $H/staged_check.py /tmp/check_T1.npz 2>&1 | tail -2)
  (cd /tmp/T4 && PYTHONPATH=/tmp/T4 timeout 120 python $H/staged_check.py /tmp/check_T4.npz 2>&1 | tail -2)
  python -c "
import numpy as np
a, b = np.load('/tmp/check_T1.npz'), np.load('/tmp/check_T4.npz')
bad = [k for k in a.files if not np.array_equal(a[k], b[k])]
print('staged check:', len(a.files), 'arrays,', 'all bitwise equal' if not bad else f'DIFFER: {bad}')"
}
ab() {  # ab ROUNDS END: rounds of the trees while the clock is below END
  for round in $(seq 1 $1); do for t in $TREES; do
    [ $(el) -lt $2 ] || return
    echo "== $t round $round at $(el) s"
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 60 python bench/mods.py --rows ragged,document --no-peers \
      --out $OUT/mods_${t}_$round 2>&1 | grep -E '^(row|document|ragged) ')
  done; done; }
if [[ "$gpu" == *H200* && "${MODE:-land}" == land ]]; then
  export PYTHONPATH=$PWD
  python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
  timeout $(( 420 - $(el) )) python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
  echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
  unset PYTHONPATH
  warm
  echo "== memcheck sanitize_attention.py sm90"
  timeout $(( 480 - $(el) )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90 2>&1 | tail -3
  echo "memcheck done at $(el) s"; wait; echo "warm at $(el) s"
  check; echo "checked at $(el) s"
  ab 3 565
else
  warm 8; wait; echo "compiled at $(el) s"
  check; echo "checked at $(el) s"
  ab 2 420
  rm -rf /tmp/probe && cp -r /tmp/T1 /tmp/probe && (cd /tmp/probe && patch -p1 -s < $S/start_probe.patch) || exit 1
  (cd /tmp/probe && PYTHONPATH=/tmp/probe timeout $(( 585 - $(el) )) python $S/start_probe.py 2>&1 | tail -40)
fi
echo "done at $(el) s"
