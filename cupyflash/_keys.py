"""The keys of the public functions' plans (cupyflash/_plan.py): what a call's checks and setup depend on.

A key holds the layout of every array argument (kind, shape, strides, dtype, device and whether its
address is a multiple of 16 bytes: the kernels' vector loads and TMA need that), every other argument
with its type (``True`` and ``1`` differ: the checks refuse the second), and what else decides the
setup: the thread (a plan's argument buffer is rewritten by each run), the current device (its
functions belong to one) and ``CUPYFLASH_FAMILY``. Two calls with one key pass the same checks and
get the same plan, so a call whose key has a plan skips both. A key is None for NumPy arrays (they run
the NumPy twin, unplanned) and for arguments a key cannot hold (they take the checked path, which
reports them); an unhashable argument makes an unhashable key, which cupyflash._plan.PlanCache treats
as a miss.

A key is most of the host time of a planned call, so the functions below spell their tuples out
rather than build them from helpers: each function call costs about a tenth of a microsecond.
"""

import os
import threading

try:
    import cupy as _cupy_module

    _NDARRAY = _cupy_module.ndarray
    _get_device = _cupy_module.cuda.runtime.getDevice
except ImportError:  # the NumPy path needs no CuPy
    _NDARRAY = None
    _get_device = None

_get_ident = threading.get_ident
FAMILY_VARIABLE = "CUPYFLASH_FAMILY"
# os.environ.get of an unset variable raises and catches a KeyError inside (about a microsecond);
# CPython's mapping behind os.environ answers at once. Elsewhere, the portable way.
try:
    _ENVIRON = os.environ._data
    _FAMILY_KEY = os.environ.encodekey(FAMILY_VARIABLE)
except AttributeError:  # pragma: no cover (no CPython _Environ)
    _ENVIRON, _FAMILY_KEY = os.environ, FAMILY_VARIABLE


def layout(x):
    """The layout of an array argument other than the first; None stays None. Raises AttributeError for a
    NumPy array (its data has no device)."""
    if x is None:
        return None
    data = x.data
    return type(x), x.shape, x.strides, x.dtype.num, data.device_id, data.ptr & 15 == 0


def forward(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask, return_lse, precision):
    if type(q) is not _NDARRAY:
        return None
    try:
        left, right = window_size
        qd, kd, vd = q.data, k.data, v.data
        return (0, _get_ident(), _get_device(), _ENVIRON.get(_FAMILY_KEY),
                q.shape, q.strides, q.dtype.num, qd.device_id, qd.ptr & 15 == 0,
                type(k), k.shape, k.strides, k.dtype.num, kd.device_id, kd.ptr & 15 == 0,
                type(v), v.shape, v.strides, v.dtype.num, vd.device_id, vd.ptr & 15 == 0,
                None if alibi_slopes is None else layout(alibi_slopes),
                causal.__class__, causal, softmax_scale.__class__, softmax_scale, window_size.__class__,
                left.__class__, left, right.__class__, right, softcap.__class__, softcap, block_mask,
                return_lse.__class__, return_lse, precision.__class__, precision)
    except (AttributeError, TypeError, ValueError):
        return None


def with_extras(key, sinks, return_max_score=False):
    """The key of a call that differs from a plain one (``key``) by its sinks or the maximum score: the
    plain key with their layout and value; None where ``key`` is, and for sinks that are not contiguous
    (a plan's run writes the address of the sinks it is given, which the kernels read as contiguous)."""
    if key is None:
        return None
    try:
        if sinks is not None and not sinks.flags.c_contiguous:
            return None
        return key, layout(sinks), return_max_score.__class__, return_max_score
    except (AttributeError, TypeError, ValueError):
        return None


def merge(arrays, packed=None):
    """The key of a merge of CuPy ``arrays`` (merge_attention_states: out_a, lse_a, out_b, lse_b;
    merge_attention_states_stacked: out, lse, with ``packed``): None where the first is not a CuPy array
    or a layout cannot be read."""
    if type(arrays[0]) is not _NDARRAY:
        return None
    try:
        return ("merge", _get_ident(), _get_device(), tuple(layout(x) for x in arrays), packed.__class__, packed)
    except (AttributeError, TypeError, ValueError):
        return None


def with_dropout(key, dropout_p):
    """The key of a call that differs from one of key ``key`` by dropout at rate ``dropout_p`` (a float;
    the seed and offset are the plan's per-run scalars): ``key`` where ``dropout_p`` is None."""
    if key is None or dropout_p is None:
        return key
    return key, "dropout", dropout_p


def with_fp8(key, q_descale, k_descale, v_descale, out_dtype):
    """The key of an FP8 call (``key``: the key of the same call without its descales and out_dtype): the
    descales' layouts and out_dtype with its type; None where ``key`` is, and for descales that are not
    contiguous (a plan's run writes the address it is given, which the kernels read as contiguous)."""
    if key is None:
        return None
    try:
        if any(x is not None and not x.flags.c_contiguous for x in (q_descale, k_descale, v_descale)):
            return None
        return key, layout(q_descale), layout(k_descale), layout(v_descale), out_dtype.__class__, out_dtype
    except (AttributeError, TypeError, ValueError):
        return None


