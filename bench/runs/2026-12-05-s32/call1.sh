# Session 32, call 1: precompile main (+ merge v2) and the four A/B trees in parallel; the merge tests and
# the cascade row; the dropout A/B (training.py: main, early, drawn) and the float32 backward A/B
# (bench.py: main, red, redkv). "main" is the working tree (merge v2 touches neither benchmark's kernels).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s32
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
for t in early drawn; do (cd .ab/t/$t && PYTHONPATH=$PWD python $OLDPWD/$S/pre.py drop 3 > $OUT/pre_$t.txt 2>&1) & done
for t in red redkv; do (cd .ab/t/$t && PYTHONPATH=$PWD python $OLDPWD/$S/pre.py fp32 3 > $OUT/pre_$t.txt 2>&1) & done
python -c "
import time; t = time.time()
from cupyflash import _families, _kernels
_kernels.precompile(_families.VARIANTS, max_workers=12)
print(f'precompile {time.time() - t:.1f} s')"
wait; cat $OUT/pre_*.txt | tail -8; echo "all compiled at $(( $(date +%s) - t0 )) s"
timeout 60 python -m pytest -q -m gpu -p no:cacheprovider -rfE tests/test_merge.py 2>&1 | tail -2
timeout 60 python bench/decode.py --quick --rows cascade 2>&1 | tail -1
for t in main early drawn; do
  d=.ab/t/$t; [ $t = main ] && d=.
  (cd $d && PYTHONPATH=$PWD timeout 60 python bench/training.py --seqlens 4096 --repeats 10 > $OUT/training_$t.txt 2>&1)
  echo "== $t"; grep -E "plain|dropout" $OUT/training_$t.txt | cut -c1-110
done
for t in main red redkv; do
  d=.ab/t/$t; [ $t = main ] && d=.
  (cd $d && PYTHONPATH=$PWD timeout 60 python bench/bench.py --dtypes fp32 --headdims 64,128 --causal 0,1 \
      --seqlens 1024,4096 --no-peers --out /tmp/b_$t > $OUT/bench_fp32_$t.txt 2>&1)
  echo "== $t"; tail -10 $OUT/bench_fp32_$t.txt | cut -c1-100
done
echo "end at $(( $(date +%s) - t0 )) s"
