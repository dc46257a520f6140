"""What the kernel families share: the device facts dispatch reads, the operands as the kernels take
them, the argument structs (``AttnArgs`` and the structs of each direction, written into a plan under
construction, cupyflash/_plan.py), and the small kernels of every family's calls: the backward's row
kernels (kernels_cu/common/bwd_rows.cu) and the device checks of packed batches (common/checks.cu)."""

import dataclasses
import functools

import cupy
import numpy

from .. import _dropout, _kernels, _params, _plan, _problem


def cdiv(a, b):
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class Device:
    """What dispatch needs of a GPU."""

    capability: int  # e.g. 90
    smem_optin: int  # per-block opt-in shared memory, bytes
    sm_count: int = 1  # multiprocessors (persistent grids launch one CTA per SM)
    l2_bytes: int = 50 * 2**20  # L2 cache (the Hopper forward's schedule keeps its working set in it)


@functools.lru_cache(maxsize=None)
def _device(device_id):
    device = cupy.cuda.Device(device_id)
    attributes = device.attributes
    return Device(int(device.compute_capability), attributes["MaxSharedMemoryPerBlockOptin"],
                  attributes["MultiProcessorCount"], attributes["L2CacheSize"])


def current_device():
    """The :class:`Device` of CuPy's current device (cached per device)."""
    return _device(cupy.cuda.Device().id)


def dtype_name(dtype):
    return numpy.dtype(dtype).name


def readable(x):
    """``(x as the kernels read it, the conversion a plan repeats or None)``: ``x`` itself when its last
    axis is contiguous (any other strides are fine), else one contiguous copy."""
    itemsize = x.dtype.itemsize
    if all(s % itemsize == 0 for s in x.strides) and (x.shape[-1] == 1 or x.strides[-1] == itemsize):
        return x, None
    return cupy.ascontiguousarray(x), cupy.ascontiguousarray


def contiguous(x):
    """``(x, None)`` for a C-contiguous ``x`` (or None), else its contiguous copy and the conversion."""
    if x is None or x.flags.c_contiguous:
        return x, None
    return cupy.ascontiguousarray(x), cupy.ascontiguousarray


def vec_loads(*arrays):
    """1 when every base pointer and row and head stride is 16-byte aligned (cp.async), else 0."""
    return int(all(_plan.aligned16(x) and all(s % 16 == 0 for s in x.strides[:-1]) for x in arrays))


def function(variant, smem=0):
    """The driver function of ``variant`` on the current device, allowed ``smem`` bytes of dynamic shared
    memory."""
    kernel = _kernels.get_kernel(variant)
    # Reading the attribute asks the driver each time: remember what each kernel was given.
    if smem > _smem_set.get(id(kernel), 0):
        if kernel.max_dynamic_shared_size_bytes < smem:
            kernel.max_dynamic_shared_size_bytes = smem
        _smem_set[id(kernel)] = smem
    return kernel.kernel.ptr


#: id of a compiled kernel (they live as long as the process) -> dynamic shared memory it allows.
_smem_set = {}


def attn(p, q, k, v, lists=None, vec=None):
    """An ``AttnArgs`` as a tuple of its fields, from problem ``p`` (its arrays may be plan slots) and its
    operands; ``lists`` are the block mask's :class:`~cupyflash._block_mask.TileLists` at the kernel's
    tile shape (None without a block mask); ``vec`` overrides vec_loads(q, k, v)."""
    batched = not p.varlen
    alibi, alibi_batch_stride = 0, 0
    if p.alibi_slopes is not None:
        alibi = _params.pointer(p.alibi_slopes)
        alibi_batch_stride = p.heads if p.alibi_slopes.ndim == 2 else 0
    return (
        _params.tensor(q, batched), _params.tensor(k, batched), _params.tensor(v, batched),
        _params.pointer(p.cu_seqlens_q), _params.pointer(p.cu_seqlens_k), _params.pointer(p.seqused_k), alibi,
        alibi_batch_stride, p.softmax_scale, p.softcap, p.batch, p.heads, p.heads_k, p.headdim, p.headdim_v,
        p.seqlen_q, p.seqlen_k, p.total_q, p.total_k, p.window_left, p.window_right,
        vec_loads(q, k, v) if vec is None else vec, sparse(p.block_mask, lists) if lists is not None else _NO_SPARSE,
        dropout(p), _params.pointer(p.sinks),
        mod_buffers(p.user_buffers), mod_buffers(p.block_mask.mask_buffers_on(cupy) if p.user_mask is not None else None),
        _params.pointer(p.q_descale), _params.pointer(p.k_descale), _params.pointer(p.v_descale),
        p.q_descale.shape[1] if p.q_descale is not None else p.heads_k,
    )


