# Session 44's second call (~560 s, either card; trees from build_trees.sh, carry [".ab/t"]). Issue 22: the
# float32 forward that splits k and v once a key tile (pending/i22_fwd_claimed_keys.patch, "ck": the first
# CTA to reach a key tile claims it, splits it and writes its planes; later CTAs load them) against main's
# two planes passes (111 us each at d128 1k on the H100, 21% of the call).
# 1. ck's correctness first: its GPU test (bitwise against the pass, dense / packed / more work tiles than
#    SMs, twice) and the float32 forward tests, then memcheck and racecheck of the sm90 float32 kernels.
# 2. The float32 table both ways, main with torch's peers and ck without, two rounds; ncu durations of
#    ck's kernels at d128 causal 1k (fp32_parts.py: no split_planes launches before the forward).
# Prediction: d128 causal 1k forward 1,040 -> 880-940 us (1.64x -> 1.8-1.9x eff on an H100), 1k rows
# +10-18%, 4k rows -3..+5% (claims are 1/32 of the visits there, the passes 6% of the call); backward
# unchanged. Land if the tests and sanitizers pass and no row loses more than noise.
export PYTHONUNBUFFERED=1
R=$PWD; S=$R/bench/runs/2026-12-06-s43
nvidia-smi --query-gpu=name --format=csv,noheader; t0=$(date +%s)
(cd .ab/t/ck && PYTHONPATH=$PWD timeout 200 python -m pytest -q -m gpu -n 8 -p no:cacheprovider \
  tests/test_gpu_features.py tests/test_gpu.py -k "float32 or splits_keys" > $OUT/ck_tests.txt 2>&1
  echo "ck tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/ck_tests.txt; grep -E "^E |FAILED" $OUT/ck_tests.txt | cut -c1-200 | head -8)
for tool in memcheck racecheck; do
  (cd .ab/t/ck && PYTHONPATH=$PWD timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 1 \
    python tests/sanitize_attention.py sm90:float32 > $OUT/ck_$tool.txt 2>&1
   echo "ck $tool rc=$? at $(( $(date +%s) - t0 )) s"; grep -E "SUMMARY|done" $OUT/ck_$tool.txt | tail -2)
done
A="--dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096"
for round in 1 2; do
  (cd .ab/t/main && PYTHONPATH=$PWD timeout 70 python bench/bench.py $A 2>&1 | grep -E "^ fp32" | tee -a $OUT/fp32_main.txt)
  (cd .ab/t/ck && PYTHONPATH=$PWD timeout 50 python bench/bench.py $A --no-peers 2>&1 | grep -E "^ fp32" | tee -a $OUT/fp32_ck.txt)
done
(cd .ab/t/ck && PYTHONPATH=$PWD timeout 50 python bench/bench.py $A --no-peers --per-call 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_ck_per_call.txt)
(cd .ab/t/ck && PYTHONPATH=$PWD timeout 60 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum \
  python $R/bench/runs/2026-12-06-s42/fp32_parts.py > $OUT/ck_parts.txt 2>&1)
grep -E "^  [a-z_0-9]+|gpu__time_duration" $OUT/ck_parts.txt | sed -E 's/\(.*//; s/  +/ /g' | paste - - | cut -c1-110
echo "done at $(( $(date +%s) - t0 )) s"
