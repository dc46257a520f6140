"""Launches of the CUDA kernels on CuPy's current device and stream.

Each ``_*_args`` function mirrors one kernel's C signature and types every scalar (CuPy passes Python
ints and floats as 64-bit values, which a 32-bit parameter would silently misread).
"""

import functools

import cupy
import numpy

from . import _kernels
from ._kernels import DELTA_ROWS_PER_CTA, GENERAL_BLOCK_M, GENERAL_CHUNK, GENERAL_THREADS
from ._validate import SUPPORTED_DTYPES, acc_dtype, lse_dtype

_DTYPE_NAMES = {dtype: name for name, dtype in SUPPORTED_DTYPES.items()}

#: float32 dQ buffers of the deterministic tensor-core backward: the ordered sum runs per buffer, so
#: without a causal mask its start-up chain (one hand-over per key block) is this many times shorter.
DETERMINISTIC_DQ_SPLITS = 2


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


@functools.lru_cache(maxsize=None)
def _device_limits(device_id):
    """(compute capability as an int, per-block opt-in shared memory in bytes) of a device."""
    device = cupy.cuda.Device(device_id)
    return int(device.compute_capability), device.attributes["MaxSharedMemoryPerBlockOptin"]


def _tc_bucket(p, buckets):
    """The head-dim bucket of ``p`` when the tensor-core kernels can run it at all, else None.

    Needs float16/bfloat16, compute capability 8.0+ and both head dims within one of ``buckets``.
    """
    if p.dtype.itemsize != 2:
        return None
    if _device_limits(cupy.cuda.Device().id)[0] < _kernels.TC_MIN_CAPABILITY:
        return None
    return _kernels.tc_headdim_bucket(p.headdim, p.headdim_v, buckets)


def _smem_limit():
    return _device_limits(cupy.cuda.Device().id)[1]


def _tc_forward_variant(p):
    """The tensor-core forward variant for ``p``, or None when the general path must run it: the first
    tile of the bucket whose shared memory fits the device's per-block opt-in limit."""
    bucket = _tc_bucket(p, tuple(_kernels.TC_FWD_TILES))
    if bucket is None:
        return None
    for tile in _kernels.TC_FWD_TILES[bucket]:
        variant = _kernels.Variant("tc_fwd", _DTYPE_NAMES[p.dtype], p.causal, (bucket, *tile))
        if _kernels.tc_fwd_smem_bytes(variant) <= _smem_limit():
            return variant
    return None


def _tc_backward_variant(p):
    """The tensor-core backward variant for ``p``, or None when the general path must run it: the first
    tile of the bucket whose shared memory fits the device's per-block opt-in limit."""
    bucket = _tc_bucket(p, tuple(_kernels.TC_BWD_TILES))
    if bucket is None:
        return None
    for tile in _kernels.TC_BWD_TILES[bucket]:
        variant = _kernels.Variant("tc_bwd", _DTYPE_NAMES[p.dtype], p.causal, (bucket, *tile))
        if _kernels.tc_bwd_smem_bytes(variant) <= _smem_limit():
            return variant
    return None


def _launch_dynamic_smem(variant, grid, threads, args, smem):
    """Launches ``variant`` with ``smem`` bytes of dynamic shared memory (raising its limit if needed)."""
    kernel = _kernels.get_kernel(variant)
    if kernel.max_dynamic_shared_size_bytes < smem:
        kernel.max_dynamic_shared_size_bytes = smem
    kernel(grid, (threads, 1, 1), args, shared_mem=smem)


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
        grid = (_cdiv(p.seqlen_q, _kernels.TC_FWD_BLOCK_M) * p.batch * p.heads, 1, 1)
        args = _fwd_args(q, k, v, out, lse, p) + (_vec_loads(q, k, v),)
        _launch_dynamic_smem(variant, grid, _kernels.tc_fwd_threads(variant), args, _kernels.tc_fwd_smem_bytes(variant))
        return out, lse
    grid = (_cdiv(p.seqlen_q, GENERAL_BLOCK_M) * p.batch * p.heads, _cdiv(p.headdim_v, GENERAL_CHUNK), 1)
    _kernel("general_fwd", p)(grid, (GENERAL_THREADS, 1, 1), _fwd_args(q, k, v, out, lse, p))
    return out, lse


