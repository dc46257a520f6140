# Session 48: the persistent Hopper backward (i24_persistent_bwd.patch, issue 24) on the seven-patch
# landing tree (~500 s, either card, no carry). PA = HEAD + the pending landing patches (while pending),
# PB = PA + the patch. First its own GPU tests (the chained key tiles against one tile a CTA, bitwise dK
# and dV), then racecheck of the chained kernel (chained_race.py), then A/B: bench/mods.py's document and ragged rows and bench/bench.py's bf16 head dim 96/128
# rows, PA and PB alternating, no peers; memcheck last. Prediction (bench/NOTES.md, session 47: a CTA's fixed 7.5 us):
# document backward +5-8%, ragged +3-6%, dense causal 1k +3-5%, 16k within 1%, forwards unchanged.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
R=$PWD
. bench/runs/2026-12-06-s48/trees.sh || exit 1
mkdir -p $OUT/persistent
(cd /tmp/PB && PYTHONPATH=/tmp/PB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider -x tests/test_gpu_sm90.py \
   -k "chain or causal_key_tiles or causal_last or packed or deterministic" 2>&1 | tail -4)
echo "tests at $(el) s"
sanitize() {
  echo "== $1"
  (cd /tmp/PB && PYTHONPATH=/tmp/PB timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool $1 \
     python $R/bench/runs/2026-12-06-s48/chained_race.py 2>&1 | tail -3)
}
B="bench/bench.py --dtypes bf16 --headdims 128 --causal 0,1 --seqlens 1024,16384 --no-peers"
for round in 1 2; do
  for t in PA PB; do
    echo "== $t round $round at $(el) s"
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 100 python bench/mods.py --rows document,ragged --no-peers \
       --out $OUT/persistent/mods_${t}_$round 2>&1 | grep -E '^(row|document|ragged) ')
    (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 100 python $B --out $OUT/persistent/bench_${t}_$round 2>&1 | tail -8)
  done
  [ $round = 1 ] && sanitize racecheck
done
sanitize memcheck
echo "done at $(el) s"
