# Builds the dropout A/B trees for the next session's device call (bench/runs/2026-12-05-s31/next_calls.sh.txt):
# .ab/t/main (main as committed), .ab/t/early (+ early_dropout_draws.patch), .ab/t/drawn (+ drawn_dropout_masks.patch),
# each only what bench/training.py needs (cupyflash, kernels_cu, bench/*.py). Run from the repository root; pass
# the three paths to run's carry.
set -e
rm -rf .ab/t && mkdir -p .ab/t
for t in main early drawn; do
    mkdir -p .ab/t/$t
    git archive HEAD cupyflash kernels_cu bench/harness.py bench/training.py | tar -x -C .ab/t/$t
done
for t in early drawn; do
    patch=bench/runs/2026-12-05-s31/pending/$([ $t = early ] && echo early_dropout_draws || echo drawn_dropout_masks).patch
    git apply --include=".ab/t/$t/kernels_cu/*" --include=".ab/t/$t/cupyflash/*" --directory=.ab/t/$t "$patch"
done
du -sh .ab/t/*
