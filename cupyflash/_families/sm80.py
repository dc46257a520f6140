"""The sm80 family: tensor-core kernels (mma.sync, ldmatrix, cp.async) for float16 and bfloat16 with
head dims up to 256, a float32 forward on the bfloat16 tensor cores (each value in three exact
parts) and a float64 forward on the float64 tensor cores, up to head dim 128, on compute capability
8.0 and newer. kernels_cu/sm80/tile.cuh and bwd_tile.cuh
describe the tiles; bench/NOTES.md has the measurements behind the tile tables below."""

import ml_dtypes
import numpy

from .. import _kernels, _params
from .._problem import acc_dtype, lse_dtype
from . import common

#: Compute capability from which the mma.sync kernels run.
MIN_CAPABILITY = 80
#: Shared memory reserved at the end of each kernel's for its per-CTA state (kCtaStateBytes).
CTA_STATE_BYTES = 1024

#: Forward tiles: head-dim bucket -> (keys per tile kBlockN, 16-row m-tiles per warp), preferred first;
#: dispatch takes the first whose shared memory fits the device. Buckets cover headdim and headdim_v up
#: to 256.
FWD_TILES = {
    32: ((64, 2),),
    64: ((64, 2),),
    96: ((32, 2),),
    128: ((32, 2),),
    160: ((64, 1), (32, 1)),
    192: ((64, 1), (32, 1)),
    224: ((64, 1), (32, 1)),
    256: ((64, 1), (32, 1)),
}
#: The float32 forward's tiles (kernels_cu/sm80/operands.cuh), as FWD_TILES: 16 rows per warp, 32 keys
#: per tile, since each operand's three parts take three times a 16-bit operand's registers; 16 keys
#: where 32 do not fit (its operands in three bfloat16 planes, 6 bytes an element: head dims 96 and 128
#: in the 163 KB of sm_80, 64 in the 99 KB of sm_86/sm_89).
FWD_FP32_TILES = {32: ((32, 1),), 64: ((32, 1), (16, 1)), 96: ((32, 1), (16, 1)), 128: ((32, 1), (16, 1))}
#: The float64 forward's tiles (the float64 tensor cores, kernels_cu/sm80/operands.cuh), as FWD_TILES: 16
#: rows per warp; 32-key tiles, or 16: for head dims 96 and 128 always (at 32 keys their O, 64 doubles
#: a thread at d128, and the split sums spilled 120-170 bytes), for 64 in the 99 KB of sm_86/sm_89
#: (where 96 and 128 fit no tile and run the general kernels).
FWD_FP64_TILES = {32: ((32, 1),), 64: ((32, 1), (16, 1)), 96: ((16, 1),), 128: ((16, 1),)}
#: Shared memory of a float64 forward CTA above which it takes one K/V stage (Sm80FwdTraits::kTwoCtaBytes:
#: two 4-warp CTAs per SM in sm_90's 227 KB; head dim 128).
FWD_TWO_CTA_BYTES = 113 * 1024
#: Query rows per CTA of the forward (Sm80FwdTraits::kBlockM), and of the float64 forward.
FWD_BLOCK_M = 128
FWD_FP64_BLOCK_M = 64

#: Backward tiles: head-dim bucket -> (keys per CTA kBlockN, queries per iteration kBlockM, query buffers
#: kStages), preferred first. The first fits the H100/H200 (227 KB per block); each later one is there
#: for a smaller budget: the 163 KB of sm_80 or the 99 KB of sm_86/sm_89 (head dims 160 and up do not
#: fit the latter and take the general path there). Every tile runs 8 warps.
BWD_TILES = {
    32: ((128, 128, 2), (128, 64, 2)),
    64: ((128, 128, 2), (128, 64, 2), (128, 64, 1)),
    96: ((128, 64, 2), (64, 64, 1)),
    128: ((128, 64, 2), (128, 64, 1), (64, 64, 1)),
    160: ((64, 64, 2),),
    192: ((64, 64, 2), (64, 64, 1)),
    224: ((64, 64, 2), (64, 64, 1)),
    256: ((64, 64, 2), (64, 64, 1)),
}
#: The float32 and float64 backward's tiles (products through Sm80Operands, kernels_cu/sm80/bwd_tile.cuh),
#: as BWD_TILES: buckets 64 and 128 (96 runs as 128), one tile each, sized for the H100/H200's shared
#: memory (float64 at 128: 32 keys by 32 queries; its accumulators take twice the registers).
BWD_FP32_TILES = {64: ((64, 64, 2),), 128: ((64, 64, 1),)}
BWD_FP64_TILES = {64: ((64, 32, 1),), 128: ((32, 32, 1),)}
#: Threads per CTA of the backward (Sm80BwdTraits::kThreads).
BWD_THREADS = 256
#: float32 dQ buffers of the deterministic backward: the ordered sum runs per buffer, so without a
#: causal mask its start-up chain (one hand-over per key tile) is this many times shorter.
DETERMINISTIC_DQ_SPLITS = 2
#: BwdArgs::deterministic (common/ordered_sum.cuh): later key tiles add first, launched first; or the
#: key tiles add in the order their walks reach a query tile, for launches whose CTAs of one (batch,
#: kv head) all run at once (sm90 only).
ORDERED_BY_LAUNCH, ORDERED_BY_WALK = 1, 2

