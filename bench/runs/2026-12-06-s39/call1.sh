# Session 39's last call (~400 s; H100 or H200). Trees (built on the CPU from HEAD, bench/runs left out):
#   .ab/t/cA: warpgroup 1 issues P_e V_e over its columns before it exponentiates S_o (P_o's exponentials
#             under that product; into registers of their own, or ptxas serializes the products: C7515)
#   .ab/t/cB: warpgroup 0 hands over its row maximum and scale0 on a barrier of their own (kMax0Ready)
#             before its exponentials, so warpgroup 1's softmax runs beside them; P_e follows on kP0Ready
# carry [".ab/t"]. MLA times of main, cA and cB in two rounds (the second reversed), then the faster
# candidate's MLA tests, then the float32 d128 causal 1k row beside torch and the e4m3 decode rows.
export PYTHONUNBUFFERED=1
R=$PWD
T=$R/bench/runs/2026-12-06-s37/mla_time.py
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
timeit() { (cd $1 && PYTHONPATH=$PWD timeout 90 python $T 128 16 32 2>&1 | tail -4 > /tmp/time_$2_$3.txt); echo "$2 round $3:"; cat /tmp/time_$2_$3.txt; }
timeit $R main 1; timeit .ab/t/cA cA 1; timeit .ab/t/cB cB 1
timeit .ab/t/cB cB 2; timeit .ab/t/cA cA 2; timeit $R main 2
ms() { cat /tmp/time_$1_*.txt | grep "heads 128" | awk '{s += $3} END {print s}'; }
W=$(awk -v a="$(ms cA)" -v b="$(ms cB)" 'BEGIN {print (a < b) ? "cA" : "cB"}')
echo "winner at 128 heads: $W ($(ms cA) vs $(ms cB) ms, two rounds summed; main $(ms main)) at $(( $(date +%s) - t0 )) s"
(cd .ab/t/$W && PYTHONPATH=$PWD timeout $(( $(left) - 110 )) python -m pytest -q -x -p no:cacheprovider -n 8 tests/test_kvcache.py -k mla > $OUT/tests_$W.txt 2>&1); echo "$W tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/tests_$W.txt; grep -E "^E |FAILED" $OUT/tests_$W.txt | cut -c1-200 | head -5
PYTHONPATH=$R timeout $(( $(left) - 50 )) python bench/bench.py --dtypes fp32 --headdims 128 --causal 1 --seqlens 1024 --out /tmp/b32 > $OUT/fp32.txt 2>&1; echo "fp32 rc=$? at $(( $(date +%s) - t0 )) s"; tail -12 $OUT/fp32.txt | cut -c1-200
PYTHONPATH=$R timeout $(( $(left) - 3 )) python bench/decode.py --quick --rows fp8 > $OUT/fp8.txt 2>&1; echo "fp8 rc=$?"; tail -10 $OUT/fp8.txt | cut -c1-200
echo "end at $(( $(date +%s) - t0 )) s"
