# Session 54, call 4 (~380 s, any card). The working tree T3 = T2 (land.sh) + pending/i24_dq_in_kernel.patch
# (dQ converted in the backward under block masks). Precompile, the block-mask and function tests
# (tests/test_gpu_mods.py, test_gpu_features.py), memcheck and racecheck of sanitize_attention.py
# sm90:bfloat16, the ncu A/B of T2 against T3, then bench/mods.py's document and ragged rows.
export PYTHONUNBUFFERED=1
R=$PWD; H=$R/bench/runs/2026-12-07-s54
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
rm -rf /tmp/T2 && mkdir -p /tmp/T2 && cp -r cupyflash kernels_cu bench tests README.md ARCHITECTURE.md setup.cfg /tmp/T2
(cd /tmp/T2 && patch -R -p1 -s < $H/pending/i24_dq_in_kernel.patch) || exit 1
export PYTHONPATH=$R
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
(cd /tmp/T2 && PYTHONPATH=/tmp/T2 timeout 200 python bench/mods.py --rows ragged,document --no-peers --quick --repeats 1 \
  --warmup 0 --out /tmp/warm_T2 > /tmp/warm_T2.log 2>&1 || tail -3 /tmp/warm_T2.log) &
timeout 150 python -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_gpu_mods.py tests/test_gpu_features.py > $OUT/tests.txt 2>&1
echo "tests rc=$? at $(el) s"; tail -1 $OUT/tests.txt; grep -E "FAILED|ERROR " $OUT/tests.txt | cut -c1-220 | head -10
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_attention.py sm90:bfloat16 2>&1 | tail -1
timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool racecheck python tests/sanitize_attention.py sm90:bfloat16 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY" | tail -1
wait; echo "sanitizers and T2 warm at $(el) s"
unset PYTHONPATH
REPS=1 TREES="/tmp/T2 $R" timeout $(( 330 - $(el) )) bash $H/ncu_ab.sh 2>&1 | tail -3
export PYTHONPATH=$R
[ $(( 390 - $(el) )) -gt 60 ] && timeout $(( 390 - $(el) )) python bench/mods.py --rows document,ragged --out $OUT/mods 2>&1 | tail -6
echo "done at $(el) s"
