# Session 50's first call (~420 s, either card, no carry): issue 24's two pending patches on the ragged row.
# (1) bwd_bits.sh: the element bits in the Hopper backward (runs/2026-12-06-s47/pending/
#     i24_element_bits_bwd.patch): test_gpu_mods.py on HEAD + it, then mods_ab.sh (A = HEAD, B = + it).
# (2) mods_ab.sh with pending/i24_layout_whole_tiles.patch (the forwards skip the block layout's byte
#     loads where every tile lies inside one block). Prediction: ragged forward 361 -> 380-400 TFLOP/s on
#     the H200, document rows and backwards unchanged.
# Both gain: land them together (land_call.sh on HEAD + both: they apply together and pass test_compile).
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
timeout 280 bash bench/runs/2026-12-06-s49/bwd_bits.sh 2>&1 | grep -v '^\.*$' | tail -32
mkdir -p $OUT/layout_ab
OUT=$OUT/layout_ab timeout 200 bash bench/runs/2026-12-06-s47/mods_ab.sh bench/runs/2026-12-06-s49/pending/i24_layout_whole_tiles.patch \
  2>&1 | tee $OUT/layout_ab/log.txt | tail -30
echo "done at $(( $(date +%s) - t0 )) s"