def user_code(p, fast=False):
    """The generated code of problem ``p``'s score_mod and mask_mod (a _kernels.UserCode), or None;
    ``fast`` for the 16-bit tensor-core kernels (the score_mod's float functions in their fast forms)."""
    if p.user_score is None and p.user_mask is None:
        return None
    return _kernels.user_code(p.user_score, p.user_mask, fast)


def mod_buffers(buffers):
    """A ``ModBuffers`` (kernels_cu/common/user_mod.cuh) as a tuple of its fields: the address and sizes of
    each of ``buffers`` (C-contiguous arrays or plan slots on the device; None: none). An empty buffer
    gets the address of a zero (:func:`_zero_element`): the kernels' loads read element 0 of a buffer
    whether or not the index is in range, and discard it when it is not."""
    if not buffers:
        return _NO_MOD_BUFFERS
    rows = [(_params.pointer(x) if x.size else _zero_element(), tuple(x.shape) + (0,) * (_params.MAX_RANK - x.ndim))
            for x in buffers]
    return (rows + [_NO_MOD_BUFFER] * (_params.MAX_BUFFERS - len(rows)),)


_ZERO_ELEMENTS = {}


def _zero_element():
    """The address of 8 zero bytes on the current device (one allocation per device, kept)."""
    device = cupy.cuda.Device().id
    if device not in _ZERO_ELEMENTS:
        _ZERO_ELEMENTS[device] = cupy.zeros(1, numpy.float64)
    return _ZERO_ELEMENTS[device].data.ptr


_NO_MOD_BUFFER = (0, (0,) * _params.MAX_RANK)
_NO_MOD_BUFFERS = ([_NO_MOD_BUFFER] * _params.MAX_BUFFERS,)


def mod_grads(p, local=False):
    """A ``ModGrads`` as a tuple: the address of each of problem ``p``'s buffer-gradient accumulators (None:
    0), exact sums with ``p.user_grads_exact``, and with ``local`` the offsets of their parts in a kernel's
    shared-memory sums (:func:`local_grad_floats`)."""
    grads = list(p.user_grads or ())
    pointers = [_params.pointer(g) for g in grads] + [0] * (_params.MAX_BUFFERS - len(grads))
    offsets = [0]
    for g in grads + [None] * (_params.MAX_BUFFERS - len(grads)):
        offsets.append(offsets[-1] + (g.size if local and g is not None else 0))
    return (pointers, offsets, int(p.user_grads_exact))


def local_grad_floats(p):
    """Floats of the score_mod buffers' gradients that a backward kernel sums per CTA in shared memory:
    all of them (float32 accumulators of 16-bit problems); 0 when the function reads no float buffer,
    and in the deterministic backward (exact sums, added straight into their words)."""
    if p.user_score is None or not p.user_score.buffer_gradients or p.user_grads_exact:
        return 0
    return sum(g.size for g in p.user_grads or () if g is not None)


#: int64 words of one element's exact sum (kernels_cu/common/exact_sum.cuh's exact_sum_slots), by the
#: accumulation dtype.
EXACT_SUM_SLOTS = {"float32": 13, "float64": 71}
#: The deterministic backward's buffer gradients from their exact sums (kernels_cu/common/exact_sum.cu): a
#: thread per element, grid-stride over at most FINISH_MAX_CTAS CTAs of FINISH_THREADS.
FINISH_EXACT = _kernels.Kernel("finish_exact_sums", "common/exact_sum.cu", ("float32", "float64"))
FINISH_THREADS = 256
FINISH_MAX_CTAS = 4096


