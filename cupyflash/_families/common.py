"""What the kernel families share: device limits, operands, launches, and the argument structs' common
part (``AttnArgs``), built once from a validated problem."""

import dataclasses
import functools

import cupy
import numpy

from .. import _kernels, _params
from .._validate import DELTA_ROWS_PER_CTA


def cdiv(a, b):
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Device:
    """What dispatch needs of a GPU."""

    capability: int  # e.g. 90
    smem_optin: int  # per-block opt-in shared memory, bytes


@functools.lru_cache(maxsize=None)
def _device(device_id):
    device = cupy.cuda.Device(device_id)
    return Device(int(device.compute_capability), device.attributes["MaxSharedMemoryPerBlockOptin"])


def current_device():
    """The :class:`Device` of CuPy's current device (cached per device)."""
    return _device(cupy.cuda.Device().id)


def dtype_name(dtype):
    return numpy.dtype(dtype).name


def operand(x):
    """``x`` itself when its last axis is contiguous (any other strides are fine), else one copy."""
    itemsize = x.dtype.itemsize
    if all(s % itemsize == 0 for s in x.strides) and (x.shape[-1] == 1 or x.strides[-1] == itemsize):
        return x
    return cupy.ascontiguousarray(x)


def vec_loads(*arrays):
    """1 when every base pointer and row and head stride is 16-byte aligned (cp.async), else 0."""
    return int(all(x.data.ptr % 16 == 0 and all(s % 16 == 0 for s in x.strides[:-1]) for x in arrays))


def launch(variant, grid, threads, args, smem=0):
    """Launches ``variant`` with one argument struct and ``smem`` bytes of dynamic shared memory."""
    kernel = _kernels.get_kernel(variant)
    if smem and kernel.max_dynamic_shared_size_bytes < smem:
        kernel.max_dynamic_shared_size_bytes = smem
    kernel(grid, (threads, 1, 1), (args,), shared_mem=smem)


