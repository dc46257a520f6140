"""The CUDA path: operands, outputs, and dispatch to the first kernel family that supports the problem
(cupyflash/_families) on CuPy's current device and stream."""

import cupy

from . import _families
from ._families import common
from ._validate import lse_dtype


def forward(q, k, v, p):
    """Forward of a validated, non-empty problem: (out, lse)."""
    q, k, v = (common.operand(x) for x in (q, k, v))
    out = cupy.empty(p.out_shape, dtype=p.dtype)
    lse = cupy.empty(p.lse_shape, dtype=lse_dtype(p.dtype))
    bad = common.varlen_check(p, q, k, v)
    if _launchable(p):
        family, variant = _families.select(_families.FORWARD, p, common.current_device())
        family.run(variant, p, q, k, v, out, lse)
    common.fill_nan_if(bad, out, lse)
    return out, lse


def backward(dout, q, k, v, out, lse, p, deterministic):
    """Backward of a validated, non-empty problem: (dq, dk, dv)."""
    dout, q, k, v, out = (common.operand(x) for x in (dout, q, k, v, out))
    lse = cupy.ascontiguousarray(lse)  # already in lse_dtype(p.dtype) (see _api)
    bad = common.varlen_check(p, q, k, v)
    if _launchable(p):
        family, variant = _families.select(_families.BACKWARD, p, common.current_device())
        grads = family.run(variant, p, dout, q, k, v, out, lse, deterministic)
    else:
        grads = tuple(cupy.empty(x.shape, dtype=p.dtype) for x in (q, k, v))
    common.fill_nan_if(bad, *grads)
    return grads


def _launchable(p):
    """False only for a packed batch whose given max_seqlen is 0 while it has rows: no grid to launch, and
    the device check finds a sequence longer than its max, so every output becomes NaN."""
    return p.seqlen_q > 0 and p.seqlen_k > 0
