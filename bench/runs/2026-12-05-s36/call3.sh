# Session 36, the short call (the budget left after the refused starts): the measurements that decide the
# two new designs: split_keys (.ab/t/split) speed against the planes pass and its bitwise check, and the
# MLA rows with two tiles in flight (root: main + the pending kernel patches + the MLA change).
export PYTHONUNBUFFERED=1
R=$PWD
P=$R/bench/runs/2026-12-05-s33/pre.py
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-280}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
(cd .ab/t/split && PYTHONPATH=$PWD timeout 90 python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
from cupyflash._families import sm90
vs = [v for v in sm90.FWD_PLANES.variants() if not v.param('score_mod') and not v.param('max_score')]
vs += [v for v in _families.VARIANTS if v.kernel.name in ('split_planes', 'bwd_delta', 'mask_mod_blocks')]
_kernels.precompile(vs, max_workers=16)
print(f'split precompile {len(vs)} {time.time() - t:.1f} s')") &
PYTHONPATH=$R timeout 90 python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
vs = [v for v in _families.VARIANTS if v.kernel.name == 'kvc_mla']
_kernels.precompile(vs, max_workers=4)
print(f'mla precompile {time.time() - t:.1f} s')"
wait
echo "at $(( $(date +%s) - t0 )) s"
PYTHONPATH=$R timeout 60 python bench/decode.py --quick --rows mla > $OUT/decode.txt 2>&1; tail -6 $OUT/decode.txt | cut -c1-160
(cd .ab/t/split && PYTHONPATH=$PWD timeout $(( $(left) - 3 )) python $R/bench/runs/2026-12-05-s36/split_check.py > $OUT/split_check.txt 2>&1); echo "split rc=$? at $(( $(date +%s) - t0 )) s"; cat $OUT/split_check.txt | tail -25
