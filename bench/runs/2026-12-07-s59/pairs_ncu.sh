# Session 59, issue 26: the paired paged prefill (pending/i26_pairs.patch of s58 applied to the working tree)
# gained 0-4% at pages of 16 in pairs_call.sh (A 538, 529; pairs 534, 554 TFLOP/s, H100) where 0.9x dense
# (~560-580) was predicted. ncu of dense and pages of 16 (s42's paged_ncu.py) on A = HEAD and the tree:
# duration, tensor / TMA pipes, L2 sectors from TEX and DRAM bytes (multicast should halve the L2 reads of
# K and V at pages of 16), the warp states; then two more paged16_ab rounds. Any Hopper card, ~200 s.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; R=$PWD
rm -rf /tmp/A && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
(cd /tmp/A && PYTHONPATH=/tmp/A python $R/bench/runs/2026-12-07-s57/paged16_ab.py --precompile) &
PYTHONPATH=$R python -c "
from cupyflash import _families, _kernels
from cupyflash._families import sm90
_kernels.precompile([v for v in _families.VARIANTS if v.kernel.name == 'sm90_fwd' and v.dtype == 'bfloat16'
                     and v.tile[:2] == (128, 128) and not any(v.flags)] + list(sm90.FWD_PAIRS.variants()), max_workers=3)"
wait; echo "compiled at $(el) s"
M='regex:sm__(pipe_tma_cycles_active|pipe_tensor_cycles_active|issue_active)\.avg\.pct_of_peak_sustained_active$,gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex.sum,lts__t_requests_srcunit_tex.sum'
for t in /tmp/A $R; do
  echo "== ncu $t"
  (cd $t && PYTHONPATH=$t timeout 100 /usr/local/cuda/bin/ncu --section WarpStateStats --metrics "$M" -k regex:sm90_fwd -c 2 \
     python $R/bench/runs/2026-12-06-s42/paged_ncu.py 0 16 > $OUT/ncu_$(basename $t).txt 2>&1)
  grep -E "sm90_fwd|pct|sum|hit_rate|Stall (Long|Wait|Barrier|Sleeping|Math|MIO|LG)" $OUT/ncu_$(basename $t).txt | sed -E 's/  +/ /g' | sed -E 's/\(.*\)//' | cut -c1-110
done
echo "ncu at $(el) s"
for round in 1 2 3; do for t in /tmp/A $R; do
  echo "$(basename $t) paged: $(cd $t && PYTHONPATH=$t timeout 40 python $R/bench/runs/2026-12-07-s57/paged16_ab.py 2>&1 | tail -1) at $(el) s"
done; done
