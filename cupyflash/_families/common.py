"""What the kernel families share: device limits, operands, launches, and the argument structs' common
part (``AttnArgs``), built once from a validated problem."""

import dataclasses
import functools

import cupy
import numpy
from cupy.cuda import function

from .. import _kernels, _params
from .._validate import DELTA_ROWS_PER_CTA


def cdiv(a, b):
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Device:
    """What dispatch needs of a GPU."""

    capability: int  # e.g. 90
    smem_optin: int  # per-block opt-in shared memory, bytes
    sm_count: int = 1  # multiprocessors (persistent grids launch one CTA per SM)


@functools.lru_cache(maxsize=None)
def _device(device_id):
    device = cupy.cuda.Device(device_id)
    attributes = device.attributes
    return Device(int(device.compute_capability), attributes["MaxSharedMemoryPerBlockOptin"],
                  attributes["MultiProcessorCount"])


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
    """Launches ``variant`` with its argument struct (or a tuple of arguments) and ``smem`` bytes of
    dynamic shared memory."""
    kernel = prepare(variant, smem)
    kernel(grid, (threads, 1, 1), tuple(by_address(a) for a in (args if isinstance(args, tuple) else (args,))),
           shared_mem=smem)


def prepare(variant, smem=0):
    """The compiled kernel of ``variant``, allowed ``smem`` bytes of dynamic shared memory."""
    kernel = _kernels.get_kernel(variant)
    # Reading the attribute asks the driver each time: remember what each kernel was given.
    if smem > _smem_set.get(id(kernel), 0):
        if kernel.max_dynamic_shared_size_bytes < smem:
            kernel.max_dynamic_shared_size_bytes = smem
        _smem_set[id(kernel)] = smem
    return kernel


def by_address(arg):
    """A kernel argument as CuPy should see it: a NumPy array (an argument struct, passed by value) as a
    pointer to its bytes. CuPy would read the address through ``__array_interface__``, which builds the
    description of a nested structured dtype anew on every call: about 70 us for a BwdArgs, most of
    the host time of a call. The array must live until the launch returns (the driver copies the
    bytes then)."""
    if isinstance(arg, numpy.ndarray):
        return function.CPointer(arg.ctypes.data)
    return arg


#: id of a compiled kernel (they live as long as the process) -> dynamic shared memory it allows.
_smem_set = {}


def attn(p, q, k, v, lists=None, vec=None):
    """An ``AttnArgs`` as a tuple of its fields, from problem ``p`` and its operands; ``lists`` are the
    block mask's :class:`~cupyflash._block_mask.TileLists` at the kernel's tile shape (None without a
    block mask); ``vec`` overrides vec_loads(q, k, v)."""
    batched = not p.varlen
    alibi, alibi_batch_stride = 0, 0
    if p.alibi_slopes is not None:
        alibi = _params.pointer(p.alibi_slopes)
        alibi_batch_stride = p.heads if p.alibi_slopes.ndim == 2 else 0
    return (
        _params.tensor(q, batched), _params.tensor(k, batched), _params.tensor(v, batched),
        _params.pointer(p.cu_seqlens_q), _params.pointer(p.cu_seqlens_k), _params.pointer(p.seqused_k), alibi, alibi_batch_stride,
        p.softmax_scale, p.softcap, p.batch, p.heads, p.heads_k, p.headdim, p.headdim_v, p.seqlen_q, p.seqlen_k,
        p.total_q, p.total_k, p.window_left, p.window_right, vec_loads(q, k, v) if vec is None else vec,
        sparse(p.block_mask, lists) if lists is not None else _NO_SPARSE,
    )


def set_attn(field, p, q, k, v, lists=None):
    """Fills an ``AttnArgs`` (see :func:`attn`)."""
    field[...] = attn(p, q, k, v, lists)


def sparse(mask, lists):
    """A ``BlockSparseArg`` as a tuple of its fields, from a block mask and its lists at one tile shape."""
    layout = mask.layout_on(cupy)
    batch_slices, head_slices = layout.shape[:2]
    return (
        _params.pointer(lists.kv_count), _params.pointer(lists.kv_index), _params.pointer(lists.q_count),
        _params.pointer(lists.q_index), _params.pointer(layout),
        head_slices if batch_slices > 1 else 0, 1 if head_slices > 1 else 0,
        lists.tile_q, lists.tile_k, lists.q_tiles, lists.k_tiles, *mask.block_size, *layout.shape[2:],
    )


_NO_SPARSE = (0,) * len(_params.BLOCK_SPARSE_ARG.names)


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
    args = numpy.empty(1, _params.FWD_ARGS)
    args[0] = (attn(p, q, k, v, lists), _params.tensor(out, not p.varlen), _params.rows(lse, *lse_strides(p)))
    return args


#: The dQ fields of a BwdArgs for the families without a dQ buffer.
NO_DQ_ACCUM = ((0, 0, 0), 0, 0, 0, 0, 0, 0)


def bwd_args(p, dout, q, k, v, out, lse, delta, dq, dk, dv, lists, dq_fields=NO_DQ_ACCUM):
    """The ``BwdArgs`` of a backward call, filled by one tuple assignment (field by field took about
    50 us, a fifth of a short call's host time). ``dq_fields``: the tensor-core families' dQ buffer
    fields, (dq_accum RowsArg tuple, dq_turns, dq_split_stride, turns_split_stride, dq_ld, dq_splits,
    deterministic)."""
    batched = not p.varlen
    strides = lse_strides(p)
    args = numpy.empty(1, _params.BWD_ARGS)
    # The backward streams dO with cp.async too.
    args[0] = (attn(p, q, k, v, lists, vec=vec_loads(q, k, v, dout)),
               *(_params.tensor(x, batched) for x in (out, dout, dq, dk, dv)),
               _params.rows(lse, *strides), _params.rows(delta, *strides), *dq_fields)
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


DELTA = _kernels.Kernel("general_bwd_delta", "general/bwd.cu", _kernels.ALL_DTYPES)


def launch_delta(p, args):
    """delta = rowsum(dO * O) into args' delta, for either backward family."""
    rows = p.heads * p.query_rows
    launch(DELTA.variant(dtype_name(p.dtype)), (cdiv(rows, DELTA_ROWS_PER_CTA), 1, 1), 32 * DELTA_ROWS_PER_CTA,
           flat_rows(args, p))


#: The device-side check of a packed batch (kernels_cu/common/checks.cu), for calls that must not
#: synchronize with the host.
VARLEN_CHECK = _kernels.Kernel("varlen_check", "common/checks.cu", ())
FILL_NAN_IF = _kernels.Kernel("fill_nan_if", "common/checks.cu", _kernels.ALL_DTYPES)
_FILL_THREADS = 256


def varlen_check(p, q, k, v):
    """A device flag set when the problem's cu_seqlens is malformed, or None when the host checked it."""
    if not p.check_on_device:
        return None
    bad = cupy.zeros(1, numpy.int32)
    args = _params.new(_params.ATTN_ARGS)
    set_attn(args, p, q, k, v)
    launch(VARLEN_CHECK.variant(), (1, 1, 1), _FILL_THREADS, (args, bad))
    return bad


def fill_nan_if(bad, *arrays):
    """Turns every element of the (contiguous) ``arrays`` into NaN when the device flag ``bad`` is set."""
    if bad is None:
        return
    for x in arrays:
        kernel = _kernels.get_kernel(FILL_NAN_IF.variant(dtype_name(x.dtype)))
        kernel((min(cdiv(x.size, _FILL_THREADS), 1024), 1, 1), (_FILL_THREADS, 1, 1), (bad, x, numpy.int64(x.size)))
