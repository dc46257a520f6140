"""The sm90 family: Hopper kernels (TMA, wgmma, warp specialization) for float16 and bfloat16, built for
``sm_90a`` and run only on compute capability 9.0 exactly (kernels_cu/sm90/fwd.cu describes the design;
bench/NOTES.md has the measurements behind the tile table).

The kernels read q, k and v through TMA tensor maps, which this module builds on the host with the
driver's ``cuTensorMapEncodeTiled`` (through ctypes: CuPy does not wrap it). A TMA needs 16-byte aligned
bases and strides; inputs that do not have them take the sm80 family's kernels.
"""

import ctypes
import functools

import cupy
import numpy

from .. import _kernels
from . import common, sm80

#: The only compute capability whose cubins these are (sm_90a code runs nowhere else).
CAPABILITY = 90
#: Query rows per CTA (Sm90FwdTraits::kBlockM) and threads: a producer and two consumer warpgroups.
FWD_BLOCK_M = 128
FWD_THREADS = 384
#: Shared memory of the per-CTA state, and the slack that aligns the tiles to 1024 bytes.
CTA_STATE_BYTES = 1024
ALIGN_SLACK = 1024

#: Forward tiles: (headdim, headdim_v) bucket -> (keys per tile, K/V stages). A problem takes the
#: cheapest bucket covering both of its head dims; the TMA zero-fills the columns past them.
FWD_TILES = {
    (64, 64): (128, 4),
    (96, 96): (128, 2),
    (128, 128): (128, 3),
    (192, 128): (128, 2),
    (192, 192): (96, 2),
    (256, 256): (80, 2),
}

#: Backward: keys per CTA (Sm90BwdTraits::kBlockN: two consumer warpgroups of 64) and threads.
BWD_BLOCK_N = 128
BWD_THREADS = 384
#: Backward tiles: (headdim, headdim_v) bucket -> (queries per tile, Q/dO stages). dK and dV stay in the
#: consumers' registers (headdim / 2 + headdim_v / 2 floats per thread) beside S^T and dP^T (block_m / 2
#: each): the buckets and tiles are those whose sum leaves room in 240 registers. Other head dims take
#: the sm80 kernels.
BWD_TILES = {
    (64, 64): (128, 2),
    (128, 128): (64, 2),
}

FWD = _kernels.Kernel(
    "sm90_fwd", "sm90/fwd.cu", _kernels.HALF_DTYPES, ("headdim", "headdim_v", "block_n", "stages"),
    tuple((*dims, *tile) for dims, tile in FWD_TILES.items()), ("score_mod",), arch="90a",
)
BWD = _kernels.Kernel(
    "sm90_bwd", "sm90/bwd.cu", _kernels.HALF_DTYPES, ("headdim", "headdim_v", "block_m", "stages"),
    tuple((*dims, *tile) for dims, tile in BWD_TILES.items()), ("score_mod",), arch="90a",
)