FWD = _kernels.Kernel(
    "sm80_fwd", "sm80/fwd.cu", _kernels.HALF_DTYPES, ("headdim", "block_n", "m_tiles"),
    tuple((d, *tile) for d, choices in FWD_TILES.items() for tile in choices), ("score_mod", "max_score"),
    user_functions=True,
)
FWD_FP32 = _kernels.Kernel(
    "sm80_fwd_parts", "sm80/fwd.cu", ("float32",), ("headdim", "block_n", "m_tiles"),
    tuple((d, *tile) for d, choices in FWD_FP32_TILES.items() for tile in choices), ("score_mod", "tf32", "max_score"),
    user_functions=True,
)
FWD_FP64 = _kernels.Kernel(
    "sm80_fwd_dmma", "sm80/fwd.cu", ("float64",), ("headdim", "block_n", "m_tiles"),
    tuple((d, *tile) for d, choices in FWD_FP64_TILES.items() for tile in choices), ("score_mod", "max_score"),
    user_functions=True,
)
#: The float32 forward's pre-pass: its operands split into bfloat16 planes (kernels_cu/sm80/planes.cu).
PLANES = _kernels.Kernel("split_planes", "sm80/planes.cu", ("float32",), flags=("tf32",))
PLANE_THREADS = 256
BWD = _kernels.Kernel(
    "sm80_bwd", "sm80/bwd.cu", _kernels.HALF_DTYPES, ("headdim", "block_n", "block_m", "stages"),
    tuple((d, *tile) for d, choices in BWD_TILES.items() for tile in choices), ("score_mod",), user_functions=True,
)
BWD_FP32 = _kernels.Kernel(
    "sm80_bwd_parts", "sm80/bwd.cu", ("float32",), ("headdim", "block_n", "block_m", "stages"),
    tuple((d, *tile) for d, choices in BWD_FP32_TILES.items() for tile in choices), ("score_mod", "tf32"),
    user_functions=True,
)
BWD_FP64 = _kernels.Kernel(
    "sm80_bwd_dmma", "sm80/bwd.cu", ("float64",), ("headdim", "block_n", "block_m", "stages"),
    tuple((d, *tile) for d, choices in BWD_FP64_TILES.items() for tile in choices), ("score_mod",), user_functions=True,
)


def headdim_bucket(headdim, headdim_v, buckets=tuple(FWD_TILES)):
    """Smallest of ``buckets`` covering both head dims, or None when they exceed the largest."""
    needed = max(headdim, headdim_v)
    return next((bucket for bucket in sorted(buckets) if bucket >= needed), None)


def fwd_smem_bytes(variant):
    """Dynamic shared memory of a forward variant (Sm80FwdTraits::kSmemBytes).

    The Q tile plus 1-3 stages of K and V tiles (3 where they fit in 99 KB; 1 for float64 where 2 would
    pass FWD_TWO_CTA_BYTES), 16-bit rows padded by 8 elements (float32: three bfloat16 planes of them),
    float64 rows of Q and K by 4 and of V by 2 (Sm80FwdTraits::kLd, kLdV), and the per-CTA state. The
    kernel traps if launched with less than its traits require.
    """
    headdim = variant.param("headdim")
    # float32: three bfloat16 planes, rows padded as 16-bit rows (kernels_cu/sm80/planes.cu)
    itemsize = {"float32": 2 * 3, "float64": 8}.get(variant.dtype, 2)
    row_bytes = (headdim + (4 if itemsize == 8 else 8)) * itemsize
    v_row_bytes = (headdim + 2) * itemsize if itemsize == 8 else row_bytes
    q_bytes = fwd_block_m(variant) * row_bytes
    stage_bytes = variant.param("block_n") * (row_bytes + v_row_bytes)
    if q_bytes + 3 * stage_bytes + CTA_STATE_BYTES <= 99 * 1024:
        stages = 3
    elif itemsize == 8 and q_bytes + 2 * stage_bytes + CTA_STATE_BYTES > FWD_TWO_CTA_BYTES:
        stages = 1
    else:
        stages = 2
    return q_bytes + stages * stage_bytes + CTA_STATE_BYTES


