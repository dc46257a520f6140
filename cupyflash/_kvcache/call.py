"""The checks of a flash_attention_with_kvcache call and the :class:`KvCacheCall` they return; the host
checks of a NumPy call's values. Needs no CuPy (a NumPy call imports only this and host.py)."""

import dataclasses

import numpy

from .. import _problem

#: Largest num_splits: the decode kernel's split merge keeps a row tile's weights of every split in
#: shared memory (kvcache/split_merge.cuh's kMaxSplits; device.cxx_facts checks it). Here, not beside the kernels,
#: because the checks of a NumPy call need it and must not import CuPy.
MAX_SPLITS = 256


@dataclasses.dataclass(frozen=True)
class KvCacheCall:
    """A validated call: sizes, options and the arrays (k_new/v_new None without new tokens)."""

    xp: object
    dtype: numpy.dtype
    batch: int
    seqlen_q: int
    heads: int
    heads_k: int
    headdim: int
    headdim_v: int
    capacity: int          # keys one batch entry can hold: cache_len, or max_pages * page_size
    page_size: int         # 0: dense cache
    cache_entries: int     # pages of a paged cache, entries of a dense one
    seqlen_new: int
    softmax_scale: float
    window_left: int
    window_right: int
    softcap: float
    precision: str         # _problem.PRECISIONS
    alibi_slopes: object
    rotary_dim: int
    rotary_interleaved: bool
    rotary_q_at_row: bool
    cache_seqlens: object      # int32 array (batch,), or None: cache_seqlens_value for every entry
    cache_seqlens_value: int
    num_splits: int
    q: object
    k_cache: object
    v_cache: object
    k_new: object
    v_new: object
    cache_batch_idx: object
    block_table: object
    cache_leftpad: object      # int32 array (batch,): each entry's first key position; None: 0
    rotary_cos: object
    rotary_sin: object
    sinks: object = None       # float32 (heads,) of q's kind, or None
    fp8: dict = None           # e4m3 inputs: the Problem fields of _problem.check_fp8 (out_dtype, descales)
    user_score: object = None  # a traced score_mod (cupyflash/_trace.py), or None
    user_buffers: object = None  # its buffers when given, else None

    @property
    def out_shape(self):
        return (self.batch, self.seqlen_q, self.heads, self.headdim_v)

    @property
    def output_dtype(self):
        return self.fp8["out_dtype"] if self.fp8 else self.dtype

    @property
    def lse_shape(self):
        return (self.batch, self.heads, self.seqlen_q)


def _index_array(name, x, xp, shape_text, ndim):
    if x is None:
        return None
    if _problem.array_module({name: x}) is not xp:
        raise TypeError(f"{name} must be a {'cupy' if xp is not numpy else 'numpy'} array like q")
    if x.dtype != numpy.int32:
        raise TypeError(f"{name} has dtype {x.dtype}; expected int32")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_text}, got {x.shape}")
    _problem.check_devices(xp, {name: x})
    return x


