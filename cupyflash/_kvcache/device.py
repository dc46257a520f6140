"""The KV-cache kernels (kernels_cu/kvcache/kvcache.cu) and a CuPy call's two paths: the decode kernel
(float16/bfloat16 caches with 16-byte aligned rows, head dims up to 256: paged caches but the prefill
chunks the Hopper forward reads in place, and dense calls with at most DECODE_MAX_ROWS query rows per kv
head), planned once per layout (a
:class:`DecodePlan`), or the general path: the forward families over the cache with per-entry key
counts (seqused_k), reading a dense cache or a paged one's pages in place (the Hopper forward), planned
once per layout too (a :class:`GeneralPlan`), or, unplanned, after gathering the pages, the
cache_batch_idx entries or the left-padded rows into a dense copy. New keys and values go into the
cache through the decode kernel itself where it runs and they need no rotary embedding, else first,
through kvc_append."""

import dataclasses

import cupy
import numpy
from cupy.cuda import function as _function

from .. import _compute, _families, _fp8, _kernels, _params, _plan, _problem
from .._families import common, sm90
from .call import MAX_SPLITS

#: Query rows per kv head (seqlen_q * heads / heads_k) up to which a dense cache takes the decode
#: kernel; longer chunks (chunked prefill) run the dense forward, which reuses each K/V tile for 128
#: query rows instead of 16.
DECODE_MAX_ROWS = 64
#: Query rows of the Hopper forward's work tiles at head dims above 64 (192 at 64: fewer tiles), which
#: paged_prefill counts.
PREFILL_BLOCK_M = 128
#: Head-dim buckets of the decode kernel (KvcTraits::kHeadDim): the smallest covering both head dims.
DECODE_BUCKETS = (64, 128, 256)
#: Threads of the decode kernel (KvcTraits::kThreads), query rows per CTA (kRows), keys per stage (kBlockN).
DECODE_THREADS = 128
DECODE_ROWS = 16
DECODE_BLOCK_N = 64
#: Threads of the append and lengths kernels.
APPEND_THREADS = 128
POISON_THREADS = 256
#: The heuristic keeps at least this many key tiles (of DECODE_BLOCK_N keys) per split: short caches
#: take many splits, since a CTA's first tile waits a DRAM round trip however few it has.
MIN_TILES_PER_SPLIT = 2

APPEND = _kernels.Kernel("kvc_append", "kvcache/kvcache.cu", _kernels.ALL_DTYPES)
DECODE = _kernels.Kernel("kvc_fwd", "kvcache/kvcache.cu", _kernels.HALF_DTYPES, ("headdim",),
                         tuple((d,) for d in DECODE_BUCKETS), ("score_mod", "max_score"), user_functions=True)
#: The decode kernel over e4m3 caches (q and new tokens e4m3 too; sm_90a), of out_dtype's dtype.
DECODE_FP8 = _kernels.Kernel("kvc_fwd_fp8", "kvcache/kvcache.cu", _kernels.HALF_DTYPES, ("headdim",),
                             tuple((d,) for d in DECODE_BUCKETS), ("score_mod", "max_score"), arch="90a")
LENGTHS = _kernels.Kernel("kvc_lengths", "kvcache/kvcache.cu", ())
POISON = _kernels.Kernel("kvc_poison", "kvcache/kvcache.cu", _kernels.ALL_DTYPES)
#: MLA decoding (kernels_cu/kvcache/mla.cu): one latent kv head of MLA_HEADDIM columns whose first
#: MLA_HEADDIM_V are the values, v_cache a view of k_cache.
MLA = _kernels.Kernel("kvc_mla", "kvcache/mla.cu", _kernels.HALF_DTYPES)
MLA_HEADDIM, MLA_HEADDIM_V = 576, 512
#: MLA decoding on Hopper's tensor cores (kernels_cu/kvcache/mla_sm90.cu): calls of at least
#: MLA_SM90_MIN_ROWS (query, head) rows per batch entry, over a dense cache or pages of a multiple of
#: MLA_SM90_ROWS rows; MLA_SM90_ROWS rows and keys per tile. Its tiles of 64 rows waste products below 64
#: rows, yet it beat kvc_mla at 16 (0.303 against 0.41 ms, batch 64 x 8192, H100, session 38).
MLA_SM90 = _kernels.Kernel("kvc_mla_sm90", "kvcache/mla_sm90.cu", _kernels.HALF_DTYPES, arch="90a")
MLA_SM90_ROWS = 64
MLA_SM90_MIN_ROWS = 16
MLA_SM90_THREADS = 256
#: MlaSm90Traits' shared memory: Q, two stages of a 64-key tile (nine 8 KB boxes each), the P buffer,
#: five float rows of statistics, 18 mbarriers, and 1024 bytes to align the base.
MLA_SM90_SMEM = 1024 + 3 * MLA_SM90_ROWS * MLA_HEADDIM * 2 + 128 * 16 * 4 + 5 * MLA_SM90_ROWS * 4 + 2 * 9 * 8
#: kvc_mla_sm90's second parameter: the CUtensorMap of k_cache (a TmaDesc).
MLA_SM90_MAP = numpy.dtype({"names": ["k"], "formats": [(numpy.void, 128)], "offsets": [0], "itemsize": 128,
                            "aligned": True})
