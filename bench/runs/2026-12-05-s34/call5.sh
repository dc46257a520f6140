export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s34
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
python bench/runs/2026-12-05-s33/pre.py drop 16
timeout 90 python $S/decode_layout.py 2>&1 | tee $OUT/decode_layout.txt | grep -v "^  torch"
echo "at $(( $(date +%s) - t0 )) s"
timeout 170 python bench/training.py --seqlens 4096 --repeats 20 --rounds 3 2>&1 | tee $OUT/training_rounds.txt
echo "at $(( $(date +%s) - t0 )) s"
timeout 200 python bench/mods.py --out $OUT/mods > $OUT/mods.txt 2>&1
echo "mods rc=$?"; tail -22 $OUT/mods.txt
echo "end at $(( $(date +%s) - t0 )) s"