def fwd_block_m(variant):
    """Query rows per CTA of a forward variant (Sm80FwdTraits::kBlockM)."""
    return FWD_FP64_BLOCK_M if variant.dtype == "float64" else FWD_BLOCK_M


def fwd_threads(variant):
    """Threads per CTA of a forward variant (Sm80FwdTraits::kThreads)."""
    return 32 * fwd_block_m(variant) // (16 * variant.param("m_tiles"))


def bwd_smem_bytes(variant):
    """Dynamic shared memory of a backward variant (Sm80BwdTraits::kSmemBytes).

    K and V tiles (block_n rows), ``stages`` buffers of Q and dO (block_m rows), rows padded by 8
    elements (float64: 4); P^T and dS^T (block_n x block_m, padded alike) in the inputs' dtype;
    ``stages`` buffers of lse and delta; the per-CTA state.
    """
    headdim, block_n, block_m, stages = (variant.param(n) for n in ("headdim", "block_n", "block_m", "stages"))
    itemsize = {"float32": 4, "float64": 8}.get(variant.dtype, 2)
    pad = 4 if itemsize == 8 else 8
    tiles = (2 * block_n + 2 * stages * block_m) * (headdim + pad) * itemsize
    probs = 2 * block_n * (block_m + pad) * itemsize
    # per row: lse (float64 for the wide dtypes) and delta (their accumulators' type)
    row_values = {2: 4 + 4, 4: 8 + 4, 8: 8 + 8}[itemsize]
    return tiles + probs + stages * block_m * row_values + CTA_STATE_BYTES


def _bucket(p, device, buckets):
    """The head-dim bucket of ``p`` when the tensor-core kernels can run it at all, else None."""
    if p.dtype.itemsize != 2 or device.capability < MIN_CAPABILITY:
        return None
    return headdim_bucket(p.headdim, p.headdim_v, buckets)


#: Floats of score_mod buffer gradients the backward sums per CTA in shared memory (64 KB: a T5 table of
#: 64 heads x 257 buckets); larger buffers take global atomics per element.
LOCAL_GRAD_MAX_FLOATS = 16384


def _select(p, device, half, fp32, fp64, smem_bytes, backward=False):
    """The variant of a pass for ``p``: of the (kernel, tiles) of its dtype (``half`` for float16/bfloat16),
    the first tile of its head-dim bucket whose ``smem_bytes`` fit the device; None where none does. The
    float32 kernel takes p's precision as its tf32 flag, a forward the maximum score (return_max_score) as
    its max_score flag. Dropout is the general family's for now, and so is the backward of a score_mod
    whose buffers take gradients but where the 16-bit kernel adds them: additive biases (derivatives that
    do not read the score), added after the mask, per CTA in shared memory."""
    if p.dropout:  # the general family's for now
        return None
    user = common.user_code(p, fast=p.dtype.itemsize == 2)
    if backward and p.user_score is not None and p.user_score.buffer_gradients and (
            p.dtype.itemsize != 2 or p.user_score.gradients_read_score):
        return None
    if p.dtype in (numpy.float32, numpy.float64) and device.capability >= MIN_CAPABILITY:
        kernel, tiles = fp32 if p.dtype == numpy.float32 else fp64
        bucket = headdim_bucket(p.headdim, p.headdim_v, tuple(tiles))
    else:
        kernel, tiles = half
        bucket = _bucket(p, device, tuple(tiles))
    if bucket is None:
        return None
    flags = {"tf32": p.precision == "tf32"} if kernel is fp32[0] else {}
    if not backward:
        flags["max_score"] = p.max_score is not None
    for tile in tiles[bucket]:
        variant = kernel.variant(common.dtype_name(p.dtype), (bucket, *tile), score_mod=p.score_mod, user=user, **flags)
        if smem_bytes(variant) <= device.smem_optin:
            return variant
    return None


