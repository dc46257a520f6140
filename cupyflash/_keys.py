"""The keys of the public functions' plans (cupyflash/_plan.py): what a call's checks and setup depend on.

A key holds the layout of every array argument (kind, shape, strides, dtype, device and whether its
address is a multiple of 16 bytes: the kernels' vector loads and TMA need that), every other argument
with its type (``True`` and ``1`` differ: the checks refuse the second), and what else decides the
setup: the thread (a plan's argument buffer is rewritten by each run), the current device (its
functions belong to one) and ``CUPYFLASH_FAMILY``. Two calls with one key pass the same checks and
get the same plan, so a call whose key has a plan skips both. A key is None for NumPy arrays (they run
the NumPy twin, unplanned) and for arguments that are no hashable value (they take the checked path,
which reports them). Kept short: it is most of the host time of a planned call.
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
_environ = os.environ


def layout(x):
    """The layout of an array argument; None stays None. Raises AttributeError for a non-CuPy array."""
    if x is None:
        return None
    data = x.data
    return type(x), x.shape, x.strides, x.dtype, data.device_id, data.ptr & 15 == 0


def _typed(value):
    """A scalar argument with its type; a tuple (window_size) element by element."""
    if type(value) is tuple:
        return (tuple, *(_typed(v) for v in value))
    return value.__class__, value


def _key(kind, arrays, options):
    """The key of a call, or None (see the module docstring)."""
    if type(arrays[0]) is not _NDARRAY:
        return None
    try:
        key = (kind, _get_ident(), _get_device(), _environ.get("CUPYFLASH_FAMILY"), *map(layout, arrays),
               *map(_typed, options))
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


def forward(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask, return_lse):
    return _key("forward", (q, k, v, alibi_slopes), (causal, softmax_scale, window_size, softcap, block_mask,
                                                     return_lse))


def backward(dout, q, k, v, out, lse, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask,
             deterministic):
    return _key("backward", (q, dout, k, v, out, lse, alibi_slopes),
                (causal, softmax_scale, window_size, softcap, block_mask, deterministic))


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                   window_size, softcap, alibi_slopes, return_lse):
    # Without both max_seqlen the checks read cu_seqlens on the host, every call: no plan.
    if max_seqlen_q is None or max_seqlen_k is None:
        return None
    return _key("varlen_forward", (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes),
                (max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size, softcap, return_lse))


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                    softmax_scale, window_size, softcap, alibi_slopes, deterministic):
    if max_seqlen_q is None or max_seqlen_k is None:
        return None
    return _key("varlen_backward", (q, dout, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes),
                (max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size, softcap, deterministic))


def kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
            rotary_interleaved, causal, window_size, softcap, alibi_slopes, softmax_scale, num_splits, return_lse):
    # An int cache_seqlens is a value of every call (checked against the plan's capacity), not a layout.
    seqlens = cache_seqlens if hasattr(cache_seqlens, "data") else None
    return _key("kvcache", (q, k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
                            alibi_slopes),
                (type(cache_seqlens), rotary_interleaved, causal, window_size, softcap, softmax_scale, num_splits,
                 return_lse))
