# Builds the trees under .ab/t that callP.sh and call3.sh read (carry [".ab/t"]), from the repository root:
# main, cand (main + FP8 d64 192-row CTAs + the float32 -inf fix), sel (cand + the float32 backward's
# branch-free exponentials) from ../2026-12-06-s44/build_trees.sh; then qpf (main + pending/
# i22_fwd_q_prefetch.patch) and ord (main + pending/i24_bwd_key_order.patch).
set -e
bash bench/runs/2026-12-06-s44/build_trees.sh
Q=$PWD/bench/runs/2026-12-06-s45/pending
for t in qpf:i22_fwd_q_prefetch ord:i24_bwd_key_order; do
  rm -rf .ab/t/${t%%:*} && cp -r .ab/t/main .ab/t/${t%%:*}
  (cd .ab/t/${t%%:*} && patch -p1 -s < $Q/${t##*:}.patch)
done
find .ab/t -name '*.orig' -delete
du -sh .ab/t; ls .ab/t
