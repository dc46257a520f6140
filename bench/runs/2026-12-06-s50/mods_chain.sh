# Issue 24: a cumulative A/B of pending patches on bench/mods.py's rows (either card, no carry):
#   bash bench/runs/2026-12-06-s50/mods_chain.sh P1 P2 ...   (ROWS=ragged,document by default; ROUNDS=2;
#   PEERS=0: no FlexAttention)
# T0 = HEAD, T1 = T0 + P1, T2 = T1 + P2, ...: each tree against the one before it, the rounds alternating
# through the trees (T0's first round with FlexAttention, the others without peers).
export PYTHONUNBUFFERED=1
[ $# -gt 0 ] || { echo 'patches?'; exit 1; }; rows=${ROWS:-ragged,document}
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
R=$PWD; trees="T0"
rm -rf /tmp/T[0-9] && mkdir -p /tmp/T0 && git archive HEAD cupyflash kernels_cu bench tests README.md setup.cfg | tar -x -C /tmp/T0
n=0
for p in "$@"; do
  n=$((n + 1)); cp -r /tmp/T$((n - 1)) /tmp/T$n; trees="$trees T$n"
  (cd /tmp/T$n && patch -p1 -s < $R/$p && find . -name '*.orig' -delete) || exit 1
  echo "T$n = T$((n - 1)) + $p"
done
# Every tree's kernels compiled at once (a quick untimed run each, in parallel), so the rounds time calls.
for t in $trees; do
  (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 150 python bench/mods.py --rows $rows --no-peers --quick --repeats 1 \
    --warmup 0 --out /tmp/warm_$t > /tmp/warm_$t.log 2>&1 || tail -3 /tmp/warm_$t.log) &
done
wait; echo "compiled at $(( $(date +%s) - t0 )) s"
for round in $(seq 1 ${ROUNDS:-2}); do
  for t in $trees; do
    peers=--no-peers; [ $round = 1 ] && [ $t = T0 ] && [ "${PEERS:-1}" = 1 ] && peers=
    echo "== $t round $round"
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 200 python bench/mods.py --rows $rows $peers --out $OUT/mods_${t}_$round 2>&1 \
      | grep -E '^(row|document|ragged|relbias|softcap|alibi) ')
  done
done
echo "done at $(( $(date +%s) - t0 )) s"
