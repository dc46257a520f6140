# Session 48's first call (either card, no carry): on an H200 the landing call of the seven-patch tree
# (`tree hash: f80299d9804421db`); on an H100, whose pass cannot land, persistent_ab.sh (the persistent
# backward's tests and A/B) in its place.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $card"
case "$card" in
  *H200*) bash bench/runs/2026-12-06-s45/land_all.sh bench/runs/2026-12-06-s46/pending/i24_mask_loads.patch \
               bench/runs/2026-12-06-s47/pending/i26_paged_walk_ahead.patch 2>&1 | tail -40 ;;
  *) bash bench/runs/2026-12-06-s48/persistent_ab.sh 2>&1 | tail -80 ;;
esac
