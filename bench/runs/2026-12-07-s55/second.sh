# Session 55, second start. SUITE=1 on an H200 (~480 s): the landed tree's GPU suite, memcheck and
# bench/mods.py's document and ragged rows beside FlexAttention (LIMIT 440 s); otherwise the paged
# walk's A/B that session 49 left (runs/2026-12-06-s49/paged_ab_landed.sh, ~150 s), then bench/mods.py's
# document and ragged rows in 3 rounds of balanced orders, back to back and each call alone (~130 s).
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
if [[ "$gpu" != *H200* || ${SUITE:-0} = 0 ]]; then
  bash bench/runs/2026-12-06-s49/paged_ab_landed.sh 2>&1 | tail -30
  export PYTHONPATH=$PWD
  for mode in "" --per-call; do
    timeout 150 python bench/mods.py --rows document,ragged --rounds 3 $mode --out $OUT/mods$mode 2>&1 | tail -6
  done
  exit 0
fi
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-440}
echo "tree hash: $(ls -d cupyflash kernels_cu tests README.md | xargs -I{} find {} -type f -not -name '*.pyc' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
export PYTHONPATH=$PWD
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout $(( L - 70 - $(el) )) python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
timeout 45 /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90 2>&1 | tail -1
echo "memcheck done at $(el) s"
[ $(( L - $(el) )) -gt 25 ] && timeout $(( L - $(el) )) python bench/mods.py --rows document,ragged --rounds 2 --out $OUT/mods 2>&1 | tail -6
echo "done at $(el) s"
