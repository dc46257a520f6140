# Landing call for the paired paged prefill (after pairs_call.sh gains at pages of 16 and its tests pass):
# working tree = main + pending/i26_pairs.patch. Precompile (now with sm90_fwd_pairs), the whole GPU suite
# (330 s), memcheck of sanitize_kvcache.py (paired and unpaired prefills) and of sanitize_attention.py sm90:bfloat16
# (the unpaired forwards' scheduler and state changed shape). Give it timeout_s=600. Any Hopper card: name it.
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
echo "kvcache memcheck: $(timeout 50 $CS --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1) at $(el) s"
echo "sm90:bfloat16 memcheck: $(timeout 100 $CS --tool memcheck python tests/sanitize_attention.py sm90:bfloat16 2>&1 | tail -1) at $(el) s"
