# Builds session 43's trees under .ab/t (carry [".ab/t"] with the calls), from the repository root:
#   main = HEAD    x32 = main + the decode tiles' sector swizzle    nt = main + the FP8 loop without turns
#   m192 = main + three consumer warpgroups for FP8 at d64    m192nt = m192 + nt (FlashAttention-3's FP8 d64)
#   dp / dpw = main + the decode tiles stored sector-major (pairs / pairs with swapped halves)
#   flat = main + plain unpadded decode tiles (copies in lane order; ldmatrix 8-way conflicts)
set -e
R=$PWD; Q=$R/bench/runs/2026-12-06-s42/pending
rm -rf .ab/t && mkdir -p .ab/t/main
git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md | tar -x -C .ab/t/main
rm -rf .ab/t/main/bench/runs
tree() { cp -r .ab/t/$1 .ab/t/$2; T=$2; shift 2; (cd .ab/t/$T && for f in "$@"; do patch -p1 -s < $f; done); }
tree main x32 $Q/i26_decode_sector_swizzle.patch
tree main nt $Q/i25_fp8_no_turns.patch
tree main m192 $Q/i25_fp8_d64_three_consumers.patch
tree m192 m192nt $Q/i25_fp8_no_turns.patch
tree main dp $Q/i26_decode_pairs.patch
tree main dpw $Q/i26_decode_pairs_swapped.patch
tree main flat $Q/i26_decode_flat.patch
find .ab/t -name '*.orig' -delete
du -sh .ab/t; ls .ab/t
