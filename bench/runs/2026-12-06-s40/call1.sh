# Session 40, call 1: MLA times (v2 = main + the Hopper MLA patch; cA, cF (in `both`), cP) in two
# rounds, the second reversed; then decode rows (bf16, e4m3) of v2 and `both` (cF + per-warp decode).
# Trees are built as in ../2026-12-06-s39/next_call.sh's header; carry [".ab/t"].
export PYTHONUNBUFFERED=1
R=$PWD
T=$R/bench/runs/2026-12-06-s37/mla_time.py
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeit() { (cd $1 && PYTHONPATH=$PWD timeout 90 python $T 128 16 32 2>&1 | tail -4 > /tmp/time_$2_$3.txt); echo "$2 round $3 ($(( $(date +%s) - t0 )) s):"; cat /tmp/time_$2_$3.txt; }
timeit .ab/t/v2 main 1; timeit .ab/t/cA cA 1; timeit .ab/t/both cF 1; timeit .ab/t/cP cP 1
timeit .ab/t/cP cP 2; timeit .ab/t/both cF 2; timeit .ab/t/cA cA 2; timeit .ab/t/v2 main 2
for t in main both; do d=$R/.ab/t/v2; [ $t = both ] && d=$R/.ab/t/both
  (cd $d && PYTHONPATH=$PWD timeout 90 python bench/decode.py --quick --rows decode fp8 > $OUT/decode_$t.txt 2>&1)
  echo "decode $t rc=$?"; grep -iE " x |e4m3" $OUT/decode_$t.txt | cut -c1-160 | head -8
done
echo "done at $(( $(date +%s) - t0 )) s"