def plan_finish_exact(b, words, out):
    """Plan ``b`` launches the conversion of the exact sums ``words`` (int64, exact_sum_slots per element)
    into ``out`` (float32 or float64)."""
    if out.size:
        args = b.struct(_params.FINISH_EXACT_ARGS)
        args[0] = (_params.pointer(words), _params.pointer(out), out.size)
        ctas = min(cdiv(out.size, FINISH_THREADS), FINISH_MAX_CTAS)
        b.launch(function(FINISH_EXACT.variant(out.dtype.name)), (ctas, 1, 1), FINISH_THREADS, (args,))


def dropout(p):
    """A ``DropoutArg`` as a tuple of its fields (kernels_cu/common/dropout.cuh; cupyflash/_dropout.py)."""
    if not p.dropout:
        return _NO_DROPOUT
    return (p.dropout_seed, p.dropout_offset, _dropout.threshold(p.dropout_p), _dropout.keep_scale(p.dropout_p), 1)


_NO_DROPOUT = (0, 0, 0, 1.0, 0)


def sparse(mask, lists):
    """A ``BlockSparseArg`` as a tuple of its fields, from a block mask and its lists at one tile shape."""
    layout = mask.layout_on(cupy)
    batch_slices, head_slices = layout.shape[:2]
    slot, bits = mask.element_bits_on(cupy) or (None, None)
    return (
        _params.pointer(lists.kv_count), _params.pointer(lists.kv_index), _params.pointer(lists.q_count),
        _params.pointer(lists.q_index), _params.pointer(layout),
        head_slices if batch_slices > 1 else 0, 1 if head_slices > 1 else 0,
        lists.tile_q, lists.tile_k, lists.q_tiles, lists.k_tiles, *mask.block_size, *layout.shape[2:],
        _params.pointer(slot), _params.pointer(bits),
    )


_NO_SPARSE = (0,) * len(_params.BLOCK_SPARSE_ARG.names)


def sparse_lists(b, p, tile_q, tile_k):
    """The block mask's lists at a kernel's tile shape, or None without a block mask; plan ``b`` keeps them
    (and the mask's device layout) alive."""
    if p.block_mask is None:
        return None
    lists = p.block_mask.tile_lists(cupy, tile_q, tile_k)
    b.keep(lists, p.block_mask.layout_on(cupy))
    if p.user_mask is not None:
        b.keep(p.block_mask.mask_buffers_on(cupy), p.block_mask.element_bits_on(cupy))
    return lists


def lse_strides(p):
    """(batch, head) strides of lse-shaped arrays: (batch, heads, seqlen_q) or packed (heads, total_q)."""
    if p.varlen:
        return 0, p.total_q
    return p.heads * p.seqlen_q, p.seqlen_q


def fwd_args(b, p, q, k, v, out, lse, lists):
    """The ``FwdArgs`` of a forward call, a struct of plan ``b``."""
    args = b.struct(_params.FWD_ARGS)
    args[0] = (attn(p, q, k, v, lists), _params.tensor(out, not p.varlen), _params.rows(lse, *lse_strides(p)),
               _params.pointer(p.max_score))
    return args


#: The dQ fields of a BwdArgs for the families without a dQ buffer.
NO_DQ_ACCUM = ((0, 0, 0), 0, 0, 0, 0, 0, 0)


