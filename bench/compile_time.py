"""First-use compile time and cached load time of kernel variants, each in a fresh process.

Run from the repository root on a GPU machine: ``python bench/compile_time.py``. A new, empty CuPy
cache directory is used, so the first process compiles with NVRTC and the second loads the cubin from
CuPy's disk cache. Targets (issue 3): compile under 5 s, cached load under 0.1 s. The variants are named
by cupyflash's internal table (``cupyflash._families.VARIANTS``), so this script follows the current code.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Variant keys timed: the largest tensor-core forward tiles, a tensor-core backward and a general-path kernel.
VARIANTS = (
    "sm80_fwd_bf16_d128_n32_m2_mod_1_top_0",
    "sm80_fwd_fp16_d256_n64_m1_mod_0_top_0",
    "sm80_bwd_bf16_d128_n128_q64_s2_mod_0",
    "general_bwd_dkdv_fp32_drop_0",
)

_CHILD = """
import json, sys, time
import cupy
from cupyflash import _families, _kernels
cupy.cuda.Device().synchronize()  # context creation stays out of the timing
by_key = {v.key: v for v in _families.VARIANTS}
times = {}
for key in json.loads(sys.argv[1]):
    variant = by_key[key]
    start = time.perf_counter()
    _kernels.get_kernel(variant)
    times[variant.key] = time.perf_counter() - start
print(json.dumps(times))
"""


def time_in_new_process(cache_dir):
    """Seconds per variant for get_kernel in a fresh Python process using ``cache_dir``."""
    env = dict(os.environ, CUPY_CACHE_DIR=cache_dir, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(VARIANTS)], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    """Time the variants; returns the exit status."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    harness.require_gpu("compile_time.py")
    with tempfile.TemporaryDirectory() as cache_dir:
        first = time_in_new_process(cache_dir)
        cached = time_in_new_process(cache_dir)
    print(f"{'variant':<36} {'first use (s)':>13} {'cached, new process (s)':>24}")
    for key in first:
        print(f"{key:<36} {first[key]:>13.2f} {cached[key]:>24.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