def cxx_facts():
    """The family's constants and the shared memory and threads of every variant, as the kernels state
    them: (headers, {C++ expression: value}) for tests/test_compile.py."""
    facts = {"cupyflash::kCtaStateBytes": CTA_STATE_BYTES, "cupyflash::kOrderedByLaunch": ORDERED_BY_LAUNCH,
             "cupyflash::kOrderedByWalk": ORDERED_BY_WALK}
    for v in FWD.variants() + FWD_FP32.variants() + FWD_FP64.variants():
        traits = f"cupyflash::Sm80FwdTraits<{_kernels.CTYPES[v.dtype]}, {', '.join(map(str, v.tile))}>"
        facts[f"{traits}::kSmemBytes"] = fwd_smem_bytes(v)
        facts[f"{traits}::kThreads"] = fwd_threads(v)
        facts[f"{traits}::kBlockM"] = fwd_block_m(v)
    for v in BWD.variants() + BWD_FP32.variants() + BWD_FP64.variants():
        traits = f"cupyflash::Sm80BwdTraits<{_kernels.CTYPES[v.dtype]}, {', '.join(map(str, v.tile))}>"
        facts[f"{traits}::kSmemBytes"] = bwd_smem_bytes(v)
        facts[f"{traits}::kThreads"] = BWD_THREADS
    return ("sm80/tile.cuh", "sm80/bwd_tile.cuh", "common/ordered_sum.cuh"), facts


