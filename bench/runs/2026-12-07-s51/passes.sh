# Issue 24: each kernel of one document/ragged forward and backward (bench/mods.py's rows, ragged_source.py
# of session 49), timed alone by ncu with warm caches: how much of the backward's 1.19 ms (document row,
# 430 TFLOP/s on the H200) is the passes around the main kernel (bwd_delta with the dQ zeroing, the key
# order, bwd_dq_convert). ~40 s, either card, no carry.
S=$PWD/bench/runs/2026-12-06-s49
(cd bench && PYTHONPATH=$PWD/..:$PWD timeout 150 /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
  --profile-from-start off --metrics gpu__time_duration.sum --csv python $S/ragged_source.py > $OUT/passes.csv 2> $OUT/passes_err.txt)
echo "ncu rc=$?"; tail -2 $OUT/passes_err.txt
python - <<'PY'
import csv, os
rows = [r for r in csv.DictReader(l for l in open(os.environ["OUT"] + "/passes.csv") if l.startswith('"'))]
for r in rows:
    if r.get("Metric Name") == "gpu__time_duration.sum":
        print(f'{r["ID"]:>4} {r["Kernel Name"][:40]:40} {r["Metric Value"]:>12} {r["Metric Unit"]}')
PY
