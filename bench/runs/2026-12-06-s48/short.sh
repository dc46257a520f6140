# Session 48's last-chance call (~200 s, either card, no carry): the persistent backward's chain tests and
# one A/B round (persistent_ab.sh's trees, no sanitizers).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
R=$PWD
. bench/runs/2026-12-06-s48/trees.sh || exit 1
(cd /tmp/PB && PYTHONPATH=/tmp/PB timeout 100 python -m pytest -q -m gpu -p no:cacheprovider -x tests/test_gpu_sm90.py \
   -k chain 2>&1 | tail -3)
echo "tests at $(el) s"
for t in PA PB; do
  echo "== $t at $(el) s"
  (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 60 python bench/mods.py --rows document --no-peers --out $OUT/m_$t 2>&1 \
     | grep -E '^(row|document) ')
  (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout 50 python bench/bench.py --dtypes bf16 --headdims 128 --causal 1 \
     --seqlens 1024,16384 --no-peers --out $OUT/b_$t 2>&1 | tail -5)
done
echo "done at $(el) s"
