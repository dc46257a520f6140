# Issue 26, next session (any Hopper card, ~200 s): why the copied pages (pending/i26_paged_copies_shuffled.patch,
# session 55) ran pages of 16 at half the boxes' rate (H100: 236 against 456-473 TFLOP/s, session 56).
# A = HEAD (TMA boxes of 16 rows), C = HEAD + the patch. ncu of the main kernel: duration, warp stall
# reasons (where the producer's copying warps and the consumers wait), L1/LSU and L2 throughput, and the
# source counters of the hottest stalls. Hypotheses, each with what it predicts:
#  1. L1's outstanding-miss capacity: LDGSTS goes through L1 (TMA does not); 64 KB of K+V in flight a tile
#     would be latency-bound there -> lsu/l1tex throttle stalls on warps 2-3, L2 throughput ~half of A's.
#  2. The page-table load on the copy's critical path (PagedRows before the empty wait) -> long-scoreboard
#     stalls at the first shuffle of each tile.
#  3. The consumers' fence.proxy.async after each K/V wait -> stalls at the fence in consumer code.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
R=$PWD; D=$R/bench/runs/2026-12-07-s55/pending; S=$R/bench/runs/2026-12-07-s56
rm -rf /tmp/A /tmp/C && mkdir -p /tmp/A && git archive HEAD cupyflash kernels_cu bench tests setup.cfg README.md | tar -x -C /tmp/A
cp -r /tmp/A /tmp/C && (cd /tmp/C && git apply $D/i26_paged_copies_shuffled.patch) || exit 1
for t in A C; do
  echo "== $t"
  PYTHONPATH=/tmp/$t timeout 200 /usr/local/cuda/bin/ncu --clock-control none --profile-from-start off \
    -k regex:sm90_fwd --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SourceCounters --export $OUT/paged16_$t --force-overwrite python $S/paged16_source.py > $OUT/ncu_$t.txt 2>&1
  grep -E "Duration|L1/TEX Hit|L2 Cache Throughput|DRAM Throughput|Stall|Warp Cycles Per Issued|Memory Throughput" $OUT/ncu_$t.txt | head -30
done
