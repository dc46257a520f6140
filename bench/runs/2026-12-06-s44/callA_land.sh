# Session 44, call A (~560 s, either card; name the card): the landing call of session 42 on the WORKING
# TREE = main + m192 (i25_fp8_d64_three_consumers.patch) + ck (i22_fwd_claimed_keys.patch), uncommitted:
# precompile, the whole GPU suite, memcheck of the sm90 kernels (sanitize_attention.py sm90). Call B runs the
# racechecks and the A/B timings. A pass of both lands exactly that tree.
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
for s in "sanitize_attention.py sm90"; do  # the KV-cache kernels: untouched by both patches
  left=$(( 570 - ($(date +%s) - t0) )); [ $left -lt 30 ] && break
  echo "== memcheck $s"; timeout $(( left - 5 )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/$s 2>&1 | tail -3
done
echo "done at $(( $(date +%s) - t0 )) s"
