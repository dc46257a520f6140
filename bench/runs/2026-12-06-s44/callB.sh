# Session 44, call B (~420 s, same machine as call A; carry [".ab/t"] for main's tree): racecheck of the two
# new kernels in the working tree (main + m192 + ck): the FP8 forwards (192-row d64 CTAs, three consumer
# warpgroups) and the float32 forwards (claimed keys); then A/B against main: the float32 table (main with
# torch's peers, the working tree without; then the working tree each call alone) and the FP8 d64 rows.
export PYTHONUNBUFFERED=1
R=$PWD; card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
for which in float8_e4m3fn float32; do
  PYTHONPATH=$PWD timeout 130 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --error-exitcode 1 \
    python tests/sanitize_attention.py sm90:$which > $OUT/racecheck_$which.txt 2>&1
  echo "racecheck $which rc=$? at $(el) s"; grep -E "SUMMARY|hazard|done" $OUT/racecheck_$which.txt | tail -3
done
A="--dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096"
(cd .ab/t/main && PYTHONPATH=$PWD timeout 70 python bench/bench.py $A 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_main.txt)
PYTHONPATH=$PWD timeout 50 python bench/bench.py $A --no-peers 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_ck.txt
PYTHONPATH=$PWD timeout 50 python bench/bench.py $A --no-peers --per-call 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_ck_per_call.txt
(cd .ab/t/main && PYTHONPATH=$PWD timeout 40 python bench/fp8.py --headdims 64 --seqlens 4096,16384 2>&1 | tail -5 | tee $OUT/fp8_main.txt)
PYTHONPATH=$PWD timeout 40 python bench/fp8.py --headdims 64 --seqlens 4096,16384 2>&1 | tail -5 | tee $OUT/fp8_tree.txt
echo "done at $(el) s"
