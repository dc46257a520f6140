# Session 54, call 1 (~560 s, no carry). The working tree: HEAD + pending/i24_landing_s53.patch (git apply;
# tree hash 7fb6a38da3c8ecfa) + pending/i24_walk_ranges.patch. On an H200 (MODE=land): precompile, the GPU
# suite and memcheck of sanitize_attention.py sm90 (a pass lands the tree); meanwhile T0 = the tree without
# the walk ranges compiles its mods rows; then the ncu A/B (ncu_ab.sh: every kernel of one document and
# one ragged forward and backward) of T0 against T1 = this tree, trees interleaved. On an H100 (or
# MODE=data): the A/B and racecheck of the tree's bfloat16 backward.
export PYTHONUNBUFFERED=1
R=$PWD; H=$R/bench/runs/2026-12-07-s53
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
echo "tree hash: $(git ls-files -co --exclude-standard cupyflash kernels_cu tests README.md | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
rm -rf /tmp/T0 /tmp/T1 && mkdir -p /tmp/T1 && cp -r cupyflash kernels_cu bench tests README.md ARCHITECTURE.md setup.cfg /tmp/T1
cp -r /tmp/T1 /tmp/T0 && (cd /tmp/T0 && patch -R -p1 -s < $H/pending/i24_walk_ranges.patch) || exit 1
warm() { for t in T0 T1; do
  (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 250 python bench/mods.py --rows ragged,document --no-peers --quick --repeats 1 \
    --warmup 0 --out /tmp/warm_$t > /tmp/warm_$t.log 2>&1 || tail -3 /tmp/warm_$t.log) &
done; }
if [[ "${MODE:-land}" == land ]]; then
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
  REPS=2 TREES="T0 T1" timeout $(( 590 - $(el) )) bash $H/ncu_ab.sh 2>&1 | tail -6
else
  warm; wait; echo "compiled at $(el) s"
  REPS=3 TREES="T0 T1" timeout 300 bash $H/ncu_ab.sh 2>&1 | tail -8
  (cd /tmp/T1 && PYTHONPATH=/tmp/T1 timeout $(( 580 - $(el) )) /usr/local/cuda/bin/compute-sanitizer --tool racecheck \
    python tests/sanitize_attention.py sm90:bfloat16 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY" | tail -2)
fi
echo "done at $(el) s"
