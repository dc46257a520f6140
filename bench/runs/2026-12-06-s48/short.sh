# Session 48's last-chance call (~200 s, either card, no carry): the persistent backward's chain tests and
# one A/B round (persistent_ab.sh's trees, no sanitizers).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
R=$PWD
rm -rf /tmp/PA /tmp/PB && mkdir -p /tmp/PA
git archive HEAD cupyflash kernels_cu bench tests README.md setup.cfg | tar -x -C /tmp/PA
for p in 2026-12-06-s42/pending/i25_fp8_d64_three_consumers 2026-12-06-s44/pending/i24_lse_pair_minus_inf \
         2026-12-06-s45/pending/readme_m192_minus_inf 2026-12-06-s44/pending/i22_bwd_exp_select \
         2026-12-06-s45/pending/i24_bwd_key_order 2026-12-06-s46/pending/i24_mask_loads \
         2026-12-06-s47/pending/i26_paged_walk_ahead; do
  (cd /tmp/PA && patch -p1 -s < $R/bench/runs/$p.patch) || exit 1
done
cp -r /tmp/PA /tmp/PB
(cd /tmp/PB && patch -p1 -s < $R/bench/runs/2026-12-06-s48/pending/i24_persistent_bwd.patch) || exit 1
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