KERNELS = (APPEND, DECODE, DECODE_FP8, LENGTHS, POISON, MLA, MLA_SM90)


def decode_stages(headdim, fp8=False):
    """K/V stages of the decode kernel (KvcTraits::kStages; e4m3 stages hold half the bytes)."""
    if fp8:
        return 6 if headdim <= 64 else 4 if headdim <= 128 else 2
    return 4 if headdim <= 64 else 3 if headdim <= 128 else 2


def decode_smem_bytes(variant):
    """Dynamic shared memory of a decode variant (KvcTraits::kSmemBytes: the Q rows and the K/V stages,
    rows padded by 8 elements; MlaTraits::kSmemBytes: the Q rows, two stages of cache rows, P and the
    warps' row statistics)."""
    if variant.kernel is MLA_SM90:
        return MLA_SM90_SMEM
    if variant.kernel is MLA:
        ld, warps = MLA_HEADDIM + 8, DECODE_THREADS // 32
        p_bytes, stat_bytes = DECODE_ROWS * (DECODE_BLOCK_N + 8) * 2, 2 * warps * DECODE_ROWS * 4
        return DECODE_ROWS * ld * 2 + 2 * DECODE_BLOCK_N * ld * 2 + p_bytes + stat_bytes
    d = variant.param("headdim")
    ld, tile = d + 8, 2 * DECODE_BLOCK_N * (d + 8) * 2
    if variant.kernel is DECODE_FP8:  # one float16 K/V tile, and stages of e4m3 rows of d + 16 bytes
        return DECODE_ROWS * ld * 2 + tile + decode_stages(d, fp8=True) * 2 * DECODE_BLOCK_N * (d + 16)
    return DECODE_ROWS * ld * 2 + decode_stages(d) * tile


def part_cols(variant):
    """Floats between two partial output rows of a decode variant (its traits' kPartCols)."""
    return MLA_HEADDIM_V if variant.kernel in (MLA, MLA_SM90) else variant.param("headdim")


def rows_per_cta(variant):
    """Query rows (of one kv head) per CTA of a decode variant."""
    return MLA_SM90_ROWS if variant.kernel is MLA_SM90 else DECODE_ROWS


def threads(variant):
    """Threads per CTA of a decode variant."""
    return MLA_SM90_THREADS if variant.kernel is MLA_SM90 else DECODE_THREADS


def cxx_facts():
    """The path's constants as the kernels state them: (headers, {C++ expression: value}) for
    tests/test_compile.py."""
    facts = {}
    for d in DECODE_BUCKETS:
        traits = f"cupyflash::KvcTraits<__half, {d}>"
        variant = DECODE.variant("float16", (d,))
        facts.update({f"{traits}::kThreads": DECODE_THREADS, f"{traits}::kRows": DECODE_ROWS,
                      f"{traits}::kBlockN": DECODE_BLOCK_N, f"{traits}::kStages": decode_stages(d),
                      f"{traits}::kSmemBytes": decode_smem_bytes(variant)})
    for d in DECODE_BUCKETS:
        traits = f"cupyflash::KvcTraits<__half, {d}, cupyflash::E4m3>"
        facts.update({f"{traits}::kStages": decode_stages(d, fp8=True),
                      f"{traits}::kSmemBytes": decode_smem_bytes(DECODE_FP8.variant("float16", (d,)))})
    for dtype, name in (("float16", "__half"), ("bfloat16", "__nv_bfloat16")):
        traits = f"cupyflash::MlaTraits<{name}>"
        variant = MLA.variant(dtype)
        facts.update({f"{traits}::kThreads": DECODE_THREADS, f"{traits}::kRows": DECODE_ROWS,
                      f"{traits}::kBlockN": DECODE_BLOCK_N, f"{traits}::kHeadDim": MLA_HEADDIM,
                      f"{traits}::kHeadDimV": MLA_HEADDIM_V, f"{traits}::kPartCols": part_cols(variant),
                      f"{traits}::kSmemBytes": decode_smem_bytes(variant)})
    for dtype, name in (("float16", "__half"), ("bfloat16", "__nv_bfloat16")):
        traits = f"cupyflash::MlaSm90Traits<{name}>"
        facts.update({f"{traits}::kThreads": MLA_SM90_THREADS, f"{traits}::kRows": MLA_SM90_ROWS,
                      f"{traits}::kBlockN": MLA_SM90_ROWS, f"{traits}::kHeadDim": MLA_HEADDIM,
                      f"{traits}::kPartCols": part_cols(MLA_SM90.variant(dtype)),
                      f"{traits}::kSmemBytes": MLA_SM90_SMEM})
    facts["sizeof(cupyflash::TmaDesc)"] = MLA_SM90_MAP.itemsize
    facts["cupyflash::kMaxSplits"] = MAX_SPLITS
    return ("kvcache/kvcache.cu", "kvcache/mla.cu", "kvcache/mla_sm90.cu"), facts


