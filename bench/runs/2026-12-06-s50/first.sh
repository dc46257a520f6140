# Session 50's first call (~500 s, either card, no carry): issue 24's four pending patches.
# (1) mods_chain.sh: T1 = HEAD + the backward's element bits (runs/2026-12-06-s47/pending/
#     i24_element_bits_bwd.patch; prediction ragged bwd 318 -> 350-380), T2 = T1 + the forwards' layout
#     reads skipped for whole tiles (runs/2026-12-06-s49/pending/i24_layout_whole_tiles.patch; ragged fwd
#     361 -> 380-415), T3 = T2 + the forward's bits fetched around the products (runs/2026-12-06-s50/
#     pending/i24_fwd_bits_ahead.patch; ragged fwd +5-12% over T2), T4 = T3 + the same in the Hopper
#     backward, with its layout reads skipped for whole tiles beside a mask_mod (runs/2026-12-06-s50/
#     pending/i24_bwd_bits_ahead.patch; ragged bwd +5-10% over T1). Document rows unchanged by all four.
# (2) test_gpu_mods.py on HEAD + all four, in the time left (the landing call's suite runs them too).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
P1=bench/runs/2026-12-06-s47/pending/i24_element_bits_bwd.patch
P2=bench/runs/2026-12-06-s49/pending/i24_layout_whole_tiles.patch
P3=bench/runs/2026-12-06-s50/pending/i24_fwd_bits_ahead.patch
P4=bench/runs/2026-12-06-s50/pending/i24_bwd_bits_ahead.patch
mkdir -p $OUT/chain
OUT=$OUT/chain timeout 430 bash bench/runs/2026-12-06-s50/mods_chain.sh $P1 $P2 $P3 $P4 2>&1 \
  | tee $OUT/chain/log.txt | tail -40
rm -rf /tmp/EC && mkdir -p /tmp/EC && git archive HEAD | tar -x -C /tmp/EC
(cd /tmp/EC && for p in $P1 $P2 $P3 $P4; do patch -p1 -s < $OLDPWD/$p || exit 1; done && find . -name '*.orig' -delete && \
 PYTHONPATH=/tmp/EC timeout $(( 585 - ($(date +%s) - t0) )) python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_gpu_mods.py 2>&1 | tail -4)
echo "tests at $(( $(date +%s) - t0 )) s"
echo "done at $(( $(date +%s) - t0 )) s"
