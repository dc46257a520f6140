# Session 51's first call (~180 s, H200 for the tables; either card for the A/B): issue 24's four pending
# patches on both document rows, three rounds, FlexAttention in T0's first round:
#   T1 = HEAD + runs/2026-12-06-s47/pending/i24_element_bits_bwd.patch (the backward's element bits;
#        session 50 on an H100: ragged bwd +7%),
#   T2 = T1 + runs/2026-12-06-s49/pending/i24_layout_whole_tiles.patch (the forwards skip the layout's byte
#        loads for whole tiles; H100: forward within noise),
#   T3 = T2 + runs/2026-12-06-s50/pending/i24_bwd_bits_fetched.patch (the backward's bits fetched around
#        its products, its layout reads skipped beside a mask_mod; H100: ragged bwd +3% over T2),
#   T4 = T3 + runs/2026-12-06-s50/pending/i24_fwd_mask_words.patch (the forward's partial tiles masked as
#        one word of bits a row: ~1,200 -> ~260 instructions a thread a tile; prediction: ragged fwd +10-25%).
# Then the landing call (runs/2026-12-06-s42/land_call.sh) on the working tree with those that gain.
export PYTHONUNBUFFERED=1
ROUNDS=3 PEERS=1 ROWS=ragged,document bash bench/runs/2026-12-06-s50/mods_chain.sh \
  bench/runs/2026-12-06-s47/pending/i24_element_bits_bwd.patch \
  bench/runs/2026-12-06-s49/pending/i24_layout_whole_tiles.patch \
  bench/runs/2026-12-06-s50/pending/i24_bwd_bits_fetched.patch \
  bench/runs/2026-12-06-s50/pending/i24_fwd_mask_words.patch 2>&1 | tee $OUT/log.txt | tail -50
