# Session 53's second call (~580 s, no carry). MODE=land: the working tree is main + a pending patch
# (s52's i24_ranked_front.patch): precompile, the GPU suite, memcheck of sanitize_attention.py sm90.
# MODE=probe: s52's start probe on the working tree + start_probe.patch (in /tmp). Then, with the time
# left, bench/mods.py's document and ragged rows beside FlexAttention, back to back and each call alone.
export PYTHONUNBUFFERED=1
R=$PWD; S=$R/bench/runs/2026-12-07-s52
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
echo "tree hash: $(git ls-files -co --exclude-standard cupyflash kernels_cu tests README.md | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
if [ "${MODE:-land}" = land ]; then
  export PYTHONPATH=$PWD
  python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
  timeout $(( 420 - $(el) )) python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
  echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
  echo "== memcheck sanitize_attention.py sm90"
  timeout $(( 490 - $(el) )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90 2>&1 | tail -3
  echo "memcheck done at $(el) s"
else
  rm -rf /tmp/probe && mkdir /tmp/probe && cp -r cupyflash kernels_cu bench tests README.md setup.cfg /tmp/probe
  (cd /tmp/probe && patch -p1 -s < $S/start_probe.patch) || exit 1
  (cd /tmp/probe && PYTHONPATH=/tmp/probe timeout 200 python $S/start_probe.py 2>&1 | tail -40)
  echo "probe done at $(el) s"
fi
export PYTHONPATH=$PWD
echo "== mods, back to back"
timeout $(( 530 - $(el) )) python bench/mods.py --rows document,ragged --out $OUT/mods_b2b 2>&1 | grep -vE '^\s*$' | tail -12
echo "== mods, each call alone at $(el) s"
timeout $(( 590 - $(el) )) python bench/mods.py --rows document,ragged --per-call --out $OUT/mods_alone 2>&1 | grep -vE '^\s*$' | tail -12
echo "done at $(el) s"
