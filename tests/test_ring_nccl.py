"""Ring attention over NCCL across the machine's GPUs (issue 12; issue 27 asks it on eight): bench/ring.py
--check runs one process per GPU (the largest power of two up to 8 that the machine has), the ring on
shards of a 4096-token bf16 problem (unmasked, causal zigzag, a sliding window on zigzag shards, a causal
window on contiguous ones), with as many kv heads as query heads and with GQA 32/8, and compares every
result with single-GPU attention of the unsharded sequence. Skipped without two GPUs and CuPy's NCCL."""

import json
import os
import subprocess
import sys
import warnings

import pytest


def _ranks_with_nccl():
    """The ring's ranks here: the largest power of two up to 8 of the GPUs, or 0 (fewer than two GPUs, or
    no NCCL in CuPy)."""
    try:
        import cupy

        with warnings.catch_warnings():  # CuPy warns at import when the NCCL library is missing
            warnings.simplefilter("ignore")
            from cupy.cuda import nccl

        count = min(cupy.cuda.runtime.getDeviceCount(), 8)
        if count < 2 or not getattr(nccl, "available", False):
            return 0
        return 1 << (count.bit_length() - 1)
    except Exception:
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(not _ranks_with_nccl(), reason="needs two CUDA GPUs and CuPy's NCCL")
@pytest.mark.parametrize("heads, heads_k", [(16, 16), (32, 8)])
def test_nccl_ring_matches_one_gpu(tmp_path, heads, heads_k):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    report = tmp_path / "ring.json"
    # The child imports this tree's cupyflash whether or not it is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, os.path.join(root, "bench", "ring.py"), "--gpus", str(_ranks_with_nccl()),
                    "--check", "--heads", str(heads), "--heads-k", str(heads_k), "--json", str(report)],
                   check=True, timeout=600, env=env)
    errors = json.loads(report.read_text())
    assert len(errors) == 20  # out, lse, dq, dk, dv of 4 rings: full, causal, window, causal window
    # bf16 results of two summation orders: within a few bf16 ulps of the largest value.
    for name, error in errors.items():
        assert error <= (2e-2 if name.endswith(("out", "lse")) else 5e-2), (name, error)
