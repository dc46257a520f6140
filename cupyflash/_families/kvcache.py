"""The KV-cache kernels (kernels_cu/kvcache/kvcache.cu): appending new keys and values with the rotary embedding,
the decode kernel with its split-KV combine, and the general path's per-entry lengths and poisoning.
cupyflash/_kvcache.py validates the calls and picks between the decode kernel and the general path."""

import dataclasses

import cupy
import numpy
from cupy.cuda import driver

from .. import _kernels, _params, _validate
from .._kvcache import MAX_SPLITS
from . import common

#: Query rows per kv head (seqlen_q * heads / heads_k) up to which a dense cache takes the decode
#: kernel; longer chunks (chunked prefill) run the dense forward, which reuses each K/V tile for 128
#: query rows instead of 16.
DECODE_MAX_ROWS = 64
#: Head-dim buckets of the decode kernel (KvcTraits::kHeadDim): the smallest covering both head dims.
DECODE_BUCKETS = (64, 128, 256)
#: Threads of the decode kernel (KvcTraits::kThreads), query rows per CTA (kRows), keys per stage (kBlockN).
DECODE_THREADS = 128
DECODE_ROWS = 16
DECODE_BLOCK_N = 64
#: Threads of the append, lengths and combine kernels (the combine runs a CTA per output row).
APPEND_THREADS = 128
COMBINE_THREADS = 128
POISON_THREADS = 256
#: The heuristic keeps at least this many key tiles (of DECODE_BLOCK_N keys) per split: short caches
#: take many splits, since a CTA's first tile waits a DRAM round trip however few it has.
MIN_TILES_PER_SPLIT = 2

APPEND = _kernels.Kernel("kvc_append", "kvcache/kvcache.cu", _kernels.ALL_DTYPES)
DECODE = _kernels.Kernel("kvc_fwd", "kvcache/kvcache.cu", _kernels.HALF_DTYPES, ("headdim",), tuple((d,) for d in DECODE_BUCKETS),
                         ("score_mod",))
COMBINE = _kernels.Kernel("kvc_combine", "kvcache/kvcache.cu", _kernels.HALF_DTYPES)
LENGTHS = _kernels.Kernel("kvc_lengths", "kvcache/kvcache.cu", ())
POISON = _kernels.Kernel("kvc_poison", "kvcache/kvcache.cu", _kernels.ALL_DTYPES)
KERNELS = (APPEND, DECODE, COMBINE, LENGTHS, POISON)


def decode_stages(headdim):
    """K/V stages of the decode kernel (KvcTraits::kStages)."""
    return 4 if headdim <= 64 else 3 if headdim <= 128 else 2


def decode_smem_bytes(variant):
    """Dynamic shared memory of a decode variant (KvcTraits::kSmemBytes): the Q rows and the K/V stages,
    rows padded by 8 elements."""
    ld = variant.param("headdim") + 8
    return DECODE_ROWS * ld * 2 + decode_stages(variant.param("headdim")) * 2 * DECODE_BLOCK_N * ld * 2


# ------------------------------------------------------------------------------------------------
# Running a call (cupyflash/_kvcache.py validated it).

def _problem(c, **fields):
    """The attention problem of call ``c`` for the forward families' argument code: a dense batch whose
    keys are the cache capacity (``fields`` override, e.g. seqlen_k or seqused_k)."""
    sizes = dict(xp=cupy, dtype=c.dtype, batch=c.batch, seqlen_q=c.seqlen_q, seqlen_k=c.capacity, heads=c.heads,
                 heads_k=c.heads_k, headdim=c.headdim, headdim_v=c.headdim_v, softmax_scale=c.softmax_scale,
                 window_left=c.window_left, window_right=c.window_right, softcap=c.softcap,
                 alibi_slopes=c.alibi_slopes)
    return _validate.Problem(**{**sizes, **fields})


def _args(c, q, out, lse):
    """The ``KvCacheArgs`` of call ``c`` with attn.q = ``q`` and the outputs (workspace fields zero)."""
    args = numpy.zeros(1, _params.KV_CACHE_ARGS)
    p = _problem(c)
    # The caches as (entries or pages, rows, heads_k, dim) tensors: batch_stride is the page stride.
    attn = common.attn(p, q, c.k_cache, c.v_cache, vec=1)
    empty = (0, 0, 0, 0)
    new = (_params.tensor(c.k_new), _params.tensor(c.v_new)) if c.k_new is not None else (empty, empty)
    table = c.block_table
    args[0] = (
        attn, _params.tensor(out) if out is not None else empty,
        _params.rows(lse, *common.lse_strides(p)) if lse is not None else (0, 0, 0), *new, empty,
        _params.pointer(c.rotary_cos), _params.pointer(c.rotary_sin), _params.pointer(c.cache_seqlens),
        _params.pointer(c.cache_batch_idx), _params.pointer(table), 0, 0, 0, 0,
        table.strides[0] // 4 if table is not None else 0, c.cache_seqlens_value, c.seqlen_new, c.page_size,
        c.cache_entries, 1, c.rotary_dim, c.rotary_cos.shape[0] if c.rotary_dim else 0,
        int(c.rotary_interleaved), int(c.rotary_q_at_row),
    )
    return args


