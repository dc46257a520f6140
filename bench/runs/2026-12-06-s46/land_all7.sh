# Session 47's first call (~560 s, either card; no carry): ../2026-12-06-s45/land_all.sh's five patches plus
# session 46's two (the mask_mod loads, issue 24; the float32 forward's Q prefetch, issue 22), applied to
# the device's copy, the tree's hash, then the landing call (../2026-12-06-s42/land_call.sh: precompile,
# the whole GPU suite, memcheck of the KV-cache kernels and of every sm90 kernel). One suite for all seven
# saves a session's second landing call; on a failure, the failing tests name the patch (the mask loads:
# test_gpu_mods.py; the Q prefetch: float32 forwards; the others: session 45's list). On an H200 pass the
# five land at once and the two after their A/B (ab_call.sh) shows they gain; on an H100 it is evidence.
# Here (session 46) the seven give `tree hash: 7517cd6ad138dadf`.
set -e
for p in bench/runs/2026-12-06-s42/pending/i25_fp8_d64_three_consumers.patch \
         bench/runs/2026-12-06-s44/pending/i24_lse_pair_minus_inf.patch \
         bench/runs/2026-12-06-s45/pending/readme_m192_minus_inf.patch \
         bench/runs/2026-12-06-s44/pending/i22_bwd_exp_select.patch \
         bench/runs/2026-12-06-s45/pending/i24_bwd_key_order.patch \
         bench/runs/2026-12-06-s46/pending/i24_mask_loads.patch \
         bench/runs/2026-12-06-s46/pending/i22_fwd_q_prefetch_tensor.patch; do
  patch -p1 -s < $p
done
find . -name '*.orig' -not -path './.ab/*' -delete
echo "tree hash: $(git ls-files -co --exclude-standard cupyflash kernels_cu tests README.md | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
set +e
bash bench/runs/2026-12-06-s42/land_call.sh
