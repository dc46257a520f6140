# The landing call with the pending patches (~560 s, either card; no carry): applies to the device's copy of the working tree
# (a clean checkout of main) the pending patches, prints a hash of the code they make, then runs the
# landing call (../2026-12-06-s42/land_call.sh: precompile, the whole GPU suite, memcheck). Locally, the
# same `for p in ...; do patch -p1 < $p; done` and the same hash line give the tree a pass lands.
#   m192  FP8 forward at head dim 64 in 192-row CTAs (issue 25)
#   -inf  float32 backwards: a score of -inf gives P = 0, not NaN (issue 24)
#   their README lines (pending/readme_m192_minus_inf.patch; m192's figures are the H100's of session 43)
#   sel   float32 Hopper backward's exponentials without a branch each (issue 22)
#   ord   the Hopper backward's key tiles longest walk first under a block mask (issue 24)
# Arguments: more patches, applied after these. Session 48's first call:
#   bash bench/runs/2026-12-06-s45/land_all.sh bench/runs/2026-12-06-s46/pending/i24_mask_loads.patch \
#        bench/runs/2026-12-06-s47/pending/i26_paged_walk_ahead.patch
# prints `tree hash: f80299d9804421db` (with the mask loads alone `5188557ed67f8182`, which passed on an
# H100 in session 47; the five alone `9fc88cff7312c4cb`).
set -e
for p in bench/runs/2026-12-06-s42/pending/i25_fp8_d64_three_consumers.patch \
         bench/runs/2026-12-06-s44/pending/i24_lse_pair_minus_inf.patch \
         bench/runs/2026-12-06-s45/pending/readme_m192_minus_inf.patch \
         bench/runs/2026-12-06-s44/pending/i22_bwd_exp_select.patch \
         bench/runs/2026-12-06-s45/pending/i24_bwd_key_order.patch "$@"; do
  patch -p1 -s < $p
done
find . -name '*.orig' -not -path './.ab/*' -delete
# (Every file of the tree, not `git ls-files -m`'s list, which on the device's copy also names files whose
# stat changed: session 46's calls printed other hashes of the same code.)
echo "tree hash: $(git ls-files -co --exclude-standard cupyflash kernels_cu tests README.md | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
set +e
bash bench/runs/2026-12-06-s42/land_call.sh
