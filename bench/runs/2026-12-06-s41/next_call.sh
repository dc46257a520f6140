# Session 42's first call (~520 s, any Hopper card): the Hopper forwards with the rotated loop (session
# 41's SASS finding: ptxas put the wait for O += P V before the exponentials, so no warpgroup's softmax
# overlapped its own second product), and the decode kernel with the swizzle on the global side.
# Build first, on the CPU (carry [".ab/t"], kind nvidia-h200):
#   rm -rf .ab/t && mkdir -p .ab/t/main .ab/t/rot && git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md | tar -x -C .ab/t/main
#   rm -rf .ab/t/main/bench/runs && cp -r .ab/t/main/. .ab/t/rot && P=../../../bench/runs/2026-12-06-s41/pending
#   (cd .ab/t/rot && patch -p1 -s < $P/fwd_kmajor_rotated_loop.patch && patch -p1 -s < $P/fwd16_rotated_loop.patch)
#   and `both` / `isw` as in runs/2026-12-06-s40/next_call.sh's header and runs/2026-12-06-s41/call5.sh
#   (isw = both + pending/i26_decode_swizzle_global_side.patch).
# (fwd_kmajor: the FP8 and tf32 loops, spills unchanged; fwd16: the 16-bit loop, 4-68 more spill bytes in
# some variants, over test_compile's ceilings for d128 score_mod, d192 and d256: land only if it wins.)
# Predictions: FP8 d64/d128 16k non-causal +10-25% (H100 859 -> 950-1,070 TFLOP/s at d128; the softmax is
# ~half of each tile's 2,175 cycles and now overlaps the 256-cycle P V), d256 unchanged (not rotated);
# bf16 forward rows d128-d256 +0-8% (their products already hide most of the softmax), d64 unchanged
# (three consumers: not rotated); no row slower by more than 2%. isw: LDGSTS wavefronts 4 per
# instruction (from 10.5) and 16.8M L2 sectors (from 25.2M), the decode rows at or under cuDNN's time.
export PYTHONUNBUFFERED=1
R=$PWD; S=$R/bench/runs/2026-12-06-s41
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
for t in main rot rot main; do
  echo "== fp8 $t ($(( $(date +%s) - t0 )) s)"
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 120 python bench/fp8.py --headdims 64,128,256 --seqlens 4096,16384 2>&1 | grep -E "^ +[0-9]" | tee -a $OUT/fp8_$t.txt)
done
timeout 240 python bench/ab.py --old .ab/t/main --new .ab/t/rot --rows 'fwd_*' --rounds 2 --cache $R/.ab/cache \
  --json $OUT/ab_fwd.json > $OUT/ab_fwd.txt 2>&1; echo "ab rc=$? at $(( $(date +%s) - t0 )) s"; tail -25 $OUT/ab_fwd.txt
bash $S/call5.sh 2>&1 | tail -8
echo "done at $(( $(date +%s) - t0 )) s"
