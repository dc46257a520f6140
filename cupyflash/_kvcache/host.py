"""The NumPy twin of flash_attention_with_kvcache: the new keys and values written into the caches, then
the attention of every entry's queries to its keys (from cache_leftpad on), packed as a varlen batch,
through the compute layer (the tiled NumPy forward)."""

import numpy

from .. import _compute, _problem, reference
from .call import cache_positions, cached_lengths, first_keys


def attention(c, max_score=False):
    """(out, lse), and with ``max_score`` each entry's and head's largest score, of a checked NumPy call
    ``c`` (without its sinks); the new keys and values are written into the caches first."""
    lengths = cached_lengths(c)
    q = c.q
    if c.k_new is not None:
        new_positions = lengths[:, None] + numpy.arange(c.seqlen_new)[None, :]
        k_new = c.k_new
        if c.rotary_dim:
            k_new = reference.apply_rotary(k_new, c.rotary_cos, c.rotary_sin, new_positions, c.rotary_interleaved)
            q_positions = lengths[:, None] + (numpy.arange(c.seqlen_q)[None, :] if c.rotary_q_at_row else 0)
            q = reference.apply_rotary(q, c.rotary_cos, c.rotary_sin,
                                       numpy.broadcast_to(q_positions, (c.batch, c.seqlen_q)),
                                       c.rotary_interleaved).astype(c.dtype)
        for b in range(c.batch):
            entry, row = cache_positions(c, b, new_positions[b])
            c.k_cache[entry, row] = k_new[b].astype(c.dtype)
            c.v_cache[entry, row] = c.v_new[b]
    # Entry b's keys: positions cache_leftpad[b] (0 without it) up to its length, a sequence of their own.
    starts = first_keys(c)
    keys = lengths + c.seqlen_new - starts
    gathered = [cache_positions(c, b, numpy.arange(starts[b], starts[b] + keys[b])) for b in range(c.batch)]
    k = numpy.concatenate([c.k_cache[e, r] for e, r in gathered]) if c.batch else c.k_cache[:0, 0]
    v = numpy.concatenate([c.v_cache[e, r] for e, r in gathered]) if c.batch else c.v_cache[:0, 0]
    cu_k = numpy.concatenate([[0], numpy.cumsum(keys)]).astype(numpy.int32)
    cu_q = (numpy.arange(c.batch + 1) * c.seqlen_q).astype(numpy.int32)
    packed_q = q.reshape(c.batch * c.seqlen_q, c.heads, c.headdim)
    # The packed batch is built from checked values: no second check.
    p = _problem.Problem(xp=numpy, dtype=c.dtype, batch=c.batch, seqlen_q=c.seqlen_q, seqlen_k=int(keys.max(initial=0)),
                         heads=c.heads, heads_k=c.heads_k, headdim=c.headdim, headdim_v=c.headdim_v,
                         softmax_scale=c.softmax_scale, window_left=c.window_left, window_right=c.window_right,
                         softcap=c.softcap, alibi_slopes=_per_entry_slopes(c), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                         total_q=packed_q.shape[0], total_k=k.shape[0], precision=c.precision,
                         user_score=c.user_score, user_buffers=c.user_buffers, **(c.fp8 or {}))
    out, lse, *top = _compute.forward(p, packed_q, k, v, max_score=max_score)
    lse = lse.reshape(c.heads, c.batch, c.seqlen_q).transpose(1, 0, 2)
    return (out.reshape(c.out_shape), numpy.ascontiguousarray(lse), *top)


def _per_entry_slopes(c):
    """ALiBi slopes as (batch, heads), the packed problem's layout."""
    if c.alibi_slopes is None or c.alibi_slopes.ndim == 2:
        return c.alibi_slopes
    return numpy.ascontiguousarray(numpy.broadcast_to(c.alibi_slopes, (c.batch, c.heads)))
