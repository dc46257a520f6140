# Session 29, call 4 (the last ~4 device minutes): call 3 without memcheck, in the order that matters.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python - <<'PY' 2>&1 | tail -6
import sys
import time
import pytest
from cupyflash import _families, _kernels
t = time.time()
wanted = ("fp32_d64", "fp32_d128", "bf16_d128_v128_q128_n128_s2_mod_", "bf16_d64_v64_q128", "bwd_bf16_d128", "bwd_bf16_d64")
_kernels.precompile([v for v in _families.VARIANTS if v.key.startswith(("sm90", "split_planes", "tf32_"))
                     and (any(w in v.key for w in wanted) or v.key.startswith("tf32_"))
                     and ("top_1" not in v.key or "fwd_tf32" in v.key)], max_workers=16)
print(f"precompile {time.time() - t:.0f} s", flush=True)
_kernels.precompile = lambda *args, **kwargs: None
sys.exit(pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py::test_float32_tf32_precision_gradients",
                      "tests/test_gpu.py::test_tf32_kernel_within_its_rule",
                      "tests/test_plans.py::test_a_planned_call_can_be_captured_in_a_graph",
                      "tests/test_gpu_training.py::test_dense[gqa-causal-bfloat16-]",
                      "tests/test_gpu_training.py::test_dense[softcap-d128-bfloat16-]"]))
PY
timeout 60 python bench/training.py --seqlens 4096 --repeats 10 > $OUT/training.txt 2>&1; echo "training rc=$?"; grep -E "plain|dropout" $OUT/training.txt