def decode_variant(c, device):
    """The decode kernel's variant for call ``c``, or None when it does not take the call."""
    if c.dtype.itemsize != 2 or device.capability < 80:
        return None
    bucket = next((d for d in DECODE_BUCKETS if d >= max(c.headdim, c.headdim_v)), None)
    if bucket is None or not common.vec_loads(c.k_cache, c.v_cache):
        return None
    rows = c.seqlen_q * (c.heads // c.heads_k)
    if c.block_table is None and rows > DECODE_MAX_ROWS or c.batch * c.seqlen_q * c.heads >= 2**31:
        return None  # (the combine's grid has a CTA per output row)
    variant = DECODE.variant(common.dtype_name(c.dtype), (bucket,), score_mod=c.softcap != 0.0 or c.alibi_slopes is not None)
    return variant if decode_smem_bytes(variant) <= device.smem_optin else None


def num_splits(c, variant, device, row_tiles):
    """Splits of the keys: the call's own, or the fewest that fill the device's CTA slots as well as any
    count can, each keeping at least MIN_TILES_PER_SPLIT key tiles. Sized for the capacity:
    cache_seqlens is not read on the host, and a plan serves every cache_seqlens of its layout."""
    if c.num_splits:
        return c.num_splits
    keys = c.capacity
    base = row_tiles * c.heads_k * c.batch
    # Dense caches: one CTA per SM draws as much bandwidth as two on the H200 (1 x 131072 tokens: 3.89
    # TB/s with 128 CTAs, 3.81 with 264), and fewer splits leave less to merge. Paged caches: two, whose
    # tiles take turns hiding each other's page lookups (one per SM: 2.8-2.95 TB/s).
    slots = device.sm_count * (2 if c.block_table is not None else 1)
    most = min(MAX_SPLITS, max(1, common.cdiv(keys, DECODE_BLOCK_N) // MIN_TILES_PER_SPLIT))
    if base >= slots or most == 1:
        return 1

    def efficiency(splits):
        ctas = base * splits
        return ctas / (common.cdiv(ctas, slots) * slots)

    # Efficiency peaks at the multiples of slots / base; none past the first whole wave does better.
    counts = range(1, min(most, common.cdiv(slots, base)) + 1)
    best = max(efficiency(s) for s in counts)
    return next(s for s in counts if efficiency(s) >= 0.99 * best)


def run(c):
    """(out, lse) of a validated CuPy call ``c``, the new keys and values written into the caches.
    Returns also the :class:`DecodePlan` that repeats the call for arrays of the same layout (None
    when the call takes the general path)."""
    device = common.current_device()
    variant = decode_variant(c, device)
    if variant is not None:
        plan = DecodePlan(c, variant, device)
        return plan(c.q, c.k_cache, c.v_cache, c.k_new, c.v_new, c.cache_seqlens, c.cache_batch_idx, c.block_table,
                    c.rotary_cos, c.rotary_sin, c.alibi_slopes, c.cache_seqlens_value), plan
    q = common.operand(c.q)
    if c.k_new is not None:
        c = dataclasses.replace(c, k_new=common.operand(c.k_new), v_new=common.operand(c.v_new))
        args = _args(c, q, None, None)
        if c.rotary_dim:
            q_rot = cupy.empty(q.shape, dtype=c.dtype)
            args["q_rot"] = _params.tensor(q_rot)
        tokens = max(c.seqlen_new, c.seqlen_q if c.rotary_dim else 0)
        if tokens:
            common.launch(APPEND.variant(common.dtype_name(c.dtype)), (tokens, c.batch, 1), APPEND_THREADS, args)
        if c.rotary_dim:
            q = q_rot
    if c.seqlen_q == 0:
        return (cupy.empty(c.out_shape, dtype=c.dtype), cupy.empty(c.lse_shape, dtype=_validate.lse_dtype(c.dtype))), None
    return _general(c, q), None


def _field_index(dtype, path, unit):
    """Index, in units of ``unit`` bytes, of the field at ``path`` (names, outer first) of a struct dtype."""
    offset = 0
    for name in path:
        dtype, at = dtype.fields[name][:2]
        offset += at
    assert offset % unit == 0
    return offset // unit


class _Launch:
    """One kernel launch of a plan, through the driver: the function, the launch shape and a pointer
    to the argument struct (which the driver copies at the launch, so the plan may refill it next)."""

    def __init__(self, variant, grid, threads, args, smem=0):
        self.function = common.prepare(variant, smem).kernel.ptr
        self.shape = (*grid, threads, 1, 1, smem)
        self.params = numpy.array([args.ctypes.data], numpy.uint64)
        self.params_address = self.params.ctypes.data

    def __call__(self, stream):
        driver.launchKernel(self.function, *self.shape, stream, self.params_address, 0)


#: Pointer fields of a KvCacheArgs a plan fills on every call: argument name -> path.
_POINTERS = {
    "q": ("attn", "q", "ptr"), "k_cache": ("attn", "k", "ptr"), "v_cache": ("attn", "v", "ptr"),
    "alibi_slopes": ("attn", "alibi_slopes"), "out": ("out", "ptr"), "lse": ("lse", "ptr"),
    "k": ("k_new", "ptr"), "v": ("v_new", "ptr"), "q_rot": ("q_rot", "ptr"), "rotary_cos": ("rotary_cos",),
    "rotary_sin": ("rotary_sin",), "cache_seqlens": ("cache_seqlens",), "cache_batch_idx": ("cache_batch_idx",),
    "block_table": ("block_table",), "part_out": ("part_out",), "part_lse": ("part_lse",),
}
_INDEX = {name: _field_index(_params.KV_CACHE_ARGS, path, 8) for name, path in _POINTERS.items()}
_SEQLENS_VALUE = _field_index(_params.KV_CACHE_ARGS, ("cache_seqlens_value",), 4)


class DecodePlan:
    """A decode-kernel call prepared once for a layout (shapes, strides, dtypes, options): the argument
    structs with every size filled, the launches and the workspace sizes. Calling it with arrays of that
    layout fills the pointers, allocates the outputs from CuPy's pool and launches on the current stream:
    a few microseconds of host time (cupyflash/_api.py keys plans by layout, per thread)."""

    def __init__(self, c, variant, device):
        self.out_shape, self.lse_shape, self.dtype = c.out_shape, c.lse_shape, c.dtype
        self.q_copy = common.operand(c.q) is not c.q
        self.capacity, self.seqlen_new = c.capacity, c.seqlen_new
        rows = c.seqlen_q * (c.heads // c.heads_k)
        row_tiles = common.cdiv(rows, DECODE_ROWS)
        self.splits = num_splits(c, variant, device, row_tiles)
        self.part_out_size = c.batch * c.seqlen_q * c.heads * c.headdim_v
        self.part_lse_size = c.batch * c.heads * c.seqlen_q
        # Placeholder outputs give the structs their strides; the pointers are refilled per call.
        out = cupy.empty(self.out_shape, self.dtype)
        lse = cupy.empty(self.lse_shape, numpy.float32)
        q = common.operand(c.q)
        k_new = common.operand(c.k_new) if c.k_new is not None else None
        v_new = common.operand(c.v_new) if c.v_new is not None else None
        c = dataclasses.replace(c, k_new=k_new, v_new=v_new)
        self.main = _args(c, q, out, lse).view(numpy.uint8)
        self.main_u64 = self.main.view(numpy.uint64)
        self.main_i32 = self.main.view(numpy.int32)
        self.main_u64[_INDEX["part_out"]] = 0
        self.main_i32[_field_index(_params.KV_CACHE_ARGS, ("num_splits",), 4)] = self.splits
        self.rotary = c.rotary_dim > 0
        self.append = None
        tokens = max(c.seqlen_new, c.seqlen_q if self.rotary else 0) if c.k_new is not None else 0
        if tokens:
            self.append_args = self.main.copy()
            self.append_u64 = self.append_args.view(numpy.uint64)
            self.append_i32 = self.append_args.view(numpy.int32)
            if self.rotary:
                q_rot = cupy.empty(q.shape, self.dtype)
                self.append_args.view(_params.KV_CACHE_ARGS)["q_rot"] = _params.tensor(q_rot)
                self.main.view(_params.KV_CACHE_ARGS)["attn"]["q"] = _params.tensor(q_rot)
            self._fill(self.append_u64, q=q, k_cache=c.k_cache, v_cache=c.v_cache)
            self.append = _Launch(APPEND.variant(common.dtype_name(self.dtype)), (tokens, c.batch, 1), APPEND_THREADS,
                                  self.append_args)
        self.decode = _Launch(variant, (row_tiles * self.splits, c.heads_k, c.batch), DECODE_THREADS, self.main,
                              decode_smem_bytes(variant))
        self.combine = None
        if self.splits > 1:
            combine_rows = c.batch * c.seqlen_q * c.heads
            self.combine = _Launch(COMBINE.variant(common.dtype_name(self.dtype)), (combine_rows, 1, 1),
                                   COMBINE_THREADS, self.main)

    def _fill(self, u64, **arrays):
        for name, x in arrays.items():
            u64[_INDEX[name]] = 0 if x is None else x.data.ptr

    def __call__(self, q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
                 alibi_slopes, cache_seqlens_value):
        """(out, lse) for arrays of the plan's layout; cache_seqlens_value is used when cache_seqlens is None."""
        stream = cupy.cuda.get_current_stream().ptr
        if self.q_copy:
            q = cupy.ascontiguousarray(q)
        out = cupy.empty(self.out_shape, self.dtype)
        lse = cupy.empty(self.lse_shape, numpy.float32)
        pointers = dict(k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
                        block_table=block_table, alibi_slopes=alibi_slopes)
        if self.append is not None:
            u64 = self.append_u64
            self._fill(u64, q=q, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin, **pointers)
            self.append_i32[_SEQLENS_VALUE] = cache_seqlens_value
            if self.rotary:
                q = cupy.empty(q.shape, self.dtype)
                u64[_INDEX["q_rot"]] = q.data.ptr
            self.append(stream)
        u64 = self.main_u64
        self._fill(u64, q=q, out=out, lse=lse, **pointers)
        self.main_i32[_SEQLENS_VALUE] = cache_seqlens_value
        if self.combine is not None:
            parts = cupy.empty(self.splits * (self.part_out_size + self.part_lse_size), numpy.float32)
            u64[_INDEX["part_out"]] = parts.data.ptr
            u64[_INDEX["part_lse"]] = parts.data.ptr + 4 * self.splits * self.part_out_size
        self.decode(stream)
        if self.combine is not None:
            self.combine(stream)
        return out, lse


def _general(c, q):
    """(out, lse): the cache as a dense batch of capacity keys with per-entry counts (seqused_k), through
    the forward families; the rows of entries with out-of-range values NaN."""
    from .. import _cuda

    if c.cache_seqlens is None and c.block_table is None and c.cache_batch_idx is None:
        # Every entry uses the same keys, checked on the host: the dense forward over the caches' first keys.
        keys = c.cache_seqlens_value + c.seqlen_new
        if keys == 0:
            return (cupy.zeros(c.out_shape, c.dtype), cupy.full(c.lse_shape, -numpy.inf, _validate.lse_dtype(c.dtype)))
        p = _problem(c, seqlen_k=keys)
        return _cuda.forward(q, c.k_cache[:c.batch, :keys], c.v_cache[:c.batch, :keys], p)
    seqused = cupy.empty(c.batch, numpy.int32)
    bad = cupy.empty(c.batch, numpy.int32)
    args = _args(c, q, None, None)
    args["seqused_k"], args["bad"] = seqused.data.ptr, bad.data.ptr
    common.launch(LENGTHS.variant(), (c.batch, 1, 1), APPEND_THREADS, args)
    k, v = c.k_cache, c.v_cache
    if c.block_table is not None:
        # Clamped: a bad page makes the entry's rows NaN below, and must not make the gather fault.
        pages = cupy.clip(c.block_table, 0, c.cache_entries - 1)
        k = k[pages].reshape(c.batch, c.capacity, c.heads_k, c.headdim)
        v = v[pages].reshape(c.batch, c.capacity, c.heads_k, c.headdim_v)
    elif c.cache_batch_idx is not None:
        entries = cupy.clip(c.cache_batch_idx, 0, c.cache_entries - 1)
        k, v = k[entries], v[entries]
    elif k.shape[0] != c.batch:
        k, v = k[:c.batch], v[:c.batch]
    if c.capacity == 0:
        out, lse = cupy.zeros(c.out_shape, c.dtype), cupy.full(c.lse_shape, -numpy.inf, _validate.lse_dtype(c.dtype))
    else:
        out, lse = _cuda.forward(q, k, v, _problem(c, seqused_k=seqused))
    for x in (out, lse):
        per_entry = x.size // c.batch
        common.launch(POISON.variant(common.dtype_name(x.dtype)), (min(common.cdiv(x.size, POISON_THREADS), 4096), 1, 1),
                      POISON_THREADS, (bad, x, numpy.int64(per_entry), numpy.int64(x.size)))
    return out, lse