def _count(name, value, low, high=None):
    if not _problem.is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < low or high is not None and value > high:
        bound = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check(q, k_cache, v_cache, *, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
          rotary_interleaved, causal, window_size, softcap, alibi_slopes, softmax_scale, num_splits, max_splits,
          precision, sinks=None, score_mod=None, score_mod_buffers=None, cache_leftpad=None, q_descale=None,
          k_descale=None, v_descale=None, out_dtype=None):
    """Checks a flash_attention_with_kvcache call (arrays from :func:`_problem.arrays`); returns its
    :class:`KvCacheCall`. NumPy calls also check cache_seqlens, cache_batch_idx and block_table's values
    here; CuPy calls check array values on the device (see the decode kernel)."""
    if (getattr(q, "dtype", None) == _problem.FP8_DTYPE and getattr(k_cache, "dtype", None) == _problem.FP8_DTYPE
            and rotary_cos is not None):
        raise ValueError("rotary_cos is not offered with float8_e4m3fn caches (rotate in bfloat16, then quantize)")
    floating = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    for name, x in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if x is not None:
            floating[name] = x
    xp = _problem.array_module(floating)
    dtype = _problem.check_dtypes(floating, fp8=True)
    _problem.check_rank("q", q, ("batch", "seqlen_q", "heads", "headdim"))
    paged = block_table is not None
    cache_axes = ("num_pages", "page_size", "heads_k", "headdim") if paged else ("batch_cache", "cache_len", "heads_k", "headdim")
    for name in ("k_cache", "v_cache"):
        _problem.check_rank(name, floating[name], cache_axes)
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache and v_cache must agree on {', '.join(cache_axes[:3])}; got {k_cache.shape} and "
                         f"{v_cache.shape}")
    batch, seqlen_q, heads, headdim = q.shape
    heads_k, headdim_v = k_cache.shape[2], v_cache.shape[3]
    if k_cache.shape[3] != headdim:
        raise ValueError(f"q and k_cache must have the same headdim; got q {headdim}, k_cache {k_cache.shape[3]}")
    if headdim < 1 or headdim_v < 1:
        raise ValueError(f"headdim must be at least 1; got q/k headdim {headdim}, v headdim {headdim_v}")
    _problem.check_heads(heads, heads_k)
    for name in ("k_cache", "v_cache"):
        x = floating[name]
        # (an empty cache has no layout to keep: NumPy gives its axes stride 0)
        if x.size > 0 and x.shape[3] > 1 and x.strides[3] != x.dtype.itemsize:
            raise ValueError(f"{name} must have a contiguous last axis (it is written in place); got strides {x.strides}")

    cache_batch_idx = _index_array("cache_batch_idx", cache_batch_idx, xp, f"({batch},)", 1)
    block_table = _index_array("block_table", block_table, xp, "(batch, max_pages)", 2)
    if paged:
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table must have shape ({batch}, max_pages) (batch, max_pages), got {block_table.shape}")
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx is for dense caches; a paged cache maps batch entries to pages through "
                             "block_table")
        page_size = k_cache.shape[1]
        if page_size < 1:
            raise ValueError(f"a paged cache needs pages of at least 1 row; k_cache has shape {k_cache.shape}")
        capacity = block_table.shape[1] * page_size
    else:
        page_size = 0
        capacity = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] < batch:
            raise ValueError(f"k_cache holds {k_cache.shape[0]} entries for a batch of {batch}; pass cache_batch_idx to "
                             "map batch entries to cache entries")
        if cache_batch_idx is not None and cache_batch_idx.shape != (batch,):
            raise ValueError(f"cache_batch_idx must have shape ({batch},), got {cache_batch_idx.shape}")
    cache_entries = k_cache.shape[0]
    cache_leftpad = _index_array("cache_leftpad", cache_leftpad, xp, f"({batch},)", 1)
    if cache_leftpad is not None:
        if paged:
            raise ValueError("cache_leftpad is for dense caches (FlashAttention-2 does not take it with a block_table "
                             "either)")
        if cache_leftpad.shape != (batch,):
            raise ValueError(f"cache_leftpad must have shape ({batch},), got {cache_leftpad.shape}")
        if score_mod is not None:  # its kv_idx is the position in the cache, which the padding would shift
            raise NotImplementedError("score_mod with cache_leftpad is not offered yet")

    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the new keys and values), or both left None")
    seqlen_new = 0
    if k is not None:
        _problem.check_rank("k", k, ("batch", "seqlen_new", "heads_k", "headdim"))
        _problem.check_rank("v", v, ("batch", "seqlen_new", "heads_k", "headdim_v"))
        expected_k, expected_v = (batch, k.shape[1], heads_k, headdim), (batch, k.shape[1], heads_k, headdim_v)
        if k.shape != expected_k or v.shape != expected_v:
            raise ValueError(f"k and v must have shapes {expected_k} and {expected_v} (batch, seqlen_new, heads_k, "
                             f"headdim); got {k.shape} and {v.shape}")
        seqlen_new = k.shape[1]
        if seqlen_new > capacity:
            raise ValueError(f"{seqlen_new} new keys do not fit a cache of {capacity} keys per batch entry")
        # Both caches, before anything is written: a read-only v_cache must not leave k_cache half updated.
        for name in ("k_cache", "v_cache"):
            if xp is numpy and not floating[name].flags.writeable:
                raise ValueError(f"{name} is read-only; the new keys and values (k, v) are written into k_cache and "
                                 f"v_cache in place, so both must be writable (pass a writable array, e.g. {name}.copy())")

    value = 0
    if cache_seqlens is None:
        value = capacity - seqlen_new
    elif _problem.is_int(cache_seqlens):
        value = _count("cache_seqlens", cache_seqlens, 0, capacity - seqlen_new)
        cache_seqlens = None
    else:
        cache_seqlens = _index_array("cache_seqlens", cache_seqlens, xp, f"({batch},)", 1)
        if cache_seqlens.shape != (batch,):
            raise ValueError(f"cache_seqlens must be an int or have shape ({batch},), got {cache_seqlens.shape}")

    fp8 = _problem.check_fp8(dtype, xp, batch, heads, heads_k, q_descale, k_descale, v_descale, out_dtype)
    if fp8:
        if score_mod is not None:
            raise ValueError("score_mod is not offered with float8_e4m3fn caches (modify scores in bfloat16)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    rotary_dim = 0
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos/rotary_sin rotate the new keys: pass k and v with them")
        for name, x in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            _problem.check_rank(name, x, ("max_position", "rotary_dim / 2"))
        if rotary_cos.shape != rotary_sin.shape:
            raise ValueError(f"rotary_cos and rotary_sin must have one shape; got {rotary_cos.shape} and {rotary_sin.shape}")
        rotary_dim = 2 * rotary_cos.shape[1]
        if not 0 < rotary_dim <= headdim:
            raise ValueError(f"rotary_cos has {rotary_cos.shape[1]} columns: rotary_dim = 2 * that must be in [2, headdim "
                             f"= {headdim}]")
    rotary_interleaved = _problem.check_flag("rotary_interleaved", rotary_interleaved)
    causal = _problem.check_flag("causal", causal)
    window_left, window_right = _problem.check_window(window_size, causal)
    if rotary_cos is not None:
        # Keys rotate at positions up to capacity - 1; with causal or a window query i rotates at
        # cache_seqlens + i, which reaches capacity - seqlen_new + seqlen_q - 1.
        q_at_row = causal or window_left >= 0 or window_right >= 0
        positions = max(capacity, capacity - seqlen_new + (seqlen_q if q_at_row else 1))
        if rotary_cos.shape[0] < positions:
            queries = f", and query i rotates at cache_seqlens + i for {seqlen_q} queries" if q_at_row else ""
            raise ValueError(f"rotary_cos has {rotary_cos.shape[0]} positions; {positions} are needed (the cache holds "
                             f"{capacity} keys per batch entry{queries}), and every position needs its angles")
    scale = _problem.check_softmax_scale(softmax_scale, headdim, dtype)
    softcap = _problem.check_softcap(softcap, dtype, scale)
    precision = _problem.check_precision(precision, dtype)
    alibi_slopes = _problem.check_alibi_slopes(alibi_slopes, xp, batch, heads)
    sinks = _problem.check_sinks(sinks, xp, heads)
    user_score, user_buffers = _problem.check_score_mod(score_mod, score_mod_buffers, xp, softcap, alibi_slopes)
    num_splits = _count("num_splits", num_splits, 0, max_splits)
    _problem.check_sizes((("capacity", capacity), ("seqlen_q", seqlen_q), ("headdim", headdim),
                            ("headdim_v", headdim_v)))
    if batch > 65535 or heads_k > 65535:
        raise ValueError(f"batch and heads_k must be at most 65535 (grid axes); got {batch} and {heads_k}")
    named = {n: x for n, x in (("cache_batch_idx", cache_batch_idx), ("block_table", block_table),
                               ("cache_seqlens", cache_seqlens), ("cache_leftpad", cache_leftpad)) if x is not None}
    _problem.check_devices(xp, {**floating, **named})
    call = KvCacheCall(
        xp=xp, dtype=dtype, batch=batch, seqlen_q=seqlen_q, heads=heads, heads_k=heads_k, headdim=headdim,
        headdim_v=headdim_v, capacity=capacity, page_size=page_size, cache_entries=cache_entries,
        seqlen_new=seqlen_new, softmax_scale=scale, window_left=window_left, window_right=window_right,
        softcap=softcap, precision=precision, alibi_slopes=alibi_slopes, rotary_dim=rotary_dim,
        rotary_interleaved=rotary_interleaved,
        rotary_q_at_row=causal or window_left >= 0 or window_right >= 0, cache_seqlens=cache_seqlens,
        cache_seqlens_value=value, num_splits=num_splits, q=q, k_cache=k_cache, v_cache=v_cache, k_new=k, v_new=v,
        cache_batch_idx=cache_batch_idx, block_table=block_table, cache_leftpad=cache_leftpad, rotary_cos=rotary_cos,
        rotary_sin=rotary_sin, sinks=sinks, fp8=fp8 or None, user_score=user_score, user_buffers=user_buffers)
    if xp is numpy:
        check_values_on_host(call)
    return call


def cached_lengths(c):
    """cache_seqlens as an int64 NumPy array of the batch's entries (a NumPy call's)."""
    if c.cache_seqlens is None:
        return numpy.full(c.batch, c.cache_seqlens_value, numpy.int64)
    return c.cache_seqlens.astype(numpy.int64)


def first_keys(c):
    """cache_leftpad as an int64 NumPy array of the batch's entries (zeros without it)."""
    if c.cache_leftpad is None:
        return numpy.zeros(c.batch, numpy.int64)
    return c.cache_leftpad.astype(numpy.int64)


def cache_positions(c, b, positions):
    """(cache entry or page, row in it) index arrays of batch entry b's key positions, for a NumPy call:
    the host's one map of positions to cache rows (kernels_cu/kvcache/cache.cuh is the kernels')."""
    if c.block_table is not None:
        return c.block_table[b, positions // c.page_size], positions % c.page_size
    entry = b if c.cache_batch_idx is None else int(c.cache_batch_idx[b])
    return numpy.full_like(positions, entry), positions


def check_values_on_host(c):
    lengths = cached_lengths(c)
    if ((lengths < 0) | (lengths + c.seqlen_new > c.capacity)).any():
        raise ValueError(f"cache_seqlens must lie in [0, {c.capacity - c.seqlen_new}] (the cache holds {c.capacity} keys "
                         f"per batch entry, {c.seqlen_new} of them new); got {numpy.array2string(lengths, threshold=12)}")
    starts = first_keys(c)
    if ((starts < 0) | (starts > lengths)).any():
        bad = int(numpy.flatnonzero((starts < 0) | (starts > lengths))[0])
        raise ValueError(f"cache_leftpad[{bad}] must lie in [0, cache_seqlens[{bad}] = {lengths[bad]}], got {starts[bad]}")
    if c.cache_batch_idx is not None:
        idx = c.cache_batch_idx
        if ((idx < 0) | (idx >= c.cache_entries)).any():
            raise ValueError(f"cache_batch_idx must index the cache's {c.cache_entries} entries; got "
                             f"{numpy.array2string(idx, threshold=12)}")
    if c.block_table is not None:
        for b in range(c.batch):
            # One position per page the entry uses.
            used, _ = cache_positions(c, b, numpy.arange(0, lengths[b] + c.seqlen_new, c.page_size))
            if ((used < 0) | (used >= c.cache_entries)).any():
                raise ValueError(f"block_table row {b} names pages outside the cache's {c.cache_entries}: "
                                 f"{numpy.array2string(used, threshold=12)}")
    if c.batch and c.seqlen_new and (c.cache_batch_idx is not None or c.block_table is not None):
        _check_written_rows_unshared(c, lengths, starts)


def _check_written_rows_unshared(c, lengths, starts):
    """ValueError where a cache row that a batch entry's new token goes to is also read or written by
    another entry (a repeated cache_batch_idx value, a page in two block-table rows): the kernels write
    new tokens while other entries read, so such rows have no defined contents."""
    rows_per_entry = c.page_size if c.block_table is not None else c.capacity
    written, writer, read, reader = [], [], [], []
    for b in range(c.batch):
        entry, row = cache_positions(c, b, numpy.arange(starts[b], lengths[b] + c.seqlen_new))
        ids = entry.astype(numpy.int64) * rows_per_entry + row
        read.append(ids)
        reader.append(numpy.full(ids.shape, b))
        written.append(ids[lengths[b] - starts[b]:])
        writer.append(numpy.full(c.seqlen_new, b))
    written, writer, read, reader = (numpy.concatenate(x) for x in (written, writer, read, reader))
    order = numpy.argsort(written, kind="stable")
    written, writer = written[order], writer[order]
    at = numpy.minimum(numpy.searchsorted(written, read), written.size - 1)
    # A row two entries write is found by one of them as the other's: the first writer in sorted order.
    clash = (written[at] == read) & (writer[at] != reader)
    if clash.any():
        i = int(numpy.flatnonzero(clash)[0])
        where = "page" if c.block_table is not None else "cache entry"
        raise ValueError(f"batch entries {int(writer[at[i]])} and {int(reader[i])} share row {int(read[i] % rows_per_entry)} "
                         f"of {where} {int(read[i] // rows_per_entry)}, which entry {int(writer[at[i]])}'s new keys are "
                         "written to; entries must not share the rows their new tokens go to (repeated cache_batch_idx "
                         "values, pages in two block_table rows)")