def backward(dout, q, k, v, out, lse, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask,
             deterministic, precision):
    if type(q) is not _NDARRAY:
        return None
    try:
        left, right = window_size
        qd, kd, vd, dd, od, ld = q.data, k.data, v.data, dout.data, out.data, lse.data
        return (1, _get_ident(), _get_device(), _ENVIRON.get(_FAMILY_KEY),
                q.shape, q.strides, q.dtype.num, qd.device_id, qd.ptr & 15 == 0,
                type(k), k.shape, k.strides, k.dtype.num, kd.device_id, kd.ptr & 15 == 0,
                type(v), v.shape, v.strides, v.dtype.num, vd.device_id, vd.ptr & 15 == 0,
                type(dout), dout.shape, dout.strides, dout.dtype.num, dd.device_id, dd.ptr & 15 == 0,
                type(out), out.shape, out.strides, out.dtype.num, od.device_id, od.ptr & 15 == 0,
                type(lse), lse.shape, lse.strides, lse.dtype.num, ld.device_id,
                None if alibi_slopes is None else layout(alibi_slopes),
                causal.__class__, causal, softmax_scale.__class__, softmax_scale, window_size.__class__,
                left.__class__, left, right.__class__, right, softcap.__class__, softcap, block_mask,
                deterministic.__class__, deterministic, precision.__class__, precision)
    except (AttributeError, TypeError, ValueError):
        return None


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                   window_size, softcap, alibi_slopes, return_lse, precision, seqused_k=None):
    # Without both max_seqlen the checks read cu_seqlens on the host, every call: no plan.
    if type(q) is not _NDARRAY or max_seqlen_q is None or max_seqlen_k is None:
        return None
    try:
        left, right = window_size
        return (2, _get_ident(), _get_device(), _ENVIRON.get(_FAMILY_KEY), layout(q), layout(k), layout(v),
                layout(cu_seqlens_q), layout(cu_seqlens_k), layout(alibi_slopes), layout(seqused_k),
                max_seqlen_q.__class__, max_seqlen_q, max_seqlen_k.__class__, max_seqlen_k,
                causal.__class__, causal, softmax_scale.__class__, softmax_scale, window_size.__class__,
                left.__class__, left, right.__class__, right, softcap.__class__, softcap,
                return_lse.__class__, return_lse, precision.__class__, precision)
    except (AttributeError, TypeError, ValueError):
        return None


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                    softmax_scale, window_size, softcap, alibi_slopes, deterministic, precision):
    if type(q) is not _NDARRAY or max_seqlen_q is None or max_seqlen_k is None:
        return None
    try:
        left, right = window_size
        return (3, _get_ident(), _get_device(), _ENVIRON.get(_FAMILY_KEY), layout(q), layout(k), layout(v),
                layout(dout), layout(out), layout(lse), layout(cu_seqlens_q), layout(cu_seqlens_k),
                layout(alibi_slopes), max_seqlen_q.__class__, max_seqlen_q, max_seqlen_k.__class__, max_seqlen_k,
                causal.__class__, causal, softmax_scale.__class__, softmax_scale, window_size.__class__,
                left.__class__, left, right.__class__, right, softcap.__class__, softcap,
                deterministic.__class__, deterministic, precision.__class__, precision)
    except (AttributeError, TypeError, ValueError):
        return None


def kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
            rotary_interleaved, causal, window_size, softcap, alibi_slopes, softmax_scale, num_splits, return_lse,
            precision):
    if type(q) is not _NDARRAY:
        return None
    try:
        left, right = window_size
        # An int cache_seqlens is a value of every call (the plan checks it against its capacity), an
        # array a layout.
        seqlens = layout(cache_seqlens) if isinstance(cache_seqlens, _NDARRAY) else cache_seqlens.__class__
        qd, kd, vd = q.data, k_cache.data, v_cache.data
        return (4, _get_ident(), _get_device(), _ENVIRON.get(_FAMILY_KEY),
                q.shape, q.strides, q.dtype.num, qd.device_id, qd.ptr & 15 == 0,
                type(k_cache), k_cache.shape, k_cache.strides, k_cache.dtype.num, kd.device_id, kd.ptr & 15 == 0,
                type(v_cache), v_cache.shape, v_cache.strides, v_cache.dtype.num, vd.device_id, vd.ptr & 15 == 0,
                vd.ptr == kd.ptr,  # v_cache a view of k_cache's first columns: the MLA decode kernel's layout
                None if k is None else (layout(k), layout(v)), seqlens,
                None if cache_batch_idx is None else layout(cache_batch_idx),
                None if block_table is None else layout(block_table),
                None if rotary_cos is None else (layout(rotary_cos), layout(rotary_sin)),
                None if alibi_slopes is None else layout(alibi_slopes),
                rotary_interleaved.__class__, rotary_interleaved, causal.__class__, causal, window_size.__class__,
                left.__class__, left, right.__class__, right, softcap.__class__, softcap,
                softmax_scale.__class__, softmax_scale, num_splits.__class__, num_splits,
                return_lse.__class__, return_lse, precision.__class__, precision)
    except (AttributeError, TypeError, ValueError):
        return None
