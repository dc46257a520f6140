# Session 54, call 2 (~580 s, no carry). The working tree: HEAD + s53 pending/i24_landing_s53.patch (git
# apply) + pending/i24_walk_ranges.patch (tree hash b854db616be0b77c; call 1 on an H100: suite 927 passed,
# memcheck 0, racecheck 217). On an H200: precompile, the GPU suite and memcheck (a pass lands the tree),
# then bench/mods.py's document, ragged and relbias rows beside FlexAttention, calls back to back. On an
# H100: the start probe (start_probe.patch, s52's rebased onto the staged epilogue) on the tree, then the
# same mods.py rows.
export PYTHONUNBUFFERED=1
R=$PWD; H=$R/bench/runs/2026-12-07-s54
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
echo "tree hash: $(git ls-files -co --exclude-standard cupyflash kernels_cu tests README.md | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
export PYTHONPATH=$R
if [[ "$gpu" == *H200* && "${MODE:-land}" == land ]]; then
  python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
  timeout $(( 400 - $(el) )) python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
  echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
  echo "== memcheck sanitize_attention.py sm90"
  timeout $(( 460 - $(el) )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90 2>&1 | tail -2
  echo "memcheck done at $(el) s"
else
  rm -rf /tmp/P && mkdir -p /tmp/P && cp -r cupyflash kernels_cu bench tests /tmp/P && (cd /tmp/P && patch -p1 -s < $H/start_probe.patch) || exit 1
  (cd /tmp/P && PYTHONPATH=/tmp/P timeout 200 python bench/runs/2026-12-07-s52/start_probe.py 2>&1 | tail -30)
  echo "probe done at $(el) s"
fi
timeout 120 python $H/b2b_probe.py 2>&1 | tail -6
timeout $(( 585 - $(el) )) python bench/mods.py --rows document,ragged,relbias --out $OUT/mods 2>&1 | tail -14
echo "done at $(el) s"
