# Session 33, call 5: the float32 backward's float-pair lse (working tree): every float32 GPU test with
# the float32 variants precompiled, and memcheck of the float32 kernels on Hopper.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=bench/runs/2026-12-05-s33
t0=$(date +%s)
python $S/pre.py f32 16
timeout 170 python -m pytest -v -m gpu -n 8 -p no:cacheprovider -k "float32 or fp32" tests > $OUT/fp32_tests.txt 2>&1
echo "tests rc=$? at $(( $(date +%s) - t0 )) s"; tail -2 $OUT/fp32_tests.txt; grep -E "FAILED|ERROR" $OUT/fp32_tests.txt | head
timeout 80 compute-sanitizer --tool memcheck --error-exitcode 1 python tests/sanitize_attention.py sm90:float32 > $OUT/memcheck_fp32.txt 2>&1
echo "memcheck rc=$?"; tail -2 $OUT/memcheck_fp32.txt
echo "end at $(( $(date +%s) - t0 )) s"