def bwd_args(b, p, dout, q, k, v, out, lse, delta, dq, dk, dv, lists, dq_fields=NO_DQ_ACCUM):
    """The ``BwdArgs`` of a backward call, a struct of plan ``b``, filled by one tuple assignment.
    ``dq_fields``: the tensor-core families' dQ buffer fields, (dq_accum RowsArg tuple, dq_turns,
    dq_split_stride, turns_split_stride, dq_ld, dq_splits, deterministic). tile_group is 1 and
    tail_pairs 0 (the sm90 backward sets its own)."""
    batched = not p.varlen
    strides = lse_strides(p)
    args = b.struct(_params.BWD_ARGS)
    # The backward streams dO with cp.async too.
    args[0] = (attn(p, q, k, v, lists, vec=vec_loads(q, k, v, dout)),
               *(_params.tensor(x, batched) for x in (out, dout, dq, dk, dv)),
               _params.rows(lse, *strides), _params.rows(delta, *strides), *dq_fields, 1, 0, mod_grads(p),
               _params.pointer(p.sink_terms), 0, 0, 0, 0, 0)
    return args


def flat_rows(b, args, p):
    """``args`` for the kernels that walk rows, not sequences (delta, dQ conversion): a packed problem is
    one batch entry of total_q rows (a copy, in plan ``b``)."""
    if not p.varlen:
        return args
    flat = b.struct(_params.BWD_ARGS)
    flat[...] = args
    flat["attn"]["batch"] = 1
    flat["attn"]["seqlen_q"] = p.total_q
    return flat


#: The backward's row kernels (kernels_cu/common/bwd_rows.cu): CTAs of ROW_THREADS threads, grid-stride
#: loops over at most ROW_KERNEL_MAX_CTAS of them.
DELTA = _kernels.Kernel("bwd_delta", "common/bwd_rows.cu", _kernels.ALL_DTYPES)
DQ_CONVERT = _kernels.Kernel("bwd_dq_convert", "common/bwd_rows.cu", _kernels.ALL_DTYPES)
ROW_THREADS = 256
ROW_KERNEL_MAX_CTAS = 1 << 16
#: Rows of one (batch entry, head) that a warp of the delta and dQ-conversion kernels takes at a time
#: (kernels_cu/common/bwd_rows.cu, RowRun): located once, with 32-bit divisions.
ROW_RUN = 16


def row_runs(p):
    """RowRun::count of the row kernels' (flat) problem: ROW_RUN-row runs of every (batch entry, head)."""
    if p.varlen:
        return p.heads * cdiv(p.total_q, ROW_RUN)
    return p.batch * p.heads * cdiv(p.seqlen_q, ROW_RUN)


def int32_arg(b, value):
    """An int32 kernel argument of plan ``b``."""
    arg = b.struct(numpy.dtype(numpy.int32))
    arg[0] = value
    return arg


