# Issue 24: the element bits in the Hopper backward's column fragments (runs/2026-12-06-s47/pending/
# i24_element_bits_bwd.patch; the forwards' bits and the shift landed in session 49): the mask tests on
# HEAD + the patch, then mods_ab.sh (A = HEAD, B = + the patch, three rounds). ~250 s, either card, no
# carry. Prediction (session 47): ragged backward ~318 -> ~350-380 TFLOP/s on the H200 if the added
# local accesses (bf16 d128 document-mask backward 2 -> 14) stay off the tile loop; document unchanged.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
P=bench/runs/2026-12-06-s47/pending/i24_element_bits_bwd.patch
rm -rf /tmp/EC && mkdir -p /tmp/EC && git archive HEAD | tar -x -C /tmp/EC
(cd /tmp/EC && patch -p1 -s < $P && find . -name '*.orig' -delete && \
 PYTHONPATH=/tmp/EC timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_mods.py 2>&1 | tail -4)
echo "tests at $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/mods_ab_bwd
OUT=$OUT/mods_ab_bwd timeout 300 bash bench/runs/2026-12-06-s47/mods_ab.sh $P 2>&1 | tee $OUT/mods_ab_bwd/log.txt | tail -30
echo "done at $(( $(date +%s) - t0 )) s"
