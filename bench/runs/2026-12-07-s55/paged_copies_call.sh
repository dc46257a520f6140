# Issue 26, next session (any Hopper card, ~480 s): session 55's copied pages. A = HEAD; B = HEAD +
# pending/i26_paged_copies.patch (pages whose TMA boxes would be <= 32 rows, head dims <= 128 and multiples
# of 8, copied by producer warps 2-3 with cp.async; each lane locates its own rows); C = HEAD +
# pending/i26_paged_copies_shuffled.patch (the same, each row located once by one of its 8 lanes and shared
# by shuffles, for K and V). B's and C's paged GPU tests, memcheck and racecheck of tests/sanitize_kvcache.py
# (its sm90 paged prefill at pages of 16 takes the copies, with a bad page), then the A/B/C of
# paged_order.py (pages 16, 64, 128 against dense; 16 is the copies' row) twice each, interleaved, and
# bench/ab.py's forward rows A against the better copy tree (the producer's code moved for every 16-bit
# forward). Prediction: pages of 16 0.71x -> 0.85-0.95x dense, C >= B; pages of 64/128 and dense unchanged.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
R=$PWD; D=$R/bench/runs/2026-12-07-s55/pending
rm -rf /tmp/A /tmp/B /tmp/C && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
cp -r /tmp/A /tmp/B && (cd /tmp/B && git apply $D/i26_paged_copies.patch) || exit 1
cp -r /tmp/A /tmp/C && (cd /tmp/C && git apply $D/i26_paged_copies_shuffled.patch) || exit 1
for t in B C; do
  (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 150 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_kvcache.py \
     tests/test_gpu_features.py -k "paged or page or prefill" > $OUT/tests_$t.txt 2>&1
   echo "$t tests rc=$? at $(el) s"; tail -1 $OUT/tests_$t.txt; grep -E "FAILED|ERROR " $OUT/tests_$t.txt | cut -c1-200 | head -5
   PYTHONPATH=/tmp/$t timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1
   PYTHONPATH=/tmp/$t timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool racecheck python tests/sanitize_kvcache.py 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY" | tail -1)
done
echo "tests and sanitizers at $(el) s"
for round in 1 2; do for t in A B C; do
  echo "== $t round $round at $(el) s"
  (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 90 python $R/bench/runs/2026-12-06-s45/paged_order.py 2>&1 | tail -5)
done; done
cd $R
[ $(( 560 - $(el) )) -gt 90 ] && timeout $(( 560 - $(el) )) python bench/ab.py --old /tmp/A --new /tmp/${BEST:-C} --rounds 2 \
  --rows 'fwd_d64,fwd_d128,fwd_d128_causal,fwd_gqa,prefill_512_32k,decode_b8_32k_paged16' 2>&1 | tail -12
echo "done at $(el) s"