def plan_delta(b, p, args):
    """delta = rowsum(dO * O) into args' delta (and, where args hold them, the dQ buffers and turn
    counters zeroed, and the sinks' per-row terms written): a warp per ROW_RUN rows, a power-of-two group
    of lanes per row, 16 bytes each."""
    per_lane = 16 // p.dtype.itemsize
    lanes = 1
    while lanes < 32 and per_lane * lanes < p.headdim_v:
        lanes *= 2
    ctas = min(cdiv(row_runs(p), ROW_THREADS // 32), ROW_KERNEL_MAX_CTAS)
    b.launch(function(DELTA.variant(dtype_name(p.dtype))), (ctas, 1, 1), ROW_THREADS,
             (flat_rows(b, args, p), int32_arg(b, lanes), int32_arg(b, ROW_RUN)))


def plan_dq_convert(b, p, args):
    """dQ = softmax_scale * (the sum of the float32 buffers), rounded to the inputs' dtype: a warp per row,
    ROW_RUN rows at a time."""
    ctas = min(cdiv(row_runs(p), ROW_THREADS // 32), ROW_KERNEL_MAX_CTAS)
    b.launch(function(DQ_CONVERT.variant(dtype_name(p.dtype))), (ctas, 1, 1), ROW_THREADS,
             (flat_rows(b, args, p), int32_arg(b, ROW_RUN)))


#: The device-side check of a packed batch (kernels_cu/common/checks.cu), for calls that must not
#: synchronize with the host: CTAs of CHECK_THREADS threads, at most FILL_MAX_CTAS of them, and few
#: enough that all their checks read at most CHECK_MAX_READS entries of cu_seqlens.
VARLEN_CHECK_FILL = _kernels.Kernel("varlen_check_fill", "common/checks.cu", ())
CHECK_THREADS = 256
FILL_MAX_CTAS = 1024
CHECK_MAX_READS = 1 << 22
#: The bit pattern of a quiet NaN of each dtype.
_NAN_BITS = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000, "float64": 0x7FF8000000000000}


def plan_varlen_check(b, p, q, k, v, *results):
    """When the problem's cu_seqlens was not checked on the host, a launch of plan ``b`` after the call's
    kernels that turns every element of up to three contiguous ``results`` (slots) into NaN if it is
    malformed."""
    if not p.check_on_device:
        return
    args = b.struct(_params.ATTN_ARGS)
    args[0] = attn(p, q, k, v)
    fill = b.struct(_params.NAN_FILL)
    for i, x in enumerate(results):
        fill["ptr"][0, i] = x.data.ptr
        fill["words"][0, i] = x.size
        fill["nan"][0, i] = _NAN_BITS[x.dtype.name]
        fill["width"][0, i] = x.dtype.itemsize
    ctas = min(cdiv(max(x.size for x in results), CHECK_THREADS), FILL_MAX_CTAS, CHECK_MAX_READS // (p.batch + 1))
    b.launch(function(VARLEN_CHECK_FILL.variant()), (max(ctas, 1), 1, 1), CHECK_THREADS, (args, fill))


#: cupyflash.dropout_mask on the GPU (kernels_cu/common/dropout_mask.cu): one thread per generator call,
#: grid-stride over at most DROPOUT_MASK_MAX_CTAS CTAs of DROPOUT_MASK_THREADS.
DROPOUT_MASK = _kernels.Kernel("dropout_mask", "common/dropout_mask.cu", ())
DROPOUT_MASK_THREADS = 256
DROPOUT_MASK_MAX_CTAS = 1 << 14


def dropout_mask(p, seed, offset, shape):
    """The keep mask of dropout (probability ``p``, checked ``seed`` and ``offset``) of ``shape``
    (batch, heads, seqlen_q, seqlen_k), as a CuPy bool array on the current device and stream."""
    mask = cupy.empty(shape, dtype=numpy.bool_)
    if mask.size == 0:
        return mask
    args = numpy.zeros(1, _params.DROPOUT_MASK_ARGS)
    args[0] = ((seed, offset, _dropout.threshold(p), _dropout.keep_scale(p), int(p > 0)), mask.data.ptr, *shape)
    batch, heads, seqlen_q, seqlen_k = shape
    calls = batch * heads * cdiv(seqlen_q, 16) * cdiv(seqlen_k, 32) * 32
    ctas = min(cdiv(calls, DROPOUT_MASK_THREADS), DROPOUT_MASK_MAX_CTAS)
    kernel = _kernels.get_kernel(DROPOUT_MASK.variant())
    kernel((ctas,), (DROPOUT_MASK_THREADS,), (args,))
    return mask


#: merge_attention_states on the GPU (kernels_cu/common/merge.cu): a warp per row, grid-stride over at most
#: MERGE_MAX_CTAS CTAs of MERGE_THREADS, up to _params.MERGE_PARTS parts a launch.
MERGE = _kernels.Kernel("merge_states", "common/merge.cu", _kernels.ALL_DTYPES, flags=("vectors",))
MERGE_THREADS = 256
MERGE_MAX_CTAS = 1 << 16


class _Copied:
    """The layout of the C-contiguous copy a merge plan's convert makes of an array (what
    PlanBuilder.input reads of the first call's array), without making it at build time."""

    class _Data:
        ptr = 0  # CuPy's pool aligns every allocation

    data = _Data()

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), numpy.dtype(dtype)
        step, strides = self.dtype.itemsize, []
        for n in reversed(self.shape):
            strides.append(step)
            step *= max(n, 1)
        self.strides = tuple(reversed(strides))


def _readable_out(out):
    """How a merge plan reads an out part: as it is, or (a last axis not of unit stride) copied on each
    run. Returns (the layout it reads, the run's convert or None)."""
    if out.strides[-1] == out.itemsize:
        return out, None
    return _Copied(out.shape, out.dtype), cupy.ascontiguousarray


def _readable_lse(lse, acc):
    """How a merge plan reads a part's lse: in the accumulation dtype ``acc`` and at unit row stride, as it
    is where it already is, else converted on each run. Returns (the layout it reads, the run's convert
    or None)."""
    if lse.dtype == acc and (lse.shape[-1] <= 1 or lse.strides[-1] == lse.itemsize):
        return lse, None

    def convert(x):
        return cupy.ascontiguousarray(x.astype(acc, copy=False))

    return _Copied(lse.shape, acc), convert


def _plan_merge_round(b, outs, lses, out, lse, packed, dtype):
    """One launch of plan ``b``: the rows of at most MERGE_PARTS parts (slots ``outs[i]``, ``lses[i]`` at
    unit row stride) merged into ``out`` and ``lse`` (slots)."""
    batch, seqlen, heads, headdim = (1,) + out.shape if packed else out.shape
    count = batch * seqlen * heads
    vec = 16 // out.dtype.itemsize
    size = lses[0].dtype.itemsize
    parts = [_params.tensor(o, not packed) for o in outs]
    rows = [_params.rows(x, 0 if packed else x.strides[0] // size, x.strides[-2] // size) for x in lses]
    vectors = headdim % vec == 0 and all(
        _plan.aligned16(o) and all(stride % vec == 0 for stride in t[1:]) for o, t in zip(outs, parts))
    padding = _params.MERGE_PARTS - len(parts)
    args = b.struct(_params.MERGE_ARGS)
    args[0] = (parts + [(0, 0, 0, 0)] * padding, rows + [(0, 0, 0)] * padding, _params.tensor(out, not packed),
               _params.rows(lse, 0 if packed else lse.strides[0] // lse.dtype.itemsize,
                            lse.strides[-2] // lse.dtype.itemsize), len(parts), batch, seqlen, heads, headdim)
    ctas = min(cdiv(count, MERGE_THREADS // 32), MERGE_MAX_CTAS)
    b.launch(function(MERGE.variant(dtype_name(dtype), vectors=vectors)), (ctas, 1, 1), MERGE_THREADS, (args,))


def plan_merge(b, outs, lses, packed):
    """(out, lse) slots of plan ``b`` over the union of the parts' keys, from the slots ``outs[i]``,
    ``lses[i]`` (readable: a unit last axis, lse in the accumulation dtype at unit row stride; checked by
    cupyflash._problem.merge_parts): one launch per MERGE_PARTS parts, each round's result the first part
    of the next, written in place (each value is read by the thread that rewrites it, before it does;
    cupyflash/_merge.py is the twin)."""
    out = b.output(outs[0].shape, outs[0].dtype)
    lse = b.output(lses[0].shape, lses[0].dtype)
    if lse.size == 0:  # no rows (rows with head dim 0 still get their lse)
        return out, lse
    take = _params.MERGE_PARTS
    _plan_merge_round(b, outs[:take], lses[:take], out, lse, packed, out.dtype)
    for first in range(take, len(outs), take - 1):
        _plan_merge_round(b, [out, *outs[first:first + take - 1]], [lse, *lses[first:first + take - 1]], out, lse,
                          packed, out.dtype)
    return out, lse


def merge_plan(outs, lses, packed):
    """The plan of a merge of the CuPy parts ``outs[i]``, ``lses[i]`` (checked), for parts of their
    layouts: its run takes them in that order (out_0, lse_0, out_1, lse_1, ...) and returns (out, lse)."""
    acc = _problem.lse_dtype(outs[0].dtype)
    b = _plan.PlanBuilder()
    slots = []
    for o, x in zip(outs, lses):
        slots.append((b.input(*_readable_out(o)), b.input(*_readable_lse(x, acc))))
    return b.build(plan_merge(b, [o for o, _ in slots], [x for _, x in slots], packed))


def merge_stacked_plan(out, lse, parts, packed):
    """The plan of a merge of ``parts`` parts stacked along the first axis of the CuPy ``out`` and ``lse``
    (checked), for arrays of their layouts: its run takes (out, lse) and returns the merged (out, lse).
    The parts are read where they lie, as views at their offsets (no array per part)."""
    acc = _problem.lse_dtype(out.dtype)
    b = _plan.PlanBuilder()
    read_out, read_lse = _readable_out(out), _readable_lse(lse, acc)
    whole_out, whole_lse = b.input(*read_out), b.input(*read_lse)
    out_array, lse_array = read_out[0], read_lse[0]
    outs = [b.view(whole_out, i * out_array.strides[0], out_array.shape[1:], out_array.strides[1:])
            for i in range(parts)]
    lses = [b.view(whole_lse, i * lse_array.strides[0], lse_array.shape[1:], lse_array.strides[1:])
            for i in range(parts)]
    return b.build(plan_merge(b, outs, lses, packed))


def merge(outs, lses, packed):
    """(out, lse) over the union of the parts' keys, from CuPy parts ``outs[i]``, ``lses[i]`` (checked by
    cupyflash._problem.merge_parts), on the current stream: :func:`merge_plan`'s plan, kept in the public
    API's plan cache under the parts' layouts (ring attention merges parts of one layout at every step)."""
    from .. import _api, _keys

    arrays = tuple(x for pair in zip(outs, lses) for x in pair)
    key = _keys.merge(arrays, packed)
    plan = _api.PLANS.get(key)
    if plan is None:
        plan = merge_plan(outs, lses, packed)
        if key is not None and lses[0].size:  # (a plan that launches nothing makes no graph: not kept)
            _api.PLANS.put(key, plan)
    return plan(*arrays)


#: BlockMask.from_mask_mod on the GPU (kernels_cu/common/mask_mod_blocks.cu): a CTA of 32 x 8 threads per
#: block of the layout, grid-stride over at most MASK_MOD_BLOCKS_MAX_CTAS CTAs.
MASK_MOD_BLOCKS = _kernels.Kernel("mask_mod_blocks", "common/mask_mod_blocks.cu", (), user_functions=True,
                                  user_required=True)
MASK_MOD_BLOCKS_MAX_CTAS = 1 << 16


def mask_mod_blocks(traced, buffers, batch, heads, seqlen_q, seqlen_k, block_size):
    """The block classes of traced mask_mod ``traced`` over its ``buffers`` (C-contiguous, on the current
    device): ``(some, every)``, bool (batch, heads, rows, cols) CuPy arrays on the current stream."""
    block_q, block_k = block_size
    rows, cols = cdiv(seqlen_q, block_q), cdiv(seqlen_k, block_k)
    some = cupy.empty((batch, heads, rows, cols), dtype=numpy.bool_)
    every = cupy.empty_like(some)
    args = numpy.zeros(1, _params.MASK_MOD_BLOCKS_ARGS)
    args[0] = (mod_buffers(buffers), some.data.ptr, every.data.ptr, batch, heads, seqlen_q, seqlen_k, block_q, block_k,
               rows, cols)
    kernel = _kernels.get_kernel(MASK_MOD_BLOCKS.variant(user=_kernels.user_code(None, traced)))
    kernel((min(some.size, MASK_MOD_BLOCKS_MAX_CTAS),), (32, 8), (args,))
    return some, every


#: The partial blocks' pairs as bits (kernels_cu/common/mask_mod_blocks.cu's mask_mod_bits): a CTA of
#: MASK_MOD_BITS_THREADS per slot, grid-stride over at most MASK_MOD_BLOCKS_MAX_CTAS CTAs.
MASK_MOD_BITS = _kernels.Kernel("mask_mod_bits", "common/mask_mod_blocks.cu", (), user_functions=True,
                                user_required=True)
MASK_MOD_BITS_THREADS = 256


def mask_mod_bits(traced, buffers, heads, seqlen_q, seqlen_k, block_size, slot, cells):
    """The bits of traced mask_mod ``traced`` at every pair of the blocks ``cells`` (int64 linear cells of
    ``slot``'s (batch, heads, rows, cols), one per slot, in slot order): a uint32 CuPy array of
    ``block_q * block_k / 16`` words a slot, on the current stream; ``slot`` becomes -1 at blocks where the
    function reads out of range."""
    block_q, block_k = block_size
    rows, cols = slot.shape[2:]
    bits = cupy.empty(cells.size * block_q * block_k // 16, dtype=numpy.uint32)
    args = numpy.zeros(1, _params.MASK_MOD_BITS_ARGS)
    args[0] = (mod_buffers(buffers), slot.data.ptr, cells.data.ptr, bits.data.ptr, cells.size, heads, seqlen_q,
               seqlen_k, block_q, block_k, rows, cols)
    kernel = _kernels.get_kernel(MASK_MOD_BITS.variant(user=_kernels.user_code(None, traced)))
    kernel((min(cells.size, MASK_MOD_BLOCKS_MAX_CTAS),), (MASK_MOD_BITS_THREADS,), (args,))
    return bits


#: cupyflash.apply_rotary on the GPU (kernels_cu/common/rotary.cu): a thread per rotated pair or copied
#: column, grid-stride over at most ROTARY_MAX_CTAS CTAs of ROTARY_THREADS.
ROTARY = _kernels.Kernel("rotary_apply", "common/rotary.cu", _kernels.ALL_DTYPES, flags=("float32_tables",))
ROTARY_THREADS = 256
ROTARY_MAX_CTAS = 1 << 16


def rotary(r, x, cos, sin, out):
    """Launches the rotary embedding of checked call ``r`` (cupyflash._problem.Rotary) from ``x`` into
    ``out`` (x itself when in place) on the current stream."""
    packed = r.cu_seqlens is not None
    batched = not packed
    rows = x.shape[0] if packed else x.shape[0] * x.shape[1]
    heads, headdim = x.shape[-2:]
    half = r.rotary_dim // 2
    copy_rest = out is not x
    cos, sin = cupy.ascontiguousarray(cos), cupy.ascontiguousarray(sin)
    work = rows * heads * (half + (headdim - 2 * half if copy_rest else 0))
    if work == 0:
        return out
    offsets = None if isinstance(r.offsets, int) else r.offsets
    args = numpy.zeros(1, _params.ROTARY_ARGS)
    args[0] = (
        _params.tensor(x, batched), _params.tensor(out, batched), cos.data.ptr, sin.data.ptr,
        _params.pointer(r.cu_seqlens), _params.pointer(offsets), rows, r.offsets if offsets is None else 0,
        r.cu_seqlens.shape[0] - 1 if packed else x.shape[0], 0 if packed else x.shape[1], heads, headdim, half,
        cos.shape[0], int(r.interleaved), int(r.conjugate), int(copy_rest),
    )
    ctas = min(cdiv(work, ROTARY_THREADS), ROTARY_MAX_CTAS)
    variant = ROTARY.variant(dtype_name(x.dtype), float32_tables=cos.dtype == numpy.float32 and x.dtype != numpy.float32)
    _kernels.get_kernel(variant)((ctas,), (ROTARY_THREADS,), (args,))
    return out


#: The maximum score's decoding (kernels_cu/common/max_score.cu): (batch, heads) images into float32.
MAX_SCORE_DECODE = _kernels.Kernel("max_score_decode", "common/max_score.cu", ())
MAX_SCORE_THREADS = 256


def plan_max_score_decode(b, images, top):
    """The launch of plan ``b`` that decodes the maximum score's ``images`` (a zeroed workspace the
    forward's rows raise, FwdArgs.max_score) into the float32 output ``top`` (slots of one shape)."""
    args = b.struct(_params.MAX_SCORE_DECODE_ARGS)
    count = int(numpy.prod(top.shape))
    args[0] = (_params.pointer(images), _params.pointer(top), count)
    ctas = max(1, min(cdiv(count, MAX_SCORE_THREADS), 1024))
    b.launch(function(MAX_SCORE_DECODE.variant()), (ctas, 1, 1), MAX_SCORE_THREADS, (args,))
