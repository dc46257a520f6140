# Session 52 (~250 s, either card, no carry): the Hopper backward's tail_pairs under a block mask (the
# pairs that take their key tiles in turn at the grid's end) at 3 (today's rule at 16 heads x 128 key
# tiles), 6, 8 and 16 (every pair), on bench/mods.py's document and ragged rows, two rounds; then the
# whole bench/mods.py table with FlexAttention on HEAD. Prediction (bench/NOTES.md, session 52): ragged
# backward -11% kernel time at 6-8, document unchanged.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
TAIL=0 timeout 120 python bench/runs/2026-12-07-s52/tail_run.py --rows ragged,document --no-peers --quick --repeats 1 --warmup 0 --out /tmp/warm > /dev/null 2>&1
echo "warm at $(( $(date +%s) - t0 )) s"
for round in 1 2; do
  for tail in 0 6 8 16; do
    echo "== tail $tail round $round"
    TAIL=$tail timeout 100 python bench/runs/2026-12-07-s52/tail_run.py --rows ragged,document --no-peers \
      --out $OUT/tail_${tail}_$round 2>&1 | grep -E '^(row|document|ragged) '
  done
done
echo "A/B at $(( $(date +%s) - t0 )) s"
timeout $(( 560 - $(date +%s) + t0 )) python bench/mods.py --out $OUT/mods_full 2>&1 | tail -25
echo "done at $(( $(date +%s) - t0 )) s"
