"""flash_attention_with_kvcache, in one package: call.py (the checks of a call, the host checks of a NumPy
call's values), host.py (the NumPy twin), device.py (the kernels, the decode plans and the general path
on the GPU). A CuPy call that takes the decode kernel, or the general path over a dense cache or pages
read in place, leaves a plan keyed by its layout (cupyflash/_keys.py), which the next call of that
layout runs without checks or setup.

Importing this package needs no CuPy: device.py is imported by the first CuPy call."""

import dataclasses
import os

import numpy

from .. import _keys, _merge, _plan, _problem
from . import call as _call
from . import host as _host

MAX_SPLITS = _call.MAX_SPLITS
#: ``CUPYFLASH_CHECK=1``: CuPy calls check cache_seqlens, cache_leftpad, cache_batch_idx and block_table on
#: the host (a copy to the host and a wait, every call, plans skipped), raising ValueError as NumPy calls
#: do, where by default an entry with an out-of-range value gets NaN rows.
CHECK_VARIABLE = "CUPYFLASH_CHECK"
# Read on every call (a planned call's hot path): CPython's mapping behind os.environ, as _keys.py reads
# CUPYFLASH_FAMILY, without os.environ.get's exception for an unset variable.
try:
    _ENVIRON, _CHECK_KEY = os.environ._data, os.environ.encodekey(CHECK_VARIABLE)
except AttributeError:  # pragma: no cover (no CPython _Environ)
    _ENVIRON, _CHECK_KEY = os.environ, CHECK_VARIABLE


def checked_mode():
    return _ENVIRON.get(_CHECK_KEY) not in (None, b"", b"0", "", "0")

#: The plans (device.CachePlan), by key.
PLANS = _plan.PlanCache()


def attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
              rotary_interleaved, causal, window_size, softcap, alibi_slopes, softmax_scale, num_splits, return_lse,
              precision, sinks=None, return_max_score=False, score_mod=None, score_mod_buffers=None,
              cache_leftpad=None, q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    """The body of cupyflash.flash_attention_with_kvcache (its docstring describes the arguments)."""
    # Calls with sinks, the maximum score, a score_mod or left padding take the checked path (no plan);
    # e4m3 calls' descales and out_dtype are part of their key (contiguous descales only).
    plain = (sinks is None and return_max_score is False and score_mod is None and cache_leftpad is None
             and not checked_mode())
    key = None if not plain else _keys.kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                                               rotary_cos, rotary_sin, rotary_interleaved, causal, window_size,
                                               softcap, alibi_slopes, softmax_scale, num_splits, return_lse, precision)
    if q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not None:
        key = _keys.with_fp8(key, q_descale, k_descale, v_descale, out_dtype)
    plan = PLANS.get(key)
    if plan is not None:
        results = plan(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
                       alibi_slopes, None, q_descale, k_descale, v_descale)
        return results if return_lse else results[0]
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    named.update({n: x for n, x in (("k", k), ("v", v), ("cache_batch_idx", cache_batch_idx), ("block_table", block_table),
                                   ("cache_leftpad", cache_leftpad), ("rotary_cos", rotary_cos),
                                   ("rotary_sin", rotary_sin)) if x is not None})
    if cache_seqlens is not None and not _problem.is_int(cache_seqlens):
        if not hasattr(cache_seqlens, "shape"):
            raise TypeError(f"cache_seqlens must be an int, an int32 array (batch,) of q's kind or None, got "
                            f"{type(cache_seqlens).__name__} {cache_seqlens!r}")
        named["cache_seqlens"] = cache_seqlens
    # With k and v the caches are written in place (kvcache/call.py checks that they are writable).
    written = ("k_cache", "v_cache") if k is not None or v is not None else ()
    checked = dict(zip(named, _problem.arrays(written=written, **named)))
    return_lse = _problem.check_flag("return_lse", return_lse)
    return_max_score = _problem.check_flag("return_max_score", return_max_score)
    c = _call.check(
        checked["q"], checked["k_cache"], checked["v_cache"], k=checked.get("k"), v=checked.get("v"),
        cache_seqlens=checked.get("cache_seqlens", cache_seqlens), cache_batch_idx=checked.get("cache_batch_idx"),
        block_table=checked.get("block_table"), rotary_cos=checked.get("rotary_cos"),
        rotary_sin=checked.get("rotary_sin"), rotary_interleaved=rotary_interleaved, causal=causal,
        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, softmax_scale=softmax_scale,
        num_splits=num_splits, max_splits=MAX_SPLITS, precision=precision, sinks=sinks, score_mod=score_mod,
        score_mod_buffers=score_mod_buffers, cache_leftpad=checked.get("cache_leftpad"), q_descale=q_descale,
        k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype)
    if c.xp is not numpy and checked_mode():
        names = ("cache_seqlens", "cache_leftpad", "cache_batch_idx", "block_table")
        host = {name: None if getattr(c, name) is None else getattr(c, name).get() for name in names}
        _call.check_values_on_host(dataclasses.replace(c, **host))
    top = None
    if c.xp is numpy:
        out, lse, *top = _host.attention(c, max_score=return_max_score)
    elif c.batch == 0 or c.heads == 0:
        out = c.xp.zeros(c.out_shape, c.output_dtype)
        lse = c.xp.full(c.lse_shape, -numpy.inf, _problem.lse_dtype(c.dtype))
        top = [c.xp.full((c.batch, c.heads), -numpy.inf, numpy.float32)] if return_max_score else None
    else:
        from . import device

        int_seqlens = cache_seqlens is not None and "cache_seqlens" not in named
        (out, lse, top), plan = device.attention(c, alibi_slopes, return_lse or c.sinks is not None, int_seqlens,
                                                 return_max_score)
        top = [top] if return_max_score else None
        if plan is not None and key is not None:
            PLANS.put(key, plan)
    if c.sinks is not None:
        out, lse = _merge.add_sinks(c.xp, out, lse, c.sinks, packed=False)
    results = (out,) + ((lse,) if return_lse else ()) + tuple(top or ())
    return results if len(results) > 1 else out
