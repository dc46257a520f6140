# Issue 24: where the ragged row's partial tiles spend their time (forward 361 TFLOP/s against the document
# row's ~495 on the H200 with the element bits, session 49; backward 318 against 435). ncu keeps the four
# sm90 launches of ragged_source.py (document fwd, document bwd, ragged fwd, ragged bwd) in a report, prints
# each one's duration and warp stall reasons, then the 25 SASS instructions with the most stall samples.
# ~150 s, either card, no carry. Add a patch as $1 to profile a copy of HEAD with it instead.
S=$PWD/bench/runs/2026-12-06-s49
T=$PWD
if [ -n "$1" ]; then
  rm -rf /tmp/P && mkdir -p /tmp/P && git archive HEAD cupyflash kernels_cu bench | tar -x -C /tmp/P
  (cd /tmp/P && patch -p1 -s < $T/$1) || exit 1
  T=/tmp/P
fi
(cd $T/bench && PYTHONPATH=$T:$T/bench timeout 280 /usr/local/cuda/bin/ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section SourceCounters --section WarpStateStats --import-source no \
  -k regex:'^sm90_(fwd|bwd)$' -o $OUT/ragged -f python $S/ragged_source.py > $OUT/ragged_source_run.txt 2>&1)
tail -3 $OUT/ragged_source_run.txt
/usr/local/cuda/bin/ncu -i $OUT/ragged.ncu-rep --page details --section SpeedOfLight --section WarpStateStats 2>&1 \
  | grep -E "sm90_|Duration|Compute \(SM\) Throughput|Stall|Warp Cycles Per Issued" | head -60
for k in 0 1 2 3; do
  /usr/local/cuda/bin/ncu -i $OUT/ragged.ncu-rep --page source --csv --print-source sass --launch-skip $k --launch-count 1 \
    > $OUT/ragged_source_$k.csv 2>&1
done
rm -f $OUT/ragged.ncu-rep
python - "$OUT" <<'PY'
import csv, sys
for k, name in enumerate(("document fwd", "document bwd", "ragged fwd", "ragged bwd")):
    rows = list(csv.reader(open(f"{sys.argv[1]}/ragged_source_{k}.csv")))
    head = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if head is None or not any(c.startswith("Warp Stall Sampling (All") for c in rows[head]):
        print(f"== {name}: no source table; the CSV begins:", *rows[:6], sep="\n")
        continue
    cols = rows[head]
    src = cols.index("Source")
    samp = [i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All")][0]
    body = [r for r in rows[head + 1:] if len(r) == len(cols)]
    total = sum(float(r[samp] or 0) for r in body)
    print(f"== {name}: {total:.0f} samples, {len(body)} instructions; the 25 with the most")
    for r in sorted(body, key=lambda r: -float(r[samp] or 0))[:25]:
        print(f"{float(r[samp] or 0):8.0f}  {r[0]:>6}  {r[src][:90]}")
PY
