# Issue 26: the paged walk's boxes found before the ring's waits (pending/i26_paged_walk_ahead.patch)
# against the walk on HEAD, ~200 s on either card, no carry: the paged-prefill tests on a copy of HEAD with
# the patch (B), then runs/2026-12-06-s45/paged_order.py on HEAD (A) and on B, each twice, A first.
# Prediction (bench/NOTES.md, session 47): pages of 128 575 -> 600-630 TFLOP/s on an H100 (dense 639),
# pages of 16 and 64 +2-5% (their loss is mostly the TMA issues of their boxes, which stay).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
R=$PWD
rm -rf /tmp/A /tmp/B && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg | tar -x -C /tmp/A
cp -r /tmp/A /tmp/B && (cd /tmp/B && patch -p1 -s < $R/bench/runs/2026-12-06-s47/pending/i26_paged_walk_ahead.patch) || exit 1
(cd /tmp/B && PYTHONPATH=/tmp/B timeout 150 python -m pytest -q -x -m gpu -p no:cacheprovider tests/test_kvcache.py \
  tests/test_gpu_features.py tests/test_dispatch.py -k "paged or prefill" 2>&1 | tail -3)
echo "tests at $(el) s"
for round in 1 2; do
  for t in A B; do
    echo "== $t round $round"
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 120 python $R/bench/runs/2026-12-06-s45/paged_order.py 2>&1 | tail -6)
  done
done
echo "done at $(el) s"
