# Session 58, call 3 (any Hopper card; working tree = HEAD + the FP8 slack + the V-box patch): ncu kernel
# durations of the dense bf16 forwards, HEAD (/tmp/A) against this tree (ab.py's rows read +1.3% median
# over two noisy runs), then issue 24's rows: bench/mods.py --rows document,ragged --rounds 3 (both timings).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; R=$PWD; S=$R/bench/runs/2026-12-07-s58
rm -rf /tmp/A && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
for t in /tmp/A $R; do (cd $t && PYTHONPATH=$t python -c "
from cupyflash import _families, _kernels
_kernels.precompile([v for v in _families.VARIANTS if v.kernel.name == 'sm90_fwd' and v.dtype == 'bfloat16'
                     and v.tile[0] in (128, 256) and v.tile[0] == v.tile[1] and not any(v.flags)], max_workers=2)") & done; wait
echo "compiled at $(el) s"
for round in 1 2; do for t in /tmp/A $R; do
  PYTHONPATH=$t timeout 60 /usr/local/cuda/bin/ncu --clock-control base -k regex:sm90_fwd --metrics gpu__time_duration.sum \
    --csv python $S/dense_calls.py 2>/dev/null | grep gpu__time_duration > $OUT/ncu_$(basename $t)_$round.csv
  python - $OUT/ncu_$(basename $t)_$round.csv $t <<'PY'
import csv, sys, statistics
rows = [r for r in csv.reader(open(sys.argv[1]))]
us = [float(r[-1].replace(",", "")) for r in rows]
names = ["d128", "d128c", "d256", "d256c"]
print(sys.argv[2], rows[0][-2] if rows else "", " ".join(f"{n} {statistics.median(us[4*i+1:4*i+4]):.1f}" for i, n in enumerate(names)) if len(us) == 16 else us)
PY
done; done
echo "ncu done at $(el) s"
PYTHONPATH=$R timeout 200 python bench/mods.py --rows document,ragged --rounds 3 --out $OUT/mods 2>&1 | tail -8
[ $(( 400 - $(el) )) -gt 60 ] && PYTHONPATH=$R timeout $(( 400 - $(el) )) python bench/mods.py --rows document,ragged --per-call --out $OUT/mods_pc 2>&1 | tail -8
echo "done at $(el) s"
