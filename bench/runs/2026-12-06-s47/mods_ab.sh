# Issue 24: an A/B of pending patches on bench/mods.py's rows (~150 s, either card, no carry):
#   bash bench/runs/2026-12-06-s47/mods_ab.sh PATCH... (ROWS=ragged,document by default; set ROWS to change)
# A = HEAD plus the landing patches not yet on it (the five and the mask loads, while they are pending),
# B = A + the PATCHes in order (BASE="P1 P2 ...": patches applied to both first); three rounds of each,
# alternating, without peers (mods.py's first round of A with FlexAttention).
# Session 47's patches: runs/2026-12-06-s47/pending/i24_mask_bits_shift.patch (the forward's mask_mod bits
# shifted in at the bottom: its partial tiles' loop 124 -> 96 instructions an iteration of 8 positions;
# prediction: ragged forward +4-7%, the rest unchanged), then i24_element_bits.patch on top of it (the
# partial blocks' pairs kept as bits, read by the forwards in place of the function; prediction: ragged
# forward ~305 -> ~450 TFLOP/s on the H100, the rest unchanged).
export PYTHONUNBUFFERED=1
[ $# -gt 0 ] || { echo 'patches?'; exit 1; }; rows=${ROWS:-ragged,document}
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
for p in ${BASE:-}; do (cd /tmp/MA && patch -p1 -s < $R/$p) || exit 1; done
cp -r /tmp/MA /tmp/MB
for p in "$@"; do (cd /tmp/MB && patch -p1 -s < $R/$p) || exit 1; done
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