def plan_planes(b, p, x, heads, tf32):
    """float32 ``x`` ((batch, rows, heads, dim), or packed (rows, heads, dim)) as three bfloat16 planes,
    split in plan ``b`` (kernels_cu/sm80/planes.cu): a workspace of (batch, rows, 3 * heads, dim rounded up
    to 8), plane p of head h at head p * heads + h. The float32 forward reads these in its place."""
    dim = x.shape[-1]
    dim_planes = common.cdiv(dim, 8) * 8
    planes = b.workspace((*x.shape[:-2], 3 * heads, dim_planes), ml_dtypes.bfloat16)
    batched = not p.varlen
    batch, rows = (x.shape[0], x.shape[1]) if batched else (1, x.shape[0])
    src, dst = b.struct(_params.TENSOR_ARG), b.struct(_params.TENSOR_ARG)
    src[0], dst[0] = _params.tensor(x, batched), _params.tensor(planes, batched)
    chunks = batch * rows * heads * (dim_planes // 8)
    ctas = min(common.cdiv(chunks, PLANE_THREADS), common.ROW_KERNEL_MAX_CTAS)
    b.launch(common.function(PLANES.variant("float32", tf32=tf32)), (ctas, 1, 1), PLANE_THREADS,
             (src, dst, *(common.int32_arg(b, n) for n in (batch, rows, heads, dim, dim_planes))))
    return planes


class Sm80Forward:
    """float16/bfloat16, head dims up to 256, and float32 (in bfloat16 parts) and float64 up to 128,
    sm_80+: the first tile of the bucket that fits."""

    name = "sm80"
    kernels = (FWD, PLANES, FWD_FP32, FWD_FP64)
    user_functions = True

    def select(self, p, device, operands):
        return _select(p, device, (FWD, FWD_TILES), (FWD_FP32, FWD_FP32_TILES), (FWD_FP64, FWD_FP64_TILES), fwd_smem_bytes)

    def plan(self, b, variant, p, q, k, v, device):
        out, lse = b.output(p.out_shape, p.dtype), b.output(p.lse_shape, lse_dtype(p.dtype))
        if variant.kernel is FWD_FP32:
            tf32 = variant.param("tf32")
            q, k, v = (plan_planes(b, p, x, heads, tf32) for x, heads in ((q, p.heads), (k, p.heads_k), (v, p.heads_k)))
        block_m = fwd_block_m(variant)
        lists = common.sparse_lists(b, p, block_m, variant.param("block_n"))
        args = common.fwd_args(b, p, q, k, v, out, lse, lists)
        grid = (common.cdiv(p.seqlen_q, block_m) * p.batch * p.heads, 1, 1)
        smem = fwd_smem_bytes(variant)
        b.launch(common.function(variant, smem), grid, fwd_threads(variant), (args,), smem)
        return out, lse


class Sm80Backward:
    """float16/bfloat16, head dims up to 256, and float32 (in bfloat16 parts) and float64 up to 128,
    sm_80+: the first tile of the bucket that fits.

    dQ is summed over key tiles in float32 (float64 for float64) buffers of (batch, heads, seqlen_q,
    headdim rounded up to even) rows ((heads, total_q, ...) for packed batches) and converted at the end;
    with ``deterministic`` the key tiles add in a fixed order, into DETERMINISTIC_DQ_SPLITS buffers.
    Extra device memory besides the gradients: delta (4 bytes per query row, 8 for float64) and the dQ
    buffers.
    """

    name = "sm80"
    kernels = (common.DELTA, BWD, BWD_FP32, BWD_FP64, common.DQ_CONVERT)
    user_functions = True  # buffer gradients: the 16-bit kernel's, for additive biases

    def select(self, p, device, operands):
        return _select(p, device, (BWD, BWD_TILES), (BWD_FP32, BWD_FP32_TILES), (BWD_FP64, BWD_FP64_TILES), bwd_smem_bytes,
                       backward=True)

    def plan(self, b, variant, p, dout, q, k, v, out, lse, deterministic, device):
        block_n, block_m = variant.param("block_n"), variant.param("block_m")
        args, grads, _ = backward_buffers(b, p, dout, q, k, v, out, lse, block_m, block_n, deterministic)
        common.plan_delta(b, p, args)
        grid = (common.cdiv(p.seqlen_k, block_n) * p.batch * p.heads_k, 1, 1)
        smem = bwd_smem_bytes(variant)
        # A score_mod's buffer gradients: summed per CTA in shared memory past the kernel's own where they
        # fit (LOCAL_GRAD_MAX_FLOATS), else added straight into the accumulators.
        local = common.local_grad_floats(p)
        if 0 < local <= LOCAL_GRAD_MAX_FLOATS and smem + 4 * local <= device.smem_optin:
            args["score_grads"] = common.mod_grads(p, local=True)
            smem += 4 * local
        b.launch(common.function(variant, smem), grid, BWD_THREADS, (args,), smem)
        common.plan_dq_convert(b, p, args)
        return grads


def backward_buffers(b, p, dout, q, k, v, out, lse, block_m, block_n, deterministic, dq_align=2,
                     order=ORDERED_BY_LAUNCH, splits=DETERMINISTIC_DQ_SPLITS, in_place=False):
    """The ``BwdArgs`` of a tensor-core backward with tiles of ``block_m`` queries and ``block_n`` keys,
    in plan ``b``; the gradients (outputs); and the dQ buffers (workspace, float32; float64 for float64
    inputs), whose rows are the
    head dim rounded up to ``dq_align`` floats. The workspace also holds delta and, with
    ``deterministic``, the turn counters of the ordered sum, taken in ``order`` into ``splits``
    buffers; the delta kernel zeroes the buffers and the counters (common.plan_delta). Used by the sm90
    family too; with ``in_place`` (its float32 kernel, not deterministic) there are no buffers: the
    reductions add into dq itself (BwdArgs::dq_in_place, zeroed by the delta kernel), and the dQ
    buffers returned are None."""
    dq, dk, dv = (b.output(x.shape, p.dtype) for x in (q, k, v))
    delta = b.workspace(p.lse_shape, acc_dtype(p.dtype))
    if in_place:
        assert p.dtype == numpy.float32 and p.headdim % 4 == 0 and not deterministic, "float32 rows of 16 bytes"
        dq_fields = ((0, 0, 0), 0, 0, 0, p.headdim, 1, 0)
        args = common.bwd_args(b, p, dout, q, k, v, out, lse, delta, dq, dk, dv,
                               common.sparse_lists(b, p, block_m, block_n), dq_fields)
        args["dq_in_place"] = 1
        return args, (dq, dk, dv), None
    # Even rows keep every pair of the buffer 8-byte (float64: 16-byte) aligned for the vector reductions.
    dq_ld = common.cdiv(p.headdim, dq_align) * dq_align
    splits = splits if deterministic else 1
    dq_accum = b.workspace((splits, p.heads * p.query_rows * dq_ld), acc_dtype(p.dtype))
    # One turn counter per (buffer, batch, head, query tile) for the ordered sum; none otherwise (the
    # kernels read them only when deterministic).
    turns_per_split = p.batch * p.heads * common.cdiv(p.seqlen_q, block_m)
    turns = b.workspace((splits * turns_per_split,), numpy.int32) if deterministic else None
    accum_strides = (0, p.total_q) if p.varlen else (p.heads * p.seqlen_q, p.seqlen_q)
    dq_fields = (_params.rows(dq_accum, *accum_strides), _params.pointer(turns), dq_accum.shape[1], turns_per_split,
                 dq_ld, splits, order if deterministic else 0)
    args = common.bwd_args(b, p, dout, q, k, v, out, lse, delta, dq, dk, dv, common.sparse_lists(b, p, block_m, block_n),
                           dq_fields)
    return args, (dq, dk, dv), dq_accum


FORWARD = Sm80Forward()
BACKWARD = Sm80Backward()
