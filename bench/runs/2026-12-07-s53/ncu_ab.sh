# Session 53: the A/B by ncu kernel durations (gpu__time_duration, warm caches, clocks free): trees T0 T1 T4
# (call1.sh builds them in /tmp), bench/mods.py's document and ragged rows, one forward and one backward
# each (s49 ragged_source.py), REPS times per tree, trees interleaved. ~40 s a tree and repetition.
S=$PWD/bench/runs/2026-12-06-s49
for rep in $(seq 1 ${REPS:-2}); do for t in ${TREES:-T0 T1 T4}; do
  (cd /tmp/$t/bench && PYTHONPATH=/tmp/$t:/tmp/$t/bench timeout 150 /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
    --profile-from-start off --metrics gpu__time_duration.sum --csv python $S/ragged_source.py > $OUT/ncu_${t}_$rep.csv 2> /tmp/ncu_err.txt) || tail -3 /tmp/ncu_err.txt
  python - $OUT/ncu_${t}_$rep.csv $t $rep <<'PY'
import csv, re, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')) if r.get("Metric Name") == "gpu__time_duration.sum"]
def name(r):
    m = re.match(r"(?:void )?(?:cupyflash::)?(\w+)", r["Kernel Name"])
    return m.group(1) if m else r["Kernel Name"][:12]
us = lambda r: float(r["Metric Value"].replace(",", "")) / (1e3 if r["Metric Unit"] in ("ns", "nsecond") else 1)  # noqa: E731
main = [f"{name(r)}={us(r):.1f}" for r in rows if name(r) in ("sm90_fwd", "sm90_bwd")]
print(sys.argv[2], sys.argv[3], " ".join(main), f"all={sum(map(us, rows)):.1f} us ({len(rows)} kernels)")
PY
done; done