def _atoms(columns):
    return -(-columns // 64)


def fwd_smem_bytes(variant):
    """Dynamic shared memory of a forward variant (Sm90FwdTraits::kSmemBytes): the Q tile and ``stages``
    K and V tiles in 64-column atoms of 128 bytes per row, the state, and the alignment slack."""
    d, dv, block_n, stages = (variant.param(n) for n in ("headdim", "headdim_v", "block_n", "stages"))
    tiles = FWD_BLOCK_M * 128 * _atoms(d) + stages * block_n * 128 * (_atoms(d) + _atoms(dv))
    return ALIGN_SLACK + tiles + CTA_STATE_BYTES


def bwd_smem_bytes(variant):
    """Dynamic shared memory of a backward variant (Sm90BwdTraits::kSmemBytes): K and V (128 keys),
    ``stages`` Q and dO tiles, two dS^T buffers (128 x block_m, 16-bit), ``stages`` rows of lse and delta,
    the float32 dQ tile (block_m x headdim), the state, and the alignment slack."""
    d, dv, block_m, stages = (variant.param(n) for n in ("headdim", "headdim_v", "block_m", "stages"))
    tiles = (BWD_BLOCK_N + stages * block_m) * 128 * (_atoms(d) + _atoms(dv)) + 2 * BWD_BLOCK_N * block_m * 2
    return ALIGN_SLACK + tiles + stages * 2 * block_m * 4 + block_m * d * 4 + CTA_STATE_BYTES


@functools.lru_cache(maxsize=None)
def bucket(headdim, headdim_v, buckets=tuple(FWD_TILES)):
    """The cheapest (headdim, headdim_v) bucket covering both head dims, or None."""
    covering = [b for b in buckets if b[0] >= headdim and b[1] >= headdim_v]
    return min(covering, key=lambda b: (b[0] + b[1], b), default=None)


# ---- TMA tensor maps ----

#: CUtensorMapDataType of each 16-bit dtype, and the other enums cuTensorMapEncodeTiled takes.
_TMA_DTYPE = {"float16": 6, "bfloat16": 9}
_TMA_FLOAT32 = 7
_SWIZZLE_128B = 3
_L2_PROMOTION_128B = 2
_TMA_MAX_STRIDE = 1 << 40
#: The maps' dtype: three CUtensorMaps (Sm90FwdMaps; the kernel parameter is 64-byte aligned, which the
#: driver arranges when it copies the bytes).
#: Sm90Schedule: the work order flag and the device counter of dynamically handed-out tiles.
SCHEDULE = numpy.dtype({"names": ["longest_first", "next_work"], "formats": [numpy.int32, numpy.uint64],
                        "offsets": [0, 8], "itemsize": 16, "aligned": True})
MAPS = numpy.dtype({"names": ["q", "k", "v"], "formats": [(numpy.void, 128)] * 3, "offsets": [0, 128, 256],
                    "itemsize": 384, "aligned": True})
#: Sm90BwdMaps: q, k, v, dout and the float32 dQ buffers.
BWD_MAPS = numpy.dtype({"names": ["q", "k", "v", "dout", "dq_accum"], "formats": [(numpy.void, 128)] * 5,
                        "offsets": [0, 128, 256, 384, 512], "itemsize": 640, "aligned": True})


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    driver = ctypes.CDLL("libcuda.so.1")
    encode = driver.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    encode.restype = ctypes.c_int
    return encode


def _views(x, varlen):
    """(dims, byte strides) of the 4-D view (headdim, rows, heads, batch) of a (batch, rows, heads, dim)
    tensor, or of a packed (rows, heads, dim) one as a batch of one."""
    if varlen:
        rows, heads, dim = x.shape
        row_stride, head_stride = x.strides[:2]
        batch, batch_stride = 1, 16  # one entry: its stride is never used, but must be a multiple of 16
    else:
        batch, rows, heads, dim = x.shape
        batch_stride, row_stride, head_stride = x.strides[:3]
    return (dim, rows, heads, batch), (row_stride, head_stride, batch_stride)


def tma_addressable(x, varlen):
    """Whether a TMA can read ``x``: 16-byte aligned base, and every stride of an axis longer than one a
    positive multiple of 16 bytes below 2^40 (so a contiguous 16-bit tensor needs headdim % 8 == 0)."""
    dims, strides = _views(x, varlen)
    if x.data.ptr % 16:
        return False
    return all(n == 1 or (0 < s < _TMA_MAX_STRIDE and s % 16 == 0) for n, s in zip(dims[1:], strides))


#: Encoded maps by (address, dtype, dims, strides, box): a map depends on nothing else, and CuPy's
#: memory pool hands the same addresses out again, so repeated calls skip the driver.
_maps = {}
_MAX_CACHED_MAPS = 256


def tensor_map(x, varlen, box_rows):
    """The 128-byte CUtensorMap of ``x`` with a box of 64 columns by ``box_rows`` rows, 128-byte swizzle,
    out-of-bounds elements read as zeros."""
    dims, strides = _views(x, varlen)
    return _cached_map(x.data.ptr, _TMA_DTYPE[x.dtype.name], dims, strides, (64, box_rows, 1, 1))


def accum_map(dq_accum, p, dq_ld, box_rows):
    """The CUtensorMap of the float32 dQ buffers (sm80.backward_args) as the 5-D view (dq_ld, rows,
    heads, batch, buffer), with a box of 32 columns (128 bytes) by ``box_rows`` rows, 128-byte swizzle."""
    rows, batch = (p.total_q, 1) if p.varlen else (p.seqlen_q, p.batch)
    row_bytes = dq_ld * 4
    dims = (dq_ld, rows, p.heads, batch, dq_accum.shape[0])
    strides = (row_bytes, rows * row_bytes, p.heads * rows * row_bytes, dq_accum.strides[0])
    return _cached_map(dq_accum.data.ptr, _TMA_FLOAT32, dims, strides, (32, box_rows, 1, 1, 1))


def _cached_map(ptr, dtype_code, dims, strides, box):
    key = (ptr, dtype_code, dims, strides, box)
    encoded = _maps.get(key)
    if encoded is None:
        if len(_maps) >= _MAX_CACHED_MAPS:
            _maps.clear()
        encoded = _maps[key] = _encode(ptr, dtype_code, dims, strides, box)
    return encoded


def _encode(ptr, dtype_code, dims, strides, box):
    """cuTensorMapEncodeTiled of a tensor of extents ``dims`` (innermost first) and byte ``strides`` (of
    dims 1...); a dimension of extent 1 gets stride 16 (never used, but the driver checks it)."""
    rank = len(dims)
    strides = tuple(s if n > 1 else 16 for n, s in zip(dims[1:], strides))
    out = (ctypes.c_uint64 * 16)()
    result = _encode_tiled()(
        ctypes.addressof(out), dtype_code, rank, ptr, (ctypes.c_uint64 * rank)(*dims),
        (ctypes.c_uint64 * (rank - 1))(*strides), (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*[1] * rank),
        0, _SWIZZLE_128B, _L2_PROMOTION_128B, 0,
    )
    if result != 0:
        raise RuntimeError(f"cupyflash: cuTensorMapEncodeTiled failed with CUresult {result} for a tensor of extents "
                           f"{dims} and byte strides {strides}")
    return bytes(out)


class Sm90Forward:
    """float16/bfloat16 on compute capability 9.0, head dims up to 256."""

    name = "sm90"
    kernels = (FWD,)

    def select(self, p, device):
        if p.dtype.itemsize != 2 or device.capability != CAPABILITY:
            return None
        dims = bucket(p.headdim, p.headdim_v)
        if dims is None:
            return None
        # The plain kernels fold softmax_scale into the exponent after the row maximum, which needs a
        # positive scale; the score_mod kernels scale first.
        score_mod = p.score_mod or p.softmax_scale <= 0
        variant = FWD.variant(common.dtype_name(p.dtype), (*dims, *FWD_TILES[dims]), score_mod=score_mod)
        return variant if fwd_smem_bytes(variant) <= device.smem_optin else None

    def run(self, variant, p, q, k, v, out, lse):
        if not all(tma_addressable(x, p.varlen) for x in (q, k, v)):
            fallback = sm80.FORWARD
            return fallback.run(fallback.select(p, common.current_device()), p, q, k, v, out, lse)
        block_n = variant.param("block_n")
        lists = common.sparse_lists(p, FWD_BLOCK_M, block_n)
        args = common.fwd_args(p, q, k, v, out, lse, lists)
        encoded = tensor_map(q, p.varlen, FWD_BLOCK_M) + tensor_map(k, p.varlen, block_n) + tensor_map(v, p.varlen, block_n)
        maps = numpy.frombuffer(encoded, MAPS).copy()
        # Persistent: one CTA per SM walks the work tiles (fewer CTAs when there are fewer tiles). Tiles
        # of unequal length (a mask, packed sequences, KV caches) go longest first, to whichever CTA is free.
        work = common.cdiv(p.seqlen_q, FWD_BLOCK_M) * p.batch * p.heads
        grid = (min(work, common.current_device().sm_count), 1, 1)
        schedule = numpy.zeros(1, SCHEDULE)
        if (p.varlen or p.seqused_k is not None or p.block_mask is not None or p.window_left >= 0
                or p.window_right >= 0):
            counter = cupy.zeros(1, numpy.int32)
            schedule["longest_first"] = 1
            schedule["next_work"] = counter.data.ptr
        common.launch(variant, grid, FWD_THREADS, (args, maps, schedule), fwd_smem_bytes(variant))


class Sm90Backward:
    """float16/bfloat16 on compute capability 9.0, head dims up to 128 (BWD_TILES).

    The argument setup, delta, the float32 dQ buffers, the ordered sum of the deterministic mode and
    the dQ conversion are the sm80 family's; only the main kernel differs.
    """

    name = "sm90"
    kernels = (sm80.DELTA, BWD, sm80.DQ_CONVERT)

    def select(self, p, device):
        if p.dtype.itemsize != 2 or device.capability != CAPABILITY:
            return None
        dims = bucket(p.headdim, p.headdim_v, tuple(BWD_TILES))
        if dims is None:
            return None
        variant = BWD.variant(common.dtype_name(p.dtype), (*dims, *BWD_TILES[dims]), score_mod=p.score_mod)
        return variant if bwd_smem_bytes(variant) <= device.smem_optin else None

    def run(self, variant, p, dout, q, k, v, out, lse, deterministic):
        if not all(tma_addressable(x, p.varlen) for x in (q, k, v, dout)):
            fallback = sm80.BACKWARD
            return fallback.run(fallback.select(p, common.current_device()), p, dout, q, k, v, out, lse, deterministic)
        block_m = variant.param("block_m")
        # The TMA reductions need 16-byte rows in the dQ buffers.
        args, grads, (_delta, dq_accum, _turns) = sm80.backward_args(p, dout, q, k, v, out, lse, block_m, BWD_BLOCK_N,
                                                                     deterministic, dq_align=4)
        encoded = (tensor_map(q, p.varlen, block_m) + tensor_map(k, p.varlen, BWD_BLOCK_N)
                   + tensor_map(v, p.varlen, BWD_BLOCK_N) + tensor_map(dout, p.varlen, block_m)
                   + accum_map(dq_accum, p, int(args["dq_ld"][0]), block_m))
        maps = numpy.frombuffer(encoded, BWD_MAPS).copy()
        grid = (common.cdiv(p.seqlen_k, BWD_BLOCK_N) * p.batch * p.heads_k, 1, 1)
        common.launch(variant, grid, BWD_THREADS, (args, maps), bwd_smem_bytes(variant))
        sm80.convert_dq(args, p)
        return grads


FORWARD = Sm90Forward()
BACKWARD = Sm90Backward()
