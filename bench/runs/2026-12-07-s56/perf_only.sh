# Session 56, the decision data only (any Hopper card; ten refused starts left ~400 s of device time, too
# little for the GPU suite). A = HEAD; B = HEAD + pending/i26_paged_copies.patch (each lane locates its own
# rows); C = this working tree = HEAD + pending/i26_paged_copies_shuffled.patch (each row located once, shared
# by shuffles) + pending/i25_fp8_slack.patch. paged_order.py on A, C, B (pages 16/64/128 against dense;
# 16 takes the copies), fp8.py d128 16k on A and C, then memcheck and racecheck of sanitize_kvcache.py on C,
# and a second paged_order round while L (default 300 s) allows.
# Predictions: pages of 16 0.71x -> 0.85-0.95x dense, C >= B, 64/128 and dense unchanged; FP8 +2-5%.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; L=${LIMIT:-300}; R=$PWD; CS=/usr/local/cuda/bin/compute-sanitizer
D=$R/bench/runs/2026-12-07-s55/pending
rm -rf /tmp/A /tmp/B && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
cp -r /tmp/A /tmp/B && (cd /tmp/B && git apply $D/i26_paged_copies.patch) || exit 1
po() { echo "== $1 paged_order at $(el) s"; (cd $1 && PYTHONPATH=$1 timeout 80 python $R/bench/runs/2026-12-06-s45/paged_order.py 2>&1 | tail -5); }
fp() { echo "== $1 fp8 at $(el) s"; (cd $1 && PYTHONPATH=$1 timeout 60 python bench/fp8.py --headdims 128 --seqlens 16384 --repeats 10 2>&1 | tail -2); }
po /tmp/A; po $R; po /tmp/B
fp /tmp/A; fp $R
echo "C kvcache memcheck: $(PYTHONPATH=$R timeout 40 $CS --tool memcheck python tests/sanitize_kvcache.py 2>&1 | tail -1)"
echo "C kvcache racecheck: $(PYTHONPATH=$R timeout 40 $CS --tool racecheck python tests/sanitize_kvcache.py 2>&1 | grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' | tail -1)"
for t in /tmp/A $R /tmp/B; do [ $(( L - $(el) )) -gt 25 ] && po $t; done
echo "done at $(el) s"
