# Session 58, optional third call (after land_s58.sh and ab_s58.sh, with the working tree = HEAD + the two
# pending patches of land_s58.sh): the d128 forward in 192-row CTAs of 64-key tiles, 4 stages
# (pending/i26_d128_m192_experiment.patch on top: FWD_TILES' first d128 tile; masks, dropout, score and
# mask functions and the maximum score keep 128 x 128). NVRTC (session 57): 128 registers, no consumer
# spills, no serialization; 231,424 bytes of shared memory with the staged epilogue. Why: at pages of 16
# a 64-key tile pair takes 12 boxes for 192 rows, 16 for every 128 rows x 128 keys against V's 24, which
# the box-count model puts near 0.9x; the dense d128 forward may gain or lose (d64's 192-row tiles gained
# 6-13%). Measures paged16_ab.py on V (this tree) and M, then bench/ab.py's d128 forward rows V against M.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-400}; R=$PWD; S=$R/bench/runs/2026-12-07-s57
rm -rf /tmp/M && mkdir -p /tmp/M && cp -r cupyflash kernels_cu bench tests setup.cfg README.md /tmp/M/
(cd /tmp/M && git apply $S/pending/i26_d128_m192_experiment.patch) || exit 1
(cd /tmp/M && PYTHONPATH=/tmp/M python -c "
from cupyflash import _families, _kernels
_kernels.precompile([v for v in _families.VARIANTS if v.kernel.name == 'sm90_fwd' and v.dtype == 'bfloat16'
                     and v.tile[:3] == (128, 128, 192) and not any(v.flags)], max_workers=1)")
echo "compiled at $(el) s"
for round in 1 2; do for t in $R /tmp/M; do
  echo "$t: $(cd $t && PYTHONPATH=$t timeout 60 python $S/paged16_ab.py 2>&1 | tail -1) at $(el) s"
done; done
timeout $(( L - $(el) )) python bench/ab.py --old $R --new /tmp/M --rows 'fwd_d128*,fwd_gqa' --rounds 2 2>&1 | tail -12
echo "done at $(el) s"
