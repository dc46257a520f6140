"""Launches of the CUDA kernels on CuPy's current device and stream.

Each ``_*_args`` function mirrors one kernel's C signature and types every scalar (CuPy passes Python
ints and floats as 64-bit values, which a 32-bit parameter would silently misread).
"""

import cupy
import numpy

from . import _kernels
from ._kernels import DELTA_ROWS_PER_CTA, GENERAL_BLOCK_M, GENERAL_CHUNK, GENERAL_THREADS
from ._validate import SUPPORTED_DTYPES, acc_dtype, lse_dtype

_DTYPE_NAMES = {dtype: name for name, dtype in SUPPORTED_DTYPES.items()}


def _cdiv(a, b):
    return -(-a // b)


def _operand(x):
    """``x`` itself when its last axis is contiguous (any other strides are fine), else one copy."""
    itemsize = x.dtype.itemsize
    if all(s % itemsize == 0 for s in x.strides) and (x.shape[-1] == 1 or x.strides[-1] == itemsize):
        return x
    return cupy.ascontiguousarray(x)


def _strides(x):
    """Element strides of the (batch, seqlen, heads) axes, as the kernels' int64 parameters."""
    return tuple(numpy.int64(s // x.dtype.itemsize) for s in x.strides[:3])


def _scale(problem):
    """softmax_scale in the kernels' accumulator type."""
    return acc_dtype(problem.dtype).type(problem.softmax_scale)


def _sizes(p):
    return tuple(
        numpy.int32(n) for n in (p.seqlen_q, p.seqlen_k, p.heads, p.heads_k, p.headdim, p.headdim_v)
    )


def _fwd_args(q, k, v, out, lse, p):
    return (q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out), *_sizes(p), _scale(p))


def _delta_args(out, dout, delta, p):
    rows = p.batch * p.heads * p.seqlen_q
    return (
        out, dout, delta, *_strides(out), *_strides(dout),
        numpy.int32(p.seqlen_q), numpy.int32(p.heads), numpy.int32(p.headdim_v), numpy.int64(rows),
    )


def _dq_args(q, k, v, dout, lse, delta, dq, p):
    return (
        q, k, v, dout, lse, delta, dq,
        *_strides(q), *_strides(k), *_strides(v), *_strides(dout), *_strides(dq), *_sizes(p), _scale(p),
    )


def _dkdv_args(q, k, v, dout, lse, delta, dk, dv, p):
    return (
        q, k, v, dout, lse, delta, dk, dv,
        *_strides(q), *_strides(k), *_strides(v), *_strides(dout), *_strides(dk), *_strides(dv),
        *_sizes(p), _scale(p),
    )


def _kernel(family, p):
    return _kernels.get_kernel(_kernels.Variant(family, _DTYPE_NAMES[p.dtype], p.causal))


def _vec_loads(*arrays):
    """1 when every base pointer and (batch, seqlen, head) stride is 16-byte aligned (cp.async), else 0."""
    return numpy.int32(all(x.data.ptr % 16 == 0 and all(s % 16 == 0 for s in x.strides[:3]) for x in arrays))


def _tc_forward_variant(p):
    """The tensor-core forward variant for ``p``, or None when the general path must run it.

    Needs float16/bfloat16, compute capability 8.0+, both head dims within a bucket (<= 256), and a
    tile of the bucket whose shared memory fits the device's per-block opt-in limit (the first that fits).
    """
    if p.dtype.itemsize != 2:
        return None
    bucket = _kernels.tc_headdim_bucket(p.headdim, p.headdim_v)
    if bucket is None:
        return None
    device = cupy.cuda.Device()
    if int(device.compute_capability) < _kernels.TC_MIN_CAPABILITY:
        return None
    limit = device.attributes["MaxSharedMemoryPerBlockOptin"]
    for tile in _kernels.TC_FWD_TILES[bucket]:
        variant = _kernels.Variant("tc_fwd", _DTYPE_NAMES[p.dtype], p.causal, bucket, *tile)
        if _kernels.tc_fwd_smem_bytes(variant) <= limit:
            return variant
    return None


def forward(q, k, v, p):
    """Forward of a validated, non-empty problem: (out, lse).

    float16/bfloat16 run the tensor-core kernel where it applies (see _tc_forward_variant); everything
    else runs the general path.
    """
    q, k, v = _operand(q), _operand(k), _operand(v)
    out = cupy.empty(p.out_shape, dtype=p.dtype)
    lse = cupy.empty(p.lse_shape, dtype=lse_dtype(p.dtype))
    variant = _tc_forward_variant(p)
    if variant is not None:
        kernel = _kernels.get_kernel(variant)
        smem = _kernels.tc_fwd_smem_bytes(variant)
        if kernel.max_dynamic_shared_size_bytes < smem:
            kernel.max_dynamic_shared_size_bytes = smem
        grid = (_cdiv(p.seqlen_q, _kernels.TC_FWD_BLOCK_M) * p.batch * p.heads, 1, 1)
        args = _fwd_args(q, k, v, out, lse, p) + (_vec_loads(q, k, v),)
        kernel(grid, (_kernels.tc_fwd_threads(variant), 1, 1), args, shared_mem=smem)
        return out, lse
    grid = (_cdiv(p.seqlen_q, GENERAL_BLOCK_M) * p.batch * p.heads, _cdiv(p.headdim_v, GENERAL_CHUNK), 1)
    _kernel("general_fwd", p)(grid, (GENERAL_THREADS, 1, 1), _fwd_args(q, k, v, out, lse, p))
    return out, lse


def backward(dout, q, k, v, out, lse, p):
    """General-path backward of a validated, non-empty problem: (dq, dk, dv).

    Extra device memory: delta, (batch, heads, seqlen_q) in the accumulator dtype, besides the gradients.
    """
    dout, q, k, v, out = (_operand(x) for x in (dout, q, k, v, out))
    lse = cupy.ascontiguousarray(lse, dtype=lse_dtype(p.dtype))
    delta = cupy.empty(p.lse_shape, dtype=acc_dtype(p.dtype))
    rows = p.batch * p.heads * p.seqlen_q
    _kernel("general_bwd_delta", p)(
        (_cdiv(rows, DELTA_ROWS_PER_CTA), 1, 1), (32 * DELTA_ROWS_PER_CTA, 1, 1), _delta_args(out, dout, delta, p)
    )
    dq = cupy.empty(q.shape, dtype=p.dtype)
    dk = cupy.empty(k.shape, dtype=p.dtype)
    dv = cupy.empty(v.shape, dtype=p.dtype)
    block = (GENERAL_THREADS, 1, 1)
    grid_dq = (_cdiv(p.seqlen_q, GENERAL_BLOCK_M) * p.batch * p.heads, _cdiv(p.headdim, GENERAL_CHUNK), 1)
    _kernel("general_bwd_dq", p)(grid_dq, block, _dq_args(q, k, v, dout, lse, delta, dq, p))
    grid_dkdv = (
        _cdiv(p.seqlen_k, GENERAL_BLOCK_M) * p.batch * p.heads_k,
        _cdiv(max(p.headdim, p.headdim_v), GENERAL_CHUNK),
        1,
    )
    _kernel("general_bwd_dkdv", p)(grid_dkdv, block, _dkdv_args(q, k, v, dout, lse, delta, dk, dv, p))
    return dq, dk, dv
