# Session 36, the last short call (~170 s): split_keys against the planes pass at head dim 128 (speed
# only), then the MLA rows.
export PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
(cd .ab/t/split && PYTHONPATH=$PWD timeout 60 python -c "
from cupyflash import _families, _kernels
from cupyflash._families import sm90
vs = [v for v in sm90.FWD_PLANES.variants() if v.param('headdim') == 128 and not any(v.flags[:3])]
vs += [v for v in _families.VARIANTS if v.kernel.name in ('split_planes',)]
_kernels.precompile(vs, max_workers=8)") &
PYTHONPATH=$R timeout 60 python -c "
from cupyflash import _families, _kernels
_kernels.precompile([v for v in _families.VARIANTS if v.kernel.name == 'kvc_mla'], max_workers=4)"
wait
echo "compiled at $(( $(date +%s) - t0 )) s"
(cd .ab/t/split && PYTHONPATH=$PWD timeout 60 python $R/bench/runs/2026-12-05-s36/split_check.py --speed-only --d128 2>&1 | tail -6)
PYTHONPATH=$R timeout 50 python bench/decode.py --quick --rows mla 2>&1 | tail -5 | cut -c1-160
echo "end at $(( $(date +%s) - t0 )) s"
