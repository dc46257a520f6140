# Issue 26: the paged walk's boxes found before the ring's waits (runs/2026-12-06-s47/pending/
# i26_paged_walk_ahead.patch, landed in session 49 on its GPU suite, before its A/B) against the walk
# before it: A = HEAD with the patch reversed, B = HEAD; runs/2026-12-06-s45/paged_order.py on each twice,
# A first (~150 s, either card, no carry). Prediction (bench/NOTES.md, session 47): pages of 128
# 575 -> 600-630 TFLOP/s on an H100 (dense 639), pages of 16 and 64 +2-5%. If B loses, revert the patch.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
R=$PWD
rm -rf /tmp/A /tmp/B && mkdir -p /tmp/B && git archive HEAD cupyflash kernels_cu bench tests setup.cfg | tar -x -C /tmp/B
cp -r /tmp/B /tmp/A && (cd /tmp/A && patch -p1 -s -R < $R/bench/runs/2026-12-06-s47/pending/i26_paged_walk_ahead.patch) || exit 1
find /tmp/A -name '*.orig' -delete
for round in 1 2; do
  for t in A B; do
    echo "== $t round $round at $(el) s"
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 120 python $R/bench/runs/2026-12-06-s45/paged_order.py 2>&1 | tail -6)
  done
done
echo "done at $(el) s"
