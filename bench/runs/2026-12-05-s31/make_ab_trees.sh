# Builds the A/B trees for the next session's device calls (bench/runs/2026-12-05-s31/next_calls.sh.txt), each
# what bench/training.py and bench/bench.py need (cupyflash, kernels_cu, bench/*.py), under .ab/t/:
#   main   main as committed
#   early  + pending/early_dropout_draws.patch        drawn   + pending/drawn_dropout_masks.patch
#   red    + pending/i22_bwd_planes_reduce_from_registers.patch
#   redkv  + that and pending/i22_bwd_planes_split_keys.patch
# Run from the repository root; pass ".ab/t" to run's carry (about 10 MB).
set -e
pending=bench/runs/2026-12-05-s31/pending
rm -rf .ab/t && mkdir -p .ab/t
for t in main early drawn red redkv; do
    mkdir -p .ab/t/$t
    git archive HEAD cupyflash kernels_cu bench/*.py | tar -x -C .ab/t/$t
done
apply() {  # tree, patch
    git apply --include=".ab/t/$1/kernels_cu/*" --include=".ab/t/$1/cupyflash/*" --directory=.ab/t/$1 "$pending/$2.patch"
}
apply early early_dropout_draws
apply drawn drawn_dropout_masks
apply red i22_bwd_planes_reduce_from_registers
apply redkv i22_bwd_planes_reduce_from_registers
apply redkv i22_bwd_planes_split_keys
du -sh .ab/t
