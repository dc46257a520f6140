# Builds session 42's trees under .ab/t (carry [".ab/t"] with the calls), from the repository root:
#   main  = HEAD                      rot  = main + the rotated loops (K-major and 16-bit)
#   r192  = main + the K-major rotation + the FP8 tiles (192 keys at d128, 64 at d256)
#   both  = main + MLA v2 + per-warp decode (s39) + the forced family's FP8 error (s40)
#   isw / blk / p32 = both + one decode candidate each (s41)
#   all   = both + the K-major rotation + the FP8 tiles (+ whatever next_call.sh showed winning: add it here)
set -e
R=$PWD; P=$R/bench/runs; Q=$P/2026-12-06-s41/pending
rm -rf .ab/t && mkdir -p .ab/t/main
git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md | tar -x -C .ab/t/main
rm -rf .ab/t/main/bench/runs
tree() { cp -r .ab/t/$1 .ab/t/$2; shift 2; (cd .ab/t/$T && for f in "$@"; do patch -p1 -s < $f; done); }
T=rot; tree main rot $Q/fwd_kmajor_rotated_loop.patch $Q/fwd16_rotated_loop.patch
T=r192; tree main r192 $Q/fwd_kmajor_rotated_loop.patch $Q/i25_fp8_tiles.patch
T=both; tree main both $P/2026-12-06-s39/pending/i26_mla_sm90_v2.patch $P/2026-12-06-s39/pending/i25_decode_per_warp.patch \
  $P/2026-12-06-s40/pending/forced_family_fp8_error.patch
T=isw; tree both isw $Q/i26_decode_swizzle_global_side.patch
T=blk; tree both blk $Q/i26_decode_bulk_rows.patch
T=p32; tree both p32 $Q/i26_decode_pad32.patch
T=all; tree both all $Q/fwd_kmajor_rotated_loop.patch $Q/i25_fp8_tiles.patch
find .ab/t -name '*.orig' -delete
du -sh .ab/t; ls .ab/t
