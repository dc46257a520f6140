# Builds session 45's trees under .ab/t (carry [".ab/t"] with next_call.sh), from the repository root:
#   main = HEAD (session 42's kernels)
#   cand = main + the FP8 d64 192-row CTAs (../2026-12-06-s42/pending/i25_fp8_d64_three_consumers.patch:
#          whole suite passed twice on an H100) + the float32 backwards' -inf fix (pending/
#          i24_lse_pair_minus_inf.patch: host-tested, its GPU test not run)
#   sel  = cand + the float32 Hopper backward's exponentials without a branch each
#          (pending/i22_bwd_exp_select.patch: compiled, all-variants spill check passed, not run on a GPU)
set -e
R=$PWD; Q=$R/bench/runs/2026-12-06-s44/pending
rm -rf .ab/t && mkdir -p .ab/t/main
git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md setup.cfg | tar -x -C .ab/t/main
rm -rf .ab/t/main/bench/runs
cp -r .ab/t/main .ab/t/cand
(cd .ab/t/cand && patch -p1 -s < $R/bench/runs/2026-12-06-s42/pending/i25_fp8_d64_three_consumers.patch &&
 patch -p1 -s < $Q/i24_lse_pair_minus_inf.patch)
cp -r .ab/t/cand .ab/t/sel && (cd .ab/t/sel && patch -p1 -s < $Q/i22_bwd_exp_select.patch)
find .ab/t -name '*.orig' -delete
du -sh .ab/t; ls .ab/t
