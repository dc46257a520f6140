# Session 64's GPU-test fixes (pending/gpu_tests_audit.patch, from a helper's audit of the GPU tests by
# reading; never run): the current-stream tests behind a 200 ms spin kernel, block-mask lists' identity
# across a re-plan, the KV-cache plan's second run, vjp with options against the oracle, the float32
# forward over 4096 keys on sm80 and on the Hopper planes, the deterministic backward on the general and
# sm80 families, and test_random's GPU seeds xfail only on a gradient past the rule. Any Hopper card:
# a copy /tmp/G of the tree with the patch, only the touched tests (16 workers). On a pass, commit the
# patch with the pytest line; a failure names the test to mend (or a real kernel finding).
export PYTHONUNBUFFERED=1; R=$PWD
rm -rf /tmp/G && mkdir -p /tmp/G && cp -r cupyflash kernels_cu tests bench setup.cfg /tmp/G
(cd /tmp/G && git apply $R/bench/runs/2026-12-08-s64/pending/gpu_tests_audit.patch) || { echo "G: the patch does not apply"; exit 1; }
cd /tmp/G && PYTHONPATH=/tmp/G timeout ${LIMIT:-300} python -m pytest -q -m gpu -n 16 --dist load -p no:cacheprovider \
  tests/test_gpu.py tests/test_plans.py tests/test_gpu_features.py tests/test_kvcache.py tests/test_random.py \
  > $OUT/gpu_tests_audit.txt 2>&1; echo "rc=$?"; tail -n 15 $OUT/gpu_tests_audit.txt