# ------------------------------------------------------------------------------------------------
# The argument struct of a checked call (cupyflash/_kvcache/call.py).

def _problem_of(c, **fields):
    """The attention problem of call ``c`` for the forward families' argument code: a dense batch whose
    keys are the cache capacity (``fields`` override, e.g. seqlen_k or seqused_k)."""
    sizes = dict(xp=cupy, dtype=c.dtype, batch=c.batch, seqlen_q=c.seqlen_q, seqlen_k=c.capacity, heads=c.heads,
                 heads_k=c.heads_k, headdim=c.headdim, headdim_v=c.headdim_v, softmax_scale=c.softmax_scale,
                 window_left=c.window_left, window_right=c.window_right, softcap=c.softcap,
                 alibi_slopes=c.alibi_slopes, precision=c.precision, user_score=c.user_score,
                 user_buffers=c.user_buffers, **(c.fp8 or {}))
    return _problem.Problem(**{**sizes, **fields})


def _fill_args(args, c, q, out, lse):
    """Fills the ``KvCacheArgs`` ``args`` of call ``c`` (its arrays, or plan slots) with attn.q = ``q`` and
    the outputs (None: no such output); the workspace fields are zero."""
    p = _problem_of(c)
    # The caches as (entries or pages, rows, heads_k, dim) tensors: batch_stride is the page stride.
    attn = common.attn(p, q, c.k_cache, c.v_cache, vec=1)
    empty = (0, 0, 0, 0)
    new = (_params.tensor(c.k_new), _params.tensor(c.v_new)) if c.k_new is not None else (empty, empty)
    table = c.block_table
    args[0] = (
        attn, _params.tensor(out) if out is not None else empty,
        _params.rows(lse, *common.lse_strides(p)) if lse is not None else (0, 0, 0), *new, empty,
        _params.pointer(c.rotary_cos), _params.pointer(c.rotary_sin), _params.pointer(c.cache_seqlens),
        _params.pointer(c.cache_batch_idx), _params.pointer(table), _params.pointer(c.cache_leftpad), 0, 0, 0, 0, 0, 0,
        table.strides[0] // 4 if table is not None else 0, c.cache_seqlens_value, c.seqlen_new, c.page_size,
        c.cache_entries, 1, c.rotary_dim, c.rotary_cos.shape[0] if c.rotary_dim else 0,
        int(c.rotary_interleaved), int(c.rotary_q_at_row),
    )
    return args


def mla_variant(c, device, max_score=False):
    """The MLA decode kernel's variant for call ``c``, or None when it does not take the call: one kv head
    of MLA_HEADDIM columns, v_cache the view of its first MLA_HEADDIM_V, 16-byte rows, no score
    modification, window or maximum score (causal or not), new values (if any) the view of the new keys'
    first MLA_HEADDIM_V columns (kvc_append writes them first, the same bytes twice), and the shared
    memory."""
    if (c.heads_k != 1 or c.headdim != MLA_HEADDIM or c.headdim_v != MLA_HEADDIM_V or max_score or c.softcap != 0.0
            or c.alibi_slopes is not None or c.user_score is not None or c.window_left >= 0 or c.window_right > 0):
        return None
    k, v = c.k_cache, c.v_cache
    if v.data.ptr != k.data.ptr or v.strides[:3] != k.strides[:3] or k.strides[3] != k.itemsize:
        return None  # (not a view of the latent cache: the general path)
    if c.k_new is not None and (c.v_new.data.ptr != c.k_new.data.ptr or c.v_new.strides != c.k_new.strides):
        return None  # (new values of their own would overwrite the new keys' first columns)
    if not common.vec_loads(c.q, k) or c.batch * c.seqlen_q * c.heads >= 2**31:
        return None
    if (device.capability == sm90.CAPABILITY and c.seqlen_q * c.heads >= MLA_SM90_MIN_ROWS
            and (c.block_table is None or c.page_size % MLA_SM90_ROWS == 0) and sm90.tma_addressable(k, False)
            and MLA_SM90_SMEM <= device.smem_optin):
        # 64 rows or more a batch entry: the products set the pace, on the tensor cores. Pages of other
        # sizes would split a tile's copies (the tensor map's box is 64 rows of one page).
        return MLA_SM90.variant(common.dtype_name(c.dtype))
    variant = MLA.variant(common.dtype_name(c.dtype))
    return variant if decode_smem_bytes(variant) <= device.smem_optin else None