def set_attn(field, p, q, k, v, lists=None):
    """Fills an ``AttnArgs`` from problem ``p`` and its operands; ``lists`` are the block mask's
    :class:`~cupyflash._block_mask.TileLists` at the kernel's tile shape (None without a block mask)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        _params.set_tensor(field[name], x, batched=not p.varlen)
    field["cu_seqlens_q"] = _params.pointer(p.cu_seqlens_q)
    field["cu_seqlens_k"] = _params.pointer(p.cu_seqlens_k)
    if p.alibi_slopes is not None:
        field["alibi_slopes"] = _params.pointer(p.alibi_slopes)
        field["alibi_batch_stride"] = p.heads if p.alibi_slopes.ndim == 2 else 0
    field["softmax_scale"] = p.softmax_scale
    field["softcap"] = p.softcap
    for name in ("batch", "heads", "heads_k", "headdim", "headdim_v", "seqlen_q", "seqlen_k", "total_q", "total_k",
                 "window_left", "window_right"):
        field[name] = getattr(p, name)
    field["vec_loads"] = vec_loads(q, k, v)
    if lists is not None:
        set_sparse(field["sparse"], p.block_mask, lists)


def set_sparse(field, mask, lists):
    """Fills a ``BlockSparseArg`` from a block mask and its lists at one tile shape."""
    layout = mask.layout_on(cupy)
    field["kv_count"] = _params.pointer(lists.kv_count)
    field["kv_index"] = _params.pointer(lists.kv_index)
    field["q_count"] = _params.pointer(lists.q_count)
    field["q_index"] = _params.pointer(lists.q_index)
    field["layout"] = _params.pointer(layout)
    batch_slices, head_slices = layout.shape[:2]
    field["slice_head_stride"] = 1 if head_slices > 1 else 0
    field["slice_batch_stride"] = head_slices if batch_slices > 1 else 0
    field["tile_q"], field["tile_k"] = lists.tile_q, lists.tile_k
    field["q_tiles"], field["k_tiles"] = lists.q_tiles, lists.k_tiles
    field["block_q"], field["block_k"] = mask.block_size
    field["layout_rows"], field["layout_cols"] = layout.shape[2:]


def sparse_lists(p, tile_q, tile_k):
    """The block mask's lists at a kernel's tile shape, or None without a block mask."""
    if p.block_mask is None:
        return None
    return p.block_mask.tile_lists(cupy, tile_q, tile_k)


def lse_strides(p):
    """(batch, head) strides of lse-shaped arrays: (batch, heads, seqlen_q) or packed (heads, total_q)."""
    if p.varlen:
        return 0, p.total_q
    return p.heads * p.seqlen_q, p.seqlen_q


def fwd_args(p, q, k, v, out, lse, lists):
    """The ``FwdArgs`` of a forward call."""
    args = _params.new(_params.FWD_ARGS)
    set_attn(args["attn"], p, q, k, v, lists)
    _params.set_tensor(args["out"], out, batched=not p.varlen)
    _params.set_rows(args["lse"], lse, *lse_strides(p))
    return args


def bwd_args(p, dout, q, k, v, out, lse, delta, dq, dk, dv, lists):
    """The ``BwdArgs`` of a backward call (the dQ accumulator fields are the tensor-core family's)."""
    args = _params.new(_params.BWD_ARGS)
    set_attn(args["attn"], p, q, k, v, lists)
    args["attn"]["vec_loads"] = vec_loads(q, k, v, dout)  # the backward streams dO with cp.async too
    for name, x in (("out", out), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        _params.set_tensor(args[name], x, batched=not p.varlen)
    _params.set_rows(args["lse"], lse, *lse_strides(p))
    _params.set_rows(args["delta"], delta, *lse_strides(p))
    return args


def flat_rows(args, p):
    """A copy of ``args`` for the kernels that walk rows, not sequences (delta, dQ conversion): a packed
    problem is one batch entry of total_q rows."""
    if not p.varlen:
        return args
    flat = args.copy()
    flat["attn"]["batch"] = 1
    flat["attn"]["seqlen_q"] = p.total_q
    return flat


DELTA = _kernels.Kernel("general_bwd_delta", "general_bwd.cu", _kernels.ALL_DTYPES)


def launch_delta(p, args):
    """delta = rowsum(dO * O) into args' delta, for either backward family."""
    rows = p.heads * p.query_rows
    launch(DELTA.variant(dtype_name(p.dtype)), (cdiv(rows, DELTA_ROWS_PER_CTA), 1, 1), 32 * DELTA_ROWS_PER_CTA,
           flat_rows(args, p))


#: The device-side check of a packed batch (kernels_cu/varlen_check.cu), for calls that must not
#: synchronize with the host.
VARLEN_CHECK = _kernels.Kernel("varlen_check", "varlen_check.cu", ())
FILL_NAN_IF = _kernels.Kernel("fill_nan_if", "varlen_check.cu", _kernels.ALL_DTYPES)
_FILL_THREADS = 256


def varlen_check(p, q, k, v):
    """A device flag set when the problem's cu_seqlens is malformed, or None when the host checked it."""
    if not p.check_on_device:
        return None
    bad = cupy.zeros(1, numpy.int32)
    args = _params.new(_params.ATTN_ARGS)
    set_attn(args, p, q, k, v)
    _kernels.get_kernel(VARLEN_CHECK.variant())((1, 1, 1), (_FILL_THREADS, 1, 1), (args, bad))
    return bad


def fill_nan_if(bad, *arrays):
    """Turns every element of the (contiguous) ``arrays`` into NaN when the device flag ``bad`` is set."""
    if bad is None:
        return
    for x in arrays:
        kernel = _kernels.get_kernel(FILL_NAN_IF.variant(dtype_name(x.dtype)))
        kernel((min(cdiv(x.size, _FILL_THREADS), 1024), 1, 1), (_FILL_THREADS, 1, 1), (bad, x, numpy.int64(x.size)))
