# Session 54: the A/B by ncu kernel durations (gpu__time_duration, warm caches, clocks free) of trees given
# as directories (TREES), s49's ragged_source.py (bench/mods.py's document and ragged rows: one forward and
# one backward each), REPS times per tree, trees interleaved; prints every kernel's us per tree and rep.
S=$PWD/bench/runs/2026-12-06-s49
for rep in $(seq 1 ${REPS:-2}); do for t in $TREES; do
  n=$(basename $t)
  (cd $t/bench && PYTHONPATH=$t:$t/bench timeout 150 /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
    --profile-from-start off --metrics gpu__time_duration.sum --csv python $S/ragged_source.py > $OUT/ncu_${n}_$rep.csv 2> /tmp/ncu_err.txt) || tail -3 /tmp/ncu_err.txt
  python - $OUT/ncu_${n}_$rep.csv $n $rep <<'PY'
import csv, re, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')) if r.get("Metric Name") == "gpu__time_duration.sum"]
def name(r):
    m = re.match(r"(?:void )?(?:cupyflash::)?(\w+)", r["Kernel Name"])
    return m.group(1) if m else r["Kernel Name"][:12]
us = lambda r: float(r["Metric Value"].replace(",", "")) / (1e3 if r["Metric Unit"] in ("ns", "nsecond") else 1)  # noqa: E731
print(sys.argv[2], sys.argv[3], " ".join(f"{name(r)}={us(r):.1f}" for r in rows), f"all={sum(map(us, rows)):.1f}")
PY
done; done
