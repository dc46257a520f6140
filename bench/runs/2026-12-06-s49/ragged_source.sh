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
python $S/ncu_top.py "$OUT" ragged_source "document fwd" "document bwd" "ragged fwd" "ragged bwd"