def backward(dout, q, k, v, out, lse, p, deterministic):
    """Backward of a validated, non-empty problem: (dq, dk, dv).

    float16/bfloat16 run the tensor-core kernel where it applies (see _tc_backward_variant): dQ is
    summed over key blocks in a float32 buffer of (batch, heads, seqlen_q, headdim rounded up to even)
    and converted at the end; with ``deterministic`` the key blocks add in a fixed order, into
    DETERMINISTIC_DQ_SPLITS such buffers. Everything else runs the general path, which is always
    deterministic. Extra device memory besides the gradients: delta, (batch, heads, seqlen_q) in the
    accumulator dtype, and the float32 dQ buffers.
    """
    dout, q, k, v, out = (_operand(x) for x in (dout, q, k, v, out))
    lse = cupy.ascontiguousarray(lse)  # already in lse_dtype(p.dtype) (see _api)
    delta = cupy.empty(p.lse_shape, dtype=acc_dtype(p.dtype))
    rows = p.batch * p.heads * p.seqlen_q
    _kernel("general_bwd_delta", p)(
        (_cdiv(rows, DELTA_ROWS_PER_CTA), 1, 1), (32 * DELTA_ROWS_PER_CTA, 1, 1), _delta_args(out, dout, delta, p)
    )
    dq = cupy.empty(q.shape, dtype=p.dtype)
    dk = cupy.empty(k.shape, dtype=p.dtype)
    dv = cupy.empty(v.shape, dtype=p.dtype)
    variant = _tc_backward_variant(p)
    if variant is not None:
        _tc_backward(variant, dout, q, k, v, lse, delta, dq, dk, dv, p, deterministic)
        return dq, dk, dv
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


def _tc_backward(variant, dout, q, k, v, lse, delta, dq, dk, dv, p, deterministic):
    # Even rows keep every float32 pair of the buffer 8-byte aligned for the vector reductions.
    dq_ld = p.headdim + p.headdim % 2
    splits = DETERMINISTIC_DQ_SPLITS if deterministic else 1
    dq_accum = cupy.zeros((splits, p.batch, p.heads, p.seqlen_q, dq_ld), dtype=numpy.float32)
    # One turn counter per (buffer, batch, head, query block) for the ordered sum; unused otherwise.
    turns_per_split = p.batch * p.heads * _cdiv(p.seqlen_q, variant.block_m)
    turns = cupy.zeros(splits * turns_per_split if deterministic else 1, numpy.int32)
    split_stride = numpy.int64(dq_accum[0].size)
    args = (
        q, k, v, dout, lse, delta, dq_accum, turns, dk, dv,
        *_strides(q), *_strides(k), *_strides(v), *_strides(dout), *_strides(dk), *_strides(dv),
        *_sizes(p), numpy.int32(dq_ld), numpy.int32(splits), split_stride, numpy.int64(turns_per_split),
        _scale(p), _vec_loads(q, k, v, dout), numpy.int32(bool(deterministic)),
    )
    grid = (_cdiv(p.seqlen_k, variant.block_n) * p.batch * p.heads_k, 1, 1)
    _launch_dynamic_smem(variant, grid, _kernels.TC_BWD_THREADS, args, _kernels.tc_bwd_smem_bytes(variant))
    elements = p.batch * p.heads * p.seqlen_q * p.headdim
    convert = _kernels.get_kernel(_kernels.Variant("tc_bwd_dq_convert", variant.dtype))
    convert(
        (min(_cdiv(elements, _kernels.TC_BWD_CONVERT_THREADS), 1 << 16), 1, 1), (_kernels.TC_BWD_CONVERT_THREADS, 1, 1),
        (dq_accum, dq, *_strides(dq), numpy.int32(p.seqlen_q), numpy.int32(p.heads), numpy.int32(p.headdim),
         numpy.int32(dq_ld), numpy.int32(splits), split_stride, numpy.int64(elements), _scale(p)),
    )
