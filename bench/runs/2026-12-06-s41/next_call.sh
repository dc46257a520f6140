# Session 42's first call (~450 s, any Hopper card): the FP8 forward with the rotated loop (session
# 41's SASS finding: ptxas put the wait for O += P V before the exponentials, so no warpgroup's softmax
# overlapped its own second product) and with 192-key tiles, and the decode candidates (call5.sh).
# next_call_ab.sh then times the 16-bit forwards' rotated loop (bench/ab.py).
# Build first, on the CPU: `bash bench/runs/2026-12-06-s41/build_trees.sh` (main, rot, r192, both, isw,
# blk, p32, all under .ab/t; 29 MB), then run with carry [".ab/t"], kind nvidia-h200.
# (fwd_kmajor: the FP8 and tf32 loops, spills unchanged; fwd16: the 16-bit loop, 4-68 more spill bytes in
# some variants, over test_compile's ceilings for d128 score_mod, d192 and d256: land only if it wins.)
# Predictions: FP8 d64/d128 16k non-causal +10-25% (H100 859 -> 950-1,070 TFLOP/s at d128; the softmax is
# ~half of each tile's 2,175 cycles and now overlaps the 256-cycle P V), d256 unchanged (not rotated);
# r192 (the rotated loop with 192-key tiles at d128 and 64-key ones at d256, 64-byte V^T atoms; d256 then
# rotated too): +5-10% on rot's d128 rows, +10-20% on its d256 rows;
# bf16 forward rows d128-d256 +0-8% (their products already hide most of the softmax), d64 unchanged
# (three consumers: not rotated); no row slower by more than 2%. isw: LDGSTS wavefronts 4 per
# instruction (from 10.5) and 16.8M L2 sectors (from 25.2M), the decode rows at or under cuDNN's time;
# blk: no LDGSTS at all, 16.8M sectors, rows at or under cuDNN's (its per-lane bulk copies are a 32-pass
# ELECT loop in the SASS, ~320 issue slots per warp and tile, ~13% of a tile's ~2,500 cycles); p32: if the
# LSU splits a copy where a global sector straddles shared sectors (swz's odd-XOR rows and the 272-byte
# rows both do), 16 sectors per copy and the rows at cuDNN's time.
export PYTHONUNBUFFERED=1
R=$PWD; S=$R/bench/runs/2026-12-06-s41
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
for t in main rot rot main; do
  echo "== fp8 $t ($(( $(date +%s) - t0 )) s)"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 120 python bench/fp8.py --headdims 64,128,256 --seqlens 16384 2>&1 | grep -E "^ +[0-9]" | tee -a $OUT/fp8_$t.txt)
done
for t in r192 rot r192; do
  echo "== fp8 d128/d256 $t ($(( $(date +%s) - t0 )) s)"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 100 python bench/fp8.py --headdims 128,256 --seqlens 4096,16384 2>&1 | grep -E "^ +[0-9]" | tee -a $OUT/fp8_$t.txt)
done
(cd .ab/t/r192 && PYTHONPATH=$PWD timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -2)
bash $S/call5.sh 2>&1 | tail -24
echo "done at $(( $(date +%s) - t0 )) s"
