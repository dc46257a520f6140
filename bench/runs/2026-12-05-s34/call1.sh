export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s33
P=$PWD/$S
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=16)
print(f'precompile {time.time() - t:.1f} s')"
# The five patches' tests first (the plans of dropout calls and merges, and the three kernel patches).
# A hang here is most likely the drop ring (its barriers): the -v lines name the test.
timeout 180 python -m pytest -v -m gpu -n 8 -p no:cacheprovider \
  -k "float32 or fp32 or float64 or fp64 or dropout or merge or ring or training" tests > $OUT/first.txt 2>&1
echo "first rc=$?"; tail -1 $OUT/first.txt; grep -E "FAILED|ERROR " $OUT/first.txt | head
timeout 70 python bench/training.py --seqlens 4096 --repeats 20 2>&1 | grep -E "plain|dropout"   # fwd 1.53/1.63 before
timeout 60 python $S/host_dropout.py > $OUT/host_dropout.txt 2>&1; head -4 $OUT/host_dropout.txt
timeout 60 python bench/decode.py --quick --rows cascade 2>&1 | tail -3   # the merges' plans: 2.15x before
timeout 30 python bench/runs/2026-12-05-s32/merge_prof.py 2>&1 | head -2                          # host us a merge step: 231 before
echo "end at $(( $(date +%s) - t0 )) s"
#
