# Builds session 45's trees under .ab/t (carry [".ab/t"] with next_call.sh), from the repository root:
#   main = HEAD    sel = main + the float32 Hopper backward's exponentials without a branch each
#   (pending/i22_bwd_exp_select.patch: compiled, all-variants spill check passed, not run on a GPU)
set -e
R=$PWD; Q=$R/bench/runs/2026-12-06-s44/pending
rm -rf .ab/t && mkdir -p .ab/t/main
git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md setup.cfg | tar -x -C .ab/t/main
rm -rf .ab/t/main/bench/runs
cp -r .ab/t/main .ab/t/sel && (cd .ab/t/sel && patch -p1 -s < $Q/i22_bwd_exp_select.patch)
find .ab/t -name '*.orig' -delete
du -sh .ab/t; ls .ab/t
