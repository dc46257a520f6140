# Issue 26, after session 47's ncu (runs/2026-12-06-s47/out/paged_ncu.txt: the 128-key pages in order
# ran 427 us against the dense cache's 400, with +2,100 "barrier" stall samples of +4,434): which
# instructions take those samples, and what pages of 16 (440 TFLOP/s against 639) add. ncu keeps the three
# sm90_fwd launches of paged_source.py (dense, pages of 128, pages of 16) in a report, then prints each
# one's SASS with the sampled stalls per instruction (CSV) and the lines with the most samples.
# ~120 s, either card, no carry. Add a patch as $1 to profile a copy of HEAD with it instead.
S=$PWD/bench/runs/2026-12-06-s47
T=$PWD
if [ -n "$1" ]; then
  rm -rf /tmp/P && mkdir -p /tmp/P && git archive HEAD cupyflash kernels_cu | tar -x -C /tmp/P
  (cd /tmp/P && patch -p1 -s < $T/$1) || exit 1
  T=/tmp/P
fi
PYTHONPATH=$T timeout 300 /usr/local/cuda/bin/ncu --clock-control none --section SourceCounters --section WarpStateStats \
  --import-source no -k regex:'^sm90_fwd$' -c 3 -o $OUT/paged -f python $S/paged_source.py > $OUT/paged_source_run.txt 2>&1
for k in 0 1 2; do
  /usr/local/cuda/bin/ncu -i $OUT/paged.ncu-rep --page source --csv --print-source sass --launch-skip $k --launch-count 1 \
    > $OUT/paged_source_$k.csv 2>&1
done
rm -f $OUT/paged.ncu-rep
python $PWD/bench/runs/2026-12-06-s49/ncu_top.py "$OUT" paged_source dense "pages of 128" "pages of 16"
