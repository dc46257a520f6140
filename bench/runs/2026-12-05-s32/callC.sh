# Session 32, call C: the dropout forward three ways, one machine (trees under .ab/t): early (decisions
# drawn while the products run, a packed word per 32-key block), late (the same words drawn after the
# softmax), direct (drawn after the softmax, each word applied as drawn: call A's code).
export PYTHONUNBUFFERED=1
S=$PWD/bench/runs/2026-12-05-s32
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
for t in early late direct; do (cd .ab/t/$t && PYTHONPATH=$PWD python $S/pre.py drop 5 > $OUT/pre_$t.txt 2>&1) & done
wait; cat $OUT/pre_*.txt; echo "compiled at $(( $(date +%s) - t0 )) s"
for t in early late direct early; do
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 60 python bench/training.py --seqlens 4096 --repeats 20 > $OUT/training_$t.txt 2>&1)
  echo "== $t"; grep -E "plain +forward|dropout +forward" $OUT/training_$t.txt
done
for t in early late direct; do
  (cd .ab/t/$t && PYTHONPATH=$PWD timeout 60 ncu --clock-control none -k regex:sm90_fwd --section SpeedOfLight \
     python $S/dropout_ncu2.py > $OUT/ncu_$t.txt 2>&1)
  echo "== ncu $t"; grep -E "Duration" $OUT/ncu_$t.txt | tr -s ' ' | tr '\n' ' '; echo
done
echo "end at $(( $(date +%s) - t0 )) s"
