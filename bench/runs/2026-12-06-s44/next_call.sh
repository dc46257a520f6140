# Session 45's first call (~480 s, either card; trees from build_trees.sh, carry [".ab/t"]). Name the card.
# 1. cand: the GPU test of session 44's -inf fix (a score_mod's -inf gave the float32 backwards NaN; it
#    fails on main).
# 2. sel (the float32 Hopper backward's 32 exponentials a tile without a branch each, so warpgroup 0's
#    softmax no longer holds warpgroup 1 at p_full ~30% of its time): its float32 GPU tests, then the
#    float32 table, main with torch's peers and sel without, events and each call alone.
#    Prediction: backward d128 causal 1k -8..-15% time (57 -> 62-67 TFLOP/s on an H100, 1.90 -> 2.05-2.2x
#    torch's memory-efficient), every float32 backward row up; forwards unchanged.
# 3. memcheck and racecheck of sel's float32 kernels (racecheck took over 130 s in session 44).
# On an H200 only: apply the three patches of build_trees.sh to the working tree (sel's code; or cand's if sel
# fails or loses) and land it on runs/2026-12-06-s42/land_call.sh's pass (whole suite, memcheck).
export PYTHONUNBUFFERED=1
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
(cd .ab/t/cand && PYTHONPATH=$PWD timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_mods.py \
  -k minus_infinity > $OUT/cand_minus_inf.txt 2>&1; echo "cand -inf test rc=$? at $(el) s"; tail -1 $OUT/cand_minus_inf.txt)
(cd .ab/t/sel && PYTHONPATH=$PWD timeout 200 python -m pytest -q -m gpu -n 8 -p no:cacheprovider tests/test_gpu.py \
  tests/test_gpu_features.py tests/test_gpu_mods.py tests/test_gpu_training.py -k "float32" > $OUT/sel_tests.txt 2>&1
  echo "sel tests rc=$? at $(el) s"; tail -1 $OUT/sel_tests.txt; grep -E "^E |FAILED" $OUT/sel_tests.txt | cut -c1-200 | head -8)
A="--dtypes fp32 --headdims 64,128 --causal 0,1 --seqlens 1024,4096"
(cd .ab/t/main && PYTHONPATH=$PWD timeout 70 python bench/bench.py $A 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_main.txt)
(cd .ab/t/sel && PYTHONPATH=$PWD timeout 50 python bench/bench.py $A --no-peers 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_sel.txt)
(cd .ab/t/sel && PYTHONPATH=$PWD timeout 50 python bench/bench.py $A --no-peers --per-call 2>&1 | grep -E "^ fp32" | tee $OUT/fp32_sel_per_call.txt)
for tool in memcheck racecheck; do
  left=$(( 590 - $(el) )); [ $left -lt 40 ] && break
  (cd .ab/t/sel && PYTHONPATH=$PWD timeout $(( left - 10 )) /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 1 \
    python tests/sanitize_attention.py sm90:float32 > $OUT/sel_$tool.txt 2>&1
   echo "sel $tool rc=$? at $(el) s"; grep -E "SUMMARY|done" $OUT/sel_$tool.txt | tail -2)
done
# 4. ncu source samples (one launch each, ~10-25 s): main's float32 forward at d128 causal 1k (session 44
#    profiled only the refuted claimed-keys one) and sel's backward (is warpgroup 1 still at p_full?).
#    Read them with ana_ncu_source.py.txt and ncu_mbarrier_waits.py.txt (this folder).
mkdir -p $OUT/csv
for t in main:sm90_fwd_planes sel:sm90_bwd_planes; do
  left=$(( 590 - $(el) )); [ $left -lt 45 ] && break
  (cd .ab/t/${t%%:*} && PYTHONPATH=$PWD timeout $(( left - 10 )) /usr/local/cuda/bin/ncu -k regex:${t##*:} -c 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
    python ../../../bench/runs/2026-12-06-s42/fp32_parts.py > $OUT/csv/${t%%:*}_${t##*:}.csv 2>&1; echo "ncu $t rc=$?")
done
(cd $OUT && tar czf ncu_source.tgz csv && rm -rf csv)
echo "done at $(el) s"
