# Session 54's landing call (H200 only; anything else exits at once). The landing tree T2 = HEAD +
# pending/i24_landing_s54.patch (git apply) + pending/i24_dq_claims.patch (patch -p1), built in /tmp/T2
# from the working tree (which adds pending/i24_dq_in_kernel.patch). Precompile, the GPU suite and
# memcheck of sanitize_attention.py sm90 (a pass lands T2), then, while LIMIT (seconds, default 480)
# allows, bench/mods.py's document and ragged rows beside FlexAttention, calls back to back and alone.
# TREE=T3: the working tree itself (with the in-kernel conversion), where call4.sh's A/B favours it.
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
[[ "$gpu" == *H200* ]] || exit 0
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-480}; H=$PWD/bench/runs/2026-12-07-s54
rm -rf /tmp/T2 && mkdir -p /tmp/T2 && cp -r cupyflash kernels_cu bench tests README.md ARCHITECTURE.md setup.cfg /tmp/T2
cd /tmp/T2 && { [ "${TREE:-T2}" = T3 ] || patch -R -p1 -s < $H/pending/i24_dq_in_kernel.patch; } || exit 1
echo "T2 hash: $(ls -d cupyflash kernels_cu tests README.md | xargs -I{} find {} -type f -not -name '*.pyc' | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
export PYTHONPATH=/tmp/T2
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
timeout $(( L - 60 - $(el) )) python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider tests > $OUT/suite.txt 2>&1
echo "suite rc=$? at $(el) s"; tail -1 $OUT/suite.txt; grep -E "FAILED|ERROR " $OUT/suite.txt | cut -c1-220 | head -20
timeout $(( L - 30 - $(el) )) /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90 2>&1 | tail -1
echo "memcheck done at $(el) s"
[ $(( L - $(el) )) -gt 70 ] && timeout $(( L - $(el) )) python bench/mods.py --rows document,ragged --out $OUT/mods 2>&1 | tail -6
[ $(( L - $(el) )) -gt 30 ] && timeout $(( L - $(el) )) python bench/mods.py --rows document,ragged --per-call --out $OUT/mods_pc 2>&1 | tail -6
echo "done at $(el) s"
