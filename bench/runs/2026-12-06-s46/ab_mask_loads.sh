# Session 47's A/B of pending/i24_mask_loads.patch (~560 s, either card; no carry), run on landed main (the
# device's working tree is L; M = L + the patch in /tmp/M). The patch: a mask_mod's loads unpredicated
# (common/user_mod.cuh's user_mask_load) and its loop over a fragment's positions unrolled 4 times
# (UserMaskAt::bits), an empty buffer's zero (common.py's mod_buffers), and bench/mods.py's `ragged` row
# (the document row's boundaries moved inside blocks: 12.8% of its causal 128 x 128 blocks partial, where
# the kernels evaluate the function). Prediction: ragged forward and backward +3-8% (the partial tiles'
# mask loop waited out 32 load latencies a forward tile, 8 now), document unchanged (no partial blocks),
# relbias unchanged (a score_mod: its loads stay predicated).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
L=$PWD; rm -rf /tmp/M && mkdir -p /tmp/M
git archive HEAD cupyflash kernels_cu bench tests README.md setup.cfg | tar -x -C /tmp/M
(cd /tmp/M && patch -p1 -s < $L/bench/runs/2026-12-06-s46/pending/i24_mask_loads.patch) || exit 1
cd /tmp/M && PYTHONPATH=/tmp/M timeout 240 python -m pytest -q -n 16 -p no:cacheprovider -m gpu tests/test_gpu_mods.py \
  > $OUT/m_tests.txt 2>&1; echo "M test_gpu_mods rc=$? at $(el) s"; tail -1 $OUT/m_tests.txt; grep FAILED $OUT/m_tests.txt | head
ROWS=ragged,document,relbias
cd $L && PYTHONPATH=$L timeout 200 python /tmp/M/bench/mods.py --rows $ROWS --out $OUT/L 2>&1 | tail -14 | tee $OUT/mods_L.txt
echo "L at $(el) s"
cd /tmp/M && PYTHONPATH=/tmp/M timeout 120 python bench/mods.py --rows $ROWS --no-peers --out $OUT/M 2>&1 | tail -10 | tee $OUT/mods_M.txt
echo "M at $(el) s"
left=$(( 580 - $(el) ))
[ $left -gt 60 ] && (cd /tmp/M && PYTHONPATH=/tmp/M timeout $left /usr/local/cuda/bin/compute-sanitizer --tool memcheck \
  python tests/sanitize_attention.py sm90:bfloat16 2>&1 | tail -2)
echo "done at $(el) s"
