# Session 52's short call (~170 s, either card, no carry): ab.sh's A/B without the tail-6 and list-search
# variants, the suite and the probe: T0 = HEAD, T1 = HEAD + i24_ranked_front.patch, T3 = T1 +
# i24_kv_prefetch.patch, on bench/mods.py's document and ragged rows, two rounds.
export PYTHONUNBUFFERED=1
R=$PWD; nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
rm -rf /tmp/T0 /tmp/T1 /tmp/T3 && mkdir -p /tmp/T0 && git archive HEAD cupyflash kernels_cu bench tests README.md setup.cfg | tar -x -C /tmp/T0
cp -r /tmp/T0 /tmp/T1 && (cd /tmp/T1 && patch -p1 -s < $R/bench/runs/2026-12-07-s52/i24_ranked_front.patch) || exit 1
cp -r /tmp/T1 /tmp/T3 && (cd /tmp/T3 && patch -p1 -s < $R/bench/runs/2026-12-07-s52/i24_kv_prefetch.patch) || exit 1
for t in T0 T1 T3; do
  (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 150 python bench/mods.py --rows ragged,document --no-peers --quick --repeats 1 \
    --warmup 0 --out /tmp/warm_$t > /tmp/warm_$t.log 2>&1 || tail -3 /tmp/warm_$t.log) &
done
wait; echo "compiled at $(el) s"
for round in 1 2; do
  for t in T0 T1 T3; do
    echo "== $t round $round"
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 60 python bench/mods.py --rows ragged,document --no-peers \
      --out $OUT/mods_${t}_$round 2>&1 | grep -E '^(row|document|ragged) ')
  done
done
echo "done at $(el) s"
