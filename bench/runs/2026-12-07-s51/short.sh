# Session 51's short call (~160 s, either card, for a budget under 300 s): the chain of issue 24's five
# pending patches on both document rows (two rounds, no peers), then passes.sh.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
ROUNDS=2 PEERS=0 ROWS=ragged,document timeout 150 bash bench/runs/2026-12-06-s50/mods_chain.sh \
  bench/runs/2026-12-06-s47/pending/i24_element_bits_bwd.patch bench/runs/2026-12-06-s49/pending/i24_layout_whole_tiles.patch \
  bench/runs/2026-12-06-s50/pending/i24_bwd_bits_fetched.patch bench/runs/2026-12-06-s50/pending/i24_fwd_mask_words.patch \
  bench/runs/2026-12-07-s51/pending/i24_bwd_mask_words.patch 2>&1 | tail -30
echo "chain at $(( $(date +%s) - t0 )) s"
timeout 60 bash bench/runs/2026-12-07-s51/passes.sh
echo "done at $(( $(date +%s) - t0 )) s"
