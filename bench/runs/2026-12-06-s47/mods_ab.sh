# Issue 24: an A/B of a pending patch on bench/mods.py's rows (~150 s, either card, no carry):
#   bash bench/runs/2026-12-06-s47/mods_ab.sh PATCH [ROWS]
# A = HEAD plus the landing patches not yet on it (the five and the mask loads, while they are pending),
# B = A + PATCH; three rounds of each, alternating, without peers (mods.py's first round of A with
# FlexAttention). ROWS defaults to ragged,document.
# Session 47's PATCH: runs/2026-12-06-s47/pending/i24_mask_bits_shift.patch (the forward's mask_mod bits
# shifted in at the bottom: its partial tiles' mask loop 124 -> 96 instructions an iteration of 8
# positions). Prediction: ragged forward +4-7%, ragged backward and document unchanged.
export PYTHONUNBUFFERED=1
patch_b=${1:?a patch}; rows=${2:-ragged,document}
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
R=$PWD
rm -rf /tmp/MA /tmp/MB && mkdir -p /tmp/MA && git archive HEAD cupyflash kernels_cu bench tests README.md setup.cfg | tar -x -C /tmp/MA
if [ ! -f /tmp/MA/kernels_cu/sm90/bwd_key_order.cu ]; then
  for p in 2026-12-06-s42/pending/i25_fp8_d64_three_consumers 2026-12-06-s44/pending/i24_lse_pair_minus_inf \
           2026-12-06-s45/pending/readme_m192_minus_inf 2026-12-06-s44/pending/i22_bwd_exp_select \
           2026-12-06-s45/pending/i24_bwd_key_order 2026-12-06-s46/pending/i24_mask_loads; do
    (cd /tmp/MA && patch -p1 -s < $R/bench/runs/$p.patch) || exit 1
  done
fi
cp -r /tmp/MA /tmp/MB && (cd /tmp/MB && patch -p1 -s < $R/$patch_b) || exit 1
find /tmp/MA /tmp/MB -name '*.orig' -delete
for round in 1 2 3; do
  for t in MA MB; do
    peers=--no-peers; [ $round = 1 ] && [ $t = MA ] && peers=
    echo "== $t round $round"
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 200 python bench/mods.py --rows $rows $peers --out $OUT/mods_${t}_$round 2>&1 \
      | grep -E '^(row|document|ragged|relbias|softcap|alibi) ')
  done
done
echo "done at $(el) s"
