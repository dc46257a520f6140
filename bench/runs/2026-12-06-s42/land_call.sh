# Landing call (~560 s, either card; name the card in the note): the whole GPU suite of the WORKING TREE
# (apply the winning pending patches to it first, uncommitted: `patch -p1 < bench/runs/2026-12-06-s42/
# pending/NAME.patch`, then `find . -name '*.orig' -delete`), then memcheck of the KV-cache kernels
# (tests/sanitize_kvcache.py) and of the forwards (tests/sanitize_attention.py sm90). A pass lands exactly
# that tree: commit it with the pytest line and the card.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
export PYTHONPATH=$PWD
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout $(( 440 - ($(date +%s) - t0) )) python -m pytest -v -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
for s in sanitize_kvcache.py "sanitize_attention.py sm90"; do
  left=$(( 570 - ($(date +%s) - t0) )); [ $left -lt 30 ] && break
  echo "== memcheck $s"; timeout $(( left - 5 )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/$s 2>&1 | tail -3
done
echo "done at $(( $(date +%s) - t0 )) s"
