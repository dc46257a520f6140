# Builds session 44's trees under .ab/t (carry [".ab/t"] with next_call.sh and next_call2.sh), from the
# repository root:
#   main = HEAD    ck = main + the float32 forward that splits k and v once a key tile (claimed keys)
#   m192 = main + the FP8 forward's 192-row d64 CTAs (session 42's patch; passed the whole suite on an
#          H100 in session 43, back to a patch until an H200 runs it)
set -e
R=$PWD; Q=$R/bench/runs/2026-12-06-s43/pending
rm -rf .ab/t && mkdir -p .ab/t/main
git archive HEAD cupyflash kernels_cu bench tests tools README.md ARCHITECTURE.md | tar -x -C .ab/t/main
rm -rf .ab/t/main/bench/runs
cp -r .ab/t/main .ab/t/ck && (cd .ab/t/ck && patch -p1 -s < $Q/i22_fwd_claimed_keys.patch)
cp -r .ab/t/main .ab/t/m192 && (cd .ab/t/m192 && patch -p1 -s < $R/bench/runs/2026-12-06-s42/pending/i25_fp8_d64_three_consumers.patch)
find .ab/t -name '*.orig' -delete
du -sh .ab/t; ls .ab/t
