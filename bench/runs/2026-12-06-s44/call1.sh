# Session 44, call 1 (~540 s, either card; trees from ../2026-12-06-s43/build_trees.sh, carry [".ab/t"]).
# Sanity first (card, one call of the library), then the correctness of the two pending trees:
#   ck   (float32 forward that splits k and v once a key tile): its GPU tests, memcheck and racecheck
#   m192 (FP8 d64 192-row CTAs): racecheck of its FP8 forwards (memcheck passed in session 43)
# then the float32 A/B (main with peers, ck without) if time is left.
export PYTHONUNBUFFERED=1
R=$PWD; card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
PYTHONPATH=$PWD timeout 60 python -c "
import cupy as cp, numpy as np, cupyflash as cf
q = cp.asarray(np.random.default_rng(0).standard_normal((1, 100, 4, 64)), dtype=cp.float16)
o = cf.flash_attention(q, q, q, causal=True); print('sanity', float(abs(o).max()))" || exit 1
echo "sanity at $(el) s"
(cd .ab/t/ck && PYTHONPATH=$PWD timeout 120 python -c "
from cupyflash import _families, _kernels
_kernels.precompile([v for v in _families.VARIANTS if v.dtype == 'float32' and 'sm80_fwd_parts' not in v.kernel.name], max_workers=16)")
echo "ck precompile at $(el) s"
(cd .ab/t/ck && PYTHONPATH=$PWD timeout 170 python -m pytest -q -m gpu -n 8 -p no:cacheprovider \
  tests/test_gpu_features.py tests/test_gpu.py -k "float32 or splits_keys" > $OUT/ck_tests.txt 2>&1
  echo "ck tests rc=$? at $(el) s"; tail -1 $OUT/ck_tests.txt; grep -E "^E |FAILED" $OUT/ck_tests.txt | cut -c1-200 | head -8)
for tool in memcheck racecheck; do
  (cd .ab/t/ck && PYTHONPATH=$PWD timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 1 \
    python tests/sanitize_attention.py sm90:float32 > $OUT/ck_$tool.txt 2>&1
   echo "ck $tool rc=$? at $(el) s"; grep -E "SUMMARY|done" $OUT/ck_$tool.txt | tail -2)
done
(cd .ab/t/m192 && PYTHONPATH=$PWD timeout 140 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --error-exitcode 1 \
  python tests/sanitize_attention.py sm90:float8_e4m3fn > $OUT/m192_racecheck.txt 2>&1
 echo "m192 racecheck rc=$? at $(el) s"; grep -E "SUMMARY|hazard|done" $OUT/m192_racecheck.txt | tail -3)
A="--dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096"
if [ $(el) -lt 420 ]; then
  (cd .ab/t/main && PYTHONPATH=$PWD timeout 70 python bench/bench.py $A 2>&1 | grep -E "^ fp32" | tee -a $OUT/fp32_main.txt)
  (cd .ab/t/ck && PYTHONPATH=$PWD timeout 50 python bench/bench.py $A --no-peers 2>&1 | grep -E "^ fp32" | tee -a $OUT/fp32_ck.txt)
fi
echo "done at $(el) s"