def fp8_decode_variant(c, device, max_score=False):
    """The e4m3 decode kernel's variant for e4m3 call ``c``, or None: compute capability 9.0, head dims up to
    256, 16-byte rows of the caches and new tokens (the kernel appends these itself), a paged cache or at
    most DECODE_MAX_ROWS query rows per kv head."""
    if device.capability != 90 or c.seqlen_q == 0 or c.user_score is not None or c.softcap != 0.0:
        return None  # (softcap: the 16-bit kernels' tanh.approx is past the FP8 rule's float32 scores, as in the forward)
    bucket = next((d for d in DECODE_BUCKETS if d >= max(c.headdim, c.headdim_v)), None)
    new = (c.k_new, c.v_new) if c.k_new is not None else ()
    if bucket is None or not common.vec_loads(c.k_cache, c.v_cache, *new):
        return None
    rows = c.seqlen_q * (c.heads // c.heads_k)
    if c.block_table is None and rows > DECODE_MAX_ROWS or c.batch * c.seqlen_q * c.heads >= 2**31:
        return None
    score_mod = c.softcap != 0.0 or c.alibi_slopes is not None
    variant = DECODE_FP8.variant(common.dtype_name(c.output_dtype), (bucket,), score_mod=score_mod, max_score=max_score)
    return variant if decode_smem_bytes(variant) <= device.smem_optin else None


def decode_variant(c, device, max_score=False):
    """The decode kernel's variant for call ``c`` (built with its score_mod, if any, and the maximum score's
    flag), the MLA decode kernel's for MLA calls, the e4m3 one's for e4m3 caches, or None when none takes
    the call."""
    if c.fp8:
        return fp8_decode_variant(c, device, max_score)
    if c.dtype.itemsize != 2 or device.capability < 80 or c.seqlen_q == 0:
        return None  # (no queries: no CTA, and the general path appends)
    mla = mla_variant(c, device, max_score)
    if mla is not None:
        return mla
    bucket = next((d for d in DECODE_BUCKETS if d >= max(c.headdim, c.headdim_v)), None)
    if bucket is None or not common.vec_loads(c.k_cache, c.v_cache):
        return None
    rows = c.seqlen_q * (c.heads // c.heads_k)
    if c.block_table is None and rows > DECODE_MAX_ROWS or c.batch * c.seqlen_q * c.heads >= 2**31:
        return None  # (its row counts are 32-bit)
    if paged_prefill(c, device):
        return None  # (the Hopper forward reads the pages once per query tile and head, not once per 16 rows)
    score_mod = c.softcap != 0.0 or c.alibi_slopes is not None
    user = _kernels.user_code(c.user_score, None, fast=True) if c.user_score is not None else None
    variant = DECODE.variant(common.dtype_name(c.dtype), (bucket,), score_mod=score_mod, max_score=max_score, user=user)
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
    # tiles take turns hiding each other's page lookups (one per SM: 2.8-2.95 TB/s). e4m3 caches: two,
    # whose tiles' chains (the copies' wait, a barrier, the conversion to float16, a barrier, the
    # products: one warp a scheduler) take turns too, where two fit (head dims up to 128); with one CTA
    # an SM the e4m3 kernel ran at the 16-bit cache's speed for half its bytes (8 x 32k: 1.00x, H100,
    # session 35). The MLA kernel's shared memory fits one CTA per SM either way.
    fp8_pair = variant.kernel is DECODE_FP8 and 2 * decode_smem_bytes(variant) <= device.smem_optin
    two = fp8_pair or c.block_table is not None and variant.kernel not in (MLA, MLA_SM90)
    slots = device.sm_count * (2 if two else 1)
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


def _plan_inputs(b, c, alibi_slopes):
    """Call ``c`` with its arrays as inputs of plan ``b``, in the order a run takes them
    (:meth:`CachePlan.__call__`, the three descales last, None but for e4m3 calls that give them);
    ``alibi_slopes`` is the call's own array. The caches are written in place: never copied."""
    q = b.input(*common.readable(c.q))
    k_cache, v_cache = b.input(c.k_cache), b.input(c.v_cache)
    k_new, v_new = (b.input(*common.readable(x)) if x is not None else b.input(None) for x in (c.k_new, c.v_new))
    slots = {name: b.input(*common.contiguous(x)) if x is not None else b.input(None)
             for name, x in (("cache_seqlens", c.cache_seqlens), ("cache_batch_idx", c.cache_batch_idx),
                             ("block_table", c.block_table), ("rotary_cos", c.rotary_cos),
                             ("rotary_sin", c.rotary_sin), ("alibi_slopes", alibi_slopes),
                             ("cache_leftpad", c.cache_leftpad))}
    descales = {name: b.input(*common.contiguous(c.fp8[name])) if c.fp8 and c.fp8[name] is not None else b.input(None)
                for name in _fp8.DESCALES}
    fp8 = dict(c.fp8, **descales) if c.fp8 else None
    return dataclasses.replace(c, q=q, k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new, fp8=fp8, **slots)


def _plan_append(b, cs, int_seqlens, fused):
    """kvc_append's launch in plan ``b`` for call ``cs`` (its arrays slots), where it has new tokens that
    the decode kernel does not append itself (``fused``) or queries to rotate. Returns the queries the
    attention reads (q, or the rotated copy kvc_append writes) and whether it launched."""
    tokens = max(cs.seqlen_new, cs.seqlen_q if cs.rotary_dim else 0) if cs.k_new is not None else 0
    q_rot = b.workspace(cs.q.shape, cs.dtype) if cs.rotary_dim else None
    launched = bool(tokens and not fused)
    if launched:
        append = _fill_args(b.struct(_params.KV_CACHE_ARGS), cs, cs.q, None, None)
        if q_rot is not None:
            append["q_rot"] = _params.tensor(q_rot)
        if int_seqlens:
            b.int32_field(append, ("cache_seqlens_value",))
        b.launch(common.function(APPEND.variant(common.dtype_name(cs.dtype))), (tokens, cs.batch, 1), APPEND_THREADS,
                 (append,))
    return (q_rot if q_rot is not None else cs.q), launched


class CachePlan:
    """A call of one layout prepared once (cupyflash/_plan.py): ``plan`` runs its launches on the current
    stream for the arrays of a call of that layout, in :meth:`__call__`'s order. ``capacity`` is the
    cache_seqlens bound of a call that passes it as an int (checked on the host, as the call's checks
    would, then passed to each of the plan's ``scalars`` int32 fields), None when the plan's calls pass
    an array or None (the full cache: a constant of the plan)."""

    def __call__(self, q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
                 alibi_slopes, cache_leftpad=None, q_descale=None, k_descale=None, v_descale=None):
        """The results of a call of the plan's layout (its key fixed cache_seqlens' type; e4m3 calls' descales
        contiguous, as their key requires)."""
        if self.capacity is None:
            return self.plan.run(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos,
                                 rotary_sin, alibi_slopes, cache_leftpad, q_descale, k_descale, v_descale)
        value = int(cache_seqlens)
        if not 0 <= value <= self.capacity:
            raise ValueError(f"cache_seqlens must be in [0, {self.capacity}], got {value}")
        return self.plan.run(q, k_cache, v_cache, k, v, None, cache_batch_idx, block_table, rotary_cos, rotary_sin,
                             alibi_slopes, cache_leftpad, q_descale, k_descale, v_descale,
                             scalars=(value,) * self.scalars)


class DecodePlan(CachePlan):
    """The decode kernel, which also appends new tokens and merges its splits, after kvc_append where the
    new keys need the rotary embedding or rows the decode kernel cannot copy, with every size filled. A
    run returns (out,) or, with ``return_lse``, (out, lse), then with ``max_score`` each entry's and head's
    largest score (the decode kernel raises images in a zeroed workspace, common.plan_max_score_decode
    decodes them)."""

    def __init__(self, c, variant, device, alibi_slopes, return_lse, int_seqlens, max_score=False):
        self.capacity = c.capacity - c.seqlen_new if int_seqlens else None
        b = _plan.PlanBuilder()
        cs = _plan_inputs(b, c, alibi_slopes)
        out = b.output(c.out_shape, c.output_dtype)
        lse = b.output(c.lse_shape, numpy.float32) if return_lse else b.workspace(c.lse_shape, numpy.float32)
        rows = c.seqlen_q * (c.heads // c.heads_k)
        row_tiles = common.cdiv(rows, rows_per_cta(variant))
        splits = num_splits(c, variant, device, row_tiles)
        # Unrotated new keys whose rows suit the decode kernel's 16-byte copies are appended by it (its
        # tiles read them from k_new/v_new); the others are written by kvc_append first.
        fused = bool(c.seqlen_new and not c.rotary_dim and common.vec_loads(cs.k_new, cs.v_new)
                     and variant.kernel not in (MLA, MLA_SM90))
        q, appended = _plan_append(b, cs, int_seqlens, fused)
        main = _fill_args(b.struct(_params.KV_CACHE_ARGS), cs, q, out, lse)
        main["num_splits"] = splits
        if not fused:
            main["k_new"] = main["v_new"] = (0, 0, 0, 0)
        if splits > 1:
            # Partial rows are the bucket's width apart (16-byte aligned float4 reads in the merge).
            part_out = b.workspace((splits * c.batch * c.seqlen_q * c.heads * part_cols(variant),), numpy.float32)
            part_lse = b.workspace((splits * c.batch * c.heads * c.seqlen_q,), numpy.float32)
            counters = b.counters(c.batch * c.heads_k * row_tiles)
            main["part_out"], main["part_lse"] = part_out.data.ptr, part_lse.data.ptr
            main["split_counters"] = counters.data.ptr
        if int_seqlens:
            b.int32_field(main, ("cache_seqlens_value",))
        images = top = None
        if max_score:
            images = b.workspace((c.batch, c.heads), numpy.uint32, zeroed=True)
            top = b.output((c.batch, c.heads), numpy.float32)
            main["max_score"] = _params.pointer(images)
        smem = decode_smem_bytes(variant)
        structs = (main,)
        if variant.kernel is MLA_SM90:  # the cache's tensor map: boxes of 64 columns by 64 rows of one page
            cache_map = b.struct(MLA_SM90_MAP)
            sm90.tensor_map(b, cache_map, "k", cs.k_cache, False, MLA_SM90_ROWS)
            structs = (main, cache_map)
        b.launch(common.function(variant, smem), (row_tiles * splits, c.heads_k, c.batch), threads(variant), structs,
                 smem)
        if max_score:
            common.plan_max_score_decode(b, images, top)
        self.splits = splits
        self.fused_append = fused
        self.scalars = 1 + appended
        self.plan = b.build(((out, lse) if return_lse else (out,)) + ((top,) if max_score else ()))


def general_plannable(c, device, max_score):
    """Whether the general path of CuPy call ``c`` (which the decode kernel does not take) keeps a
    :class:`GeneralPlan`: a dense cache read as it is, or a paged one read in place by the Hopper forward
    (paged_prefill); not with cache_batch_idx, left padding or a gather of the pages (array operations
    that a plan does not hold), a score_mod or the maximum score (such calls are not planned), or a cache
    of no rows (nothing to launch)."""
    if (c.seqlen_q == 0 or c.capacity == 0 or max_score or c.user_score is not None or c.fp8
            or c.cache_batch_idx is not None or c.cache_leftpad is not None):
        return False
    if any(common.readable(x)[1] is not None for x in (c.k_cache, c.v_cache)):
        return False
    return c.block_table is None or paged_prefill(c, device)


def _first_entries(slot, batch):
    """A dense cache's slot as the batch's first ``batch`` entries (the same address: a view)."""
    if slot.shape[0] == batch:
        return slot
    return _plan.Slot(slot.index, (batch,) + slot.shape[1:], slot.dtype, slot.strides, slot.aligned16)


class GeneralPlan(CachePlan):
    """The general path of a call that :func:`general_plannable` admits: kvc_append where it has new
    tokens or queries to rotate, kvc_lengths (each entry's key count, seqused_k, and bad flag), the forward
    family's kernels over the cache (a dense cache's first batch entries, or the pages read in place by
    the Hopper forward), then kvc_poison over out and lse where an entry can be bad (a cache_seqlens or
    block_table array). A run returns (out,) or, with ``return_lse``, (out, lse)."""

    def __init__(self, c, device, alibi_slopes, return_lse, int_seqlens):
        self.capacity = c.capacity - c.seqlen_new if int_seqlens else None
        b = _plan.PlanBuilder()
        cs = _plan_inputs(b, c, alibi_slopes)
        q, appended = _plan_append(b, cs, int_seqlens, fused=False)
        seqused, bad = b.workspace((c.batch,), numpy.int32), b.workspace((c.batch,), numpy.int32)
        lengths = _fill_args(b.struct(_params.KV_CACHE_ARGS), cs, q, None, None)
        lengths["seqused_k"], lengths["bad"] = seqused.data.ptr, bad.data.ptr
        if int_seqlens:
            b.int32_field(lengths, ("cache_seqlens_value",))
        b.launch(common.function(LENGTHS.variant()), (c.batch, 1, 1), APPEND_THREADS, (lengths,))
        if c.block_table is not None:
            k, v = cs.k_cache, cs.v_cache
            p = _problem_of(cs, seqused_k=seqused, block_table=cs.block_table, page_size=c.page_size)
        else:
            k, v = (_first_entries(x, c.batch) for x in (cs.k_cache, cs.v_cache))
            p = _problem_of(cs, seqused_k=seqused)
        family, variant = _families.select(_families.FORWARD, p, device, (q, k, v))
        out, lse = family.plan(b, variant, p, q, k, v, device)
        if c.cache_seqlens is not None or c.block_table is not None:
            for x in (out, lse) if return_lse else (out,):
                _plan_poison(b, bad, x, c.batch)
        self.scalars = 1 + appended
        self.plan = b.build((out, lse) if return_lse else (out,))


def _plan_poison(b, bad, x, batch):
    """kvc_poison's launch in plan ``b``: the rows of ``x`` (a contiguous, batch-major slot) of the batch
    entries ``bad`` flags set to NaN."""
    args = [b.struct(dtype) for dtype in (numpy.uint64, numpy.uint64, numpy.int64, numpy.int64)]
    args[0][0], args[1][0], args[2][0], args[3][0] = bad.data.ptr, x.data.ptr, x.size // batch, x.size
    b.launch(common.function(POISON.variant(common.dtype_name(x.dtype))),
             (min(common.cdiv(x.size, POISON_THREADS), 4096), 1, 1), POISON_THREADS, args)


def launch(variant, grid, threads, args, smem=0):
    """Launches ``variant`` now, with its argument struct (a NumPy size-1 array) or a tuple of arguments:
    the general path's few launches, which no plan keeps."""
    kernel = _kernels.get_kernel(variant)
    common.function(variant, smem)  # allows the shared memory
    args = args if isinstance(args, tuple) else (args,)
    kernel(grid, (threads, 1, 1), tuple(_function.CPointer(a.ctypes.data) if isinstance(a, numpy.ndarray)
                                        else a for a in args), shared_mem=smem)


def attention(c, alibi_slopes, return_lse, int_seqlens, max_score=False):
    """(out, lse, top) of a checked CuPy call ``c`` (``alibi_slopes``: the call's own array; ``int_seqlens``:
    the call passed cache_seqlens as an int; lse None without ``return_lse`` where the decode kernel runs;
    top, with ``max_score``, each entry's and head's largest score, else None), the new keys and values
    written into the caches, and the :class:`CachePlan` that repeats the call for arrays of the same
    layout (None for the general path's calls that general_plannable turns away)."""
    device = common.current_device()
    variant = decode_variant(c, device, max_score)
    plan = None
    if variant is not None:
        plan = DecodePlan(c, variant, device, alibi_slopes, return_lse, int_seqlens, max_score)
    elif c.fp8:
        raise NotImplementedError("float8_e4m3fn caches run on CuPy arrays in the e4m3 decode kernel only: compute "
                                  "capability 9.0, at least one query, no softcap, head dims up to 256 with 16-byte rows "
                                  f"(multiples of 16), a paged cache or at most {DECODE_MAX_ROWS} query rows per kv "
                                  "head (README, 'FP8 inputs')")
    elif general_plannable(c, device, max_score):
        plan = GeneralPlan(c, device, alibi_slopes, return_lse, int_seqlens)
    if plan is not None:
        results = plan(c.q, c.k_cache, c.v_cache, c.k_new, c.v_new,
                       c.cache_seqlens if c.cache_seqlens is not None else c.cache_seqlens_value, c.cache_batch_idx,
                       c.block_table, c.rotary_cos, c.rotary_sin, alibi_slopes, c.cache_leftpad,
                       *(c.fp8[name] if c.fp8 else None for name in _fp8.DESCALES))
        return (results[0], results[1] if return_lse else None, results[-1] if max_score else None), plan
    q, _ = common.readable(c.q)
    # The kernels below index these per batch entry as contiguous arrays.
    c = dataclasses.replace(c, **{name: common.contiguous(getattr(c, name))[0]
                                  for name in ("cache_seqlens", "cache_batch_idx", "block_table", "cache_leftpad")})
    if c.k_new is not None:
        c = dataclasses.replace(c, k_new=common.readable(c.k_new)[0], v_new=common.readable(c.v_new)[0],
                                rotary_cos=common.contiguous(c.rotary_cos)[0], rotary_sin=common.contiguous(c.rotary_sin)[0])
        args = _fill_args(numpy.zeros(1, _params.KV_CACHE_ARGS), c, q, None, None)
        if c.rotary_dim:
            q_rot = cupy.empty(q.shape, dtype=c.dtype)
            args["q_rot"] = _params.tensor(q_rot)
        tokens = max(c.seqlen_new, c.seqlen_q if c.rotary_dim else 0)
        if tokens:
            launch(APPEND.variant(common.dtype_name(c.dtype)), (tokens, c.batch, 1), APPEND_THREADS, args)
        if c.rotary_dim:
            q = q_rot
    if c.seqlen_q == 0:
        top = cupy.full((c.batch, c.heads), -numpy.inf, dtype=numpy.float32) if max_score else None
        return (cupy.empty(c.out_shape, dtype=c.dtype), cupy.empty(c.lse_shape, dtype=_problem.lse_dtype(c.dtype)),
                top), None
    out, lse, *top = _general(c, q, max_score)
    return (out, lse, top[0] if max_score else None), None


def _general(c, q, max_score):
    """(out, lse), then with ``max_score`` the largest scores: the cache as a dense batch of capacity keys
    with per-entry counts (seqused_k), through the compute layer; the results of entries with out-of-range
    values NaN."""
    if c.cache_seqlens is None and c.block_table is None and c.cache_batch_idx is None and c.cache_leftpad is None:
        # Every entry uses the same keys, checked on the host: the dense forward over the caches' first keys.
        keys = c.cache_seqlens_value + c.seqlen_new
        p = _problem_of(c, seqlen_k=keys)
        return _compute.forward(p, q, c.k_cache[:c.batch, :keys], c.v_cache[:c.batch, :keys], max_score=max_score)
    seqused = cupy.empty(c.batch, numpy.int32)
    bad = cupy.empty(c.batch, numpy.int32)
    args = _fill_args(numpy.zeros(1, _params.KV_CACHE_ARGS), c, q, None, None)
    args["seqused_k"], args["bad"] = seqused.data.ptr, bad.data.ptr
    launch(LENGTHS.variant(), (c.batch, 1, 1), APPEND_THREADS, args)
    k, v = c.k_cache, c.v_cache
    if c.block_table is not None and paged_prefill(c, common.current_device()):
        results = _compute.forward(_paged_problem(c, seqused), q, k, v, max_score=max_score)
        return _poisoned(results, bad, c.batch)
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
    if c.cache_leftpad is not None:
        # Left padding (dense caches): entry b's keys from position cache_leftpad[b], shifted to the front
        # (rows past the capacity repeat the last, past seqused_k); an out-of-range value makes it bad.
        pad = c.cache_leftpad.astype(numpy.int64)
        lengths = (c.cache_seqlens if c.cache_seqlens is not None
                   else cupy.full(c.batch, c.cache_seqlens_value, numpy.int32)).astype(numpy.int64)
        bad = bad | ((pad < 0) | (pad > lengths)).astype(numpy.int32)
        rows = cupy.minimum(cupy.clip(pad, 0, c.capacity)[:, None] + cupy.arange(c.capacity)[None, :], c.capacity - 1)
        k = cupy.take_along_axis(k, rows[:, :, None, None], axis=1)
        v = cupy.take_along_axis(v, rows[:, :, None, None], axis=1)
        seqused = cupy.maximum(seqused - pad, 0).astype(numpy.int32)
    return _poisoned(_compute.forward(_problem_of(c, seqused_k=seqused), q, k, v, max_score=max_score), bad, c.batch)


def _poisoned(results, bad, batch):
    """``results`` with the rows of the batch entries that ``bad`` flags set to NaN."""
    for x in results:
        per_entry = x.size // batch
        launch(POISON.variant(common.dtype_name(x.dtype)), (min(common.cdiv(x.size, POISON_THREADS), 4096), 1, 1),
               POISON_THREADS, (bad, x, numpy.int64(per_entry), numpy.int64(x.size)))
    return results


def _paged_problem(c, seqused):
    """The forward problem of call ``c``'s paged cache read in place: the page pools as k and v, the block
    table (contiguous int32) and the entries' key counts."""
    table = common.contiguous(c.block_table)[0]
    return _problem_of(c, seqused_k=seqused, block_table=table, page_size=c.page_size)


def paged_prefill(c, device):
    """Whether the Hopper forward reads call ``c``'s paged cache in place: a prefill
    chunk (more than DECODE_MAX_ROWS queries) whose work tiles, one per 128 queries of each query head with
    no split of the keys, fill at least half the device (on an H100, 512 queries of 32 heads: 128 tiles
    on 132 SMs ran 9x the decode kernel's rate; shorter chunks keep the decode kernel, whose rows pack the
    query heads of a kv head and whose splits share the keys), on compute capability 9.0 with dispatch
    free to take the sm90 family (CUPYFLASH_FAMILY), page sizes whose TMA boxes are whole swizzle periods
    (sm90.paged_box_rows)."""
    if (c.block_table is None or device.capability != sm90.CAPABILITY
            or c.seqlen_q <= DECODE_MAX_ROWS or sm90.FORWARD not in _families.forced(_families.FORWARD)):
        return False
    if 2 * common.cdiv(c.seqlen_q, PREFILL_BLOCK_M) * c.batch * c.heads < device.sm_count:
        return False
    p = _paged_problem(c, c.cache_seqlens)
    # With rotary the kernel reads kvc_append's contiguous copy of q.
    q = _plan.Slot(0, c.q.shape, c.q.dtype) if c.rotary_dim else c.q
    return sm90.FORWARD.select(p, device, (q, c.k_cache, c.v_cache)) is not None
