"""Merging attention computed over disjoint key sets (split-KV parts, cascaded prefixes, ring steps).

Part i of a row holds ``out_i = sum_j p_ij v_j / l_i`` and ``lse_i = ln(l_i)`` over its own keys. Over
the union of the parts' keys

    lse = ln(sum_i exp(lse_i)),    out = sum_i exp(lse_i - lse) out_i.

The exponentials are shifted by the row's largest ``lse_i`` so none overflows. A part whose row saw
no key (``lse_i = -inf``) gets weight 0; when every part's row saw none, the merged row is
``out = 0, lse = -inf``, as :func:`cupyflash.flash_attention` gives such a row. A NaN ``lse_i`` makes
the merged row NaN. The arithmetic runs in the dtype of the saved log-sum-exp of ``out``'s dtype
(float32 for 16-bit outputs, float64 otherwise); up to 16 parts (MERGE_PARTS) are merged at once, more
in rounds whose results are rounded to ``out``'s dtype. On CuPy arrays :func:`merge` is one fused kernel
per round on the current stream (kernels_cu/common/merge.cu, with no host synchronization) and this
module's arithmetic is its NumPy twin.
"""

import numpy

from . import _problem
from ._params import MERGE_PARTS


def _to_rows(lse, packed):
    """An lse-shaped array, (batch, heads, seqlen_q) or packed (heads, total_q), broadcast against the
    rows of out: (batch, seqlen_q, heads, 1) or (total_q, heads, 1)."""
    return (lse.T if packed else lse.transpose(0, 2, 1))[..., None]


def merge(xp, outs, lses, packed):
    """(out, lse) of the parts ``outs[i]``, ``lses[i]`` (at least one, validated; ``xp`` their module).
    At most MERGE_PARTS parts are merged at once, as the kernel takes them: more are merged in rounds,
    each round's result (out rounded to the parts' dtype) the first part of the next."""
    if xp is not numpy:
        from ._families import common

        return common.merge(outs, lses, packed)
    out, lse = _merge_round(xp, outs[:MERGE_PARTS], lses[:MERGE_PARTS], packed)
    for first in range(MERGE_PARTS, len(outs), MERGE_PARTS - 1):
        out, lse = _merge_round(xp, [out, *outs[first:first + MERGE_PARTS - 1]],
                                [lse, *lses[first:first + MERGE_PARTS - 1]], packed)
    return out, lse


def _merge_round(xp, outs, lses, packed):
    """One round of :func:`merge`: at most MERGE_PARTS parts."""
    out_dtype = outs[0].dtype
    acc = _problem.lse_dtype(out_dtype)
    lses = [lse.astype(acc, copy=False) for lse in lses]
    top = lses[0]
    for lse in lses[1:]:
        top = xp.maximum(top, lse)  # NaN wins
    shift = xp.where(xp.isneginf(top), acc.type(0), top)
    weights = [xp.exp(lse - shift) for lse in lses]  # -inf parts: 0
    total = weights[0]
    for w in weights[1:]:
        total = total + w
    # total == 0: no part saw a key. ``total != 0`` lets a NaN through to a NaN row, as the kernels do.
    seen = total != 0
    safe = xp.where(seen, total, acc.type(1))
    lse = xp.where(seen, shift + xp.log(safe), acc.type(-numpy.inf))
    scale = xp.where(seen, 1 / safe, acc.type(0))
    out = None
    for w, part in zip(weights, outs):
        term = _to_rows(w * scale, packed) * part.astype(acc, copy=False)
        out = term if out is None else out + term
    return out.astype(out_dtype), lse


def _sink_rows(sinks, acc, packed):
    """Sinks (heads,) broadcast against an lse: (1, heads, 1), or (heads, 1) for packed batches."""
    sinks = sinks.astype(acc, copy=False)
    return sinks[:, None] if packed else sinks[None, :, None]


def add_sinks(xp, out, lse, sinks, packed, acc=None):
    """(out, lse) of attention whose softmax denominators also hold ``exp(sinks[h])``, from the
    attention ``out``, ``lse`` without them: the merge above with a part that saw one key of score
    ``sinks[h]`` and value 0. So ``lse' = ln(exp(lse) + exp(sink))`` and ``out' = exp(lse - lse') out``; a
    row that saw no key keeps out 0 and gets lse' = sink, and a sink of -inf changes nothing. ``acc`` is
    the lse's dtype (by default that of ``out``'s dtype; a ring passes its inputs', its out being wider)."""
    acc = _problem.lse_dtype(out.dtype) if acc is None else acc
    lse = lse.astype(acc, copy=False)
    sink = _sink_rows(sinks, acc, packed)
    top = xp.maximum(lse, sink)  # NaN wins
    shift = xp.where(xp.isneginf(top), acc.type(0), top)
    own, other = xp.exp(lse - shift), xp.exp(sink - shift)
    total = own + other
    seen = total != 0
    safe = xp.where(seen, total, acc.type(1))
    merged = xp.where(seen, shift + xp.log(safe), acc.type(-numpy.inf))
    scale = xp.where(seen, own / safe, acc.type(0))
    return (_to_rows(scale, packed) * out.astype(acc, copy=False)).astype(out.dtype), merged


def sink_gradient(xp, dout, out, lse, sinks, packed):
    """d loss / d sinks: ``-sum_{b,i} exp(sinks[h] - lse_bhi) * sum_d(dout * out)_bhi`` per head, float32
    (heads,). The sink's probability in row i is exp(sink - lse_i), and the gradient of a softmax
    logit is its probability times (its value's dP, here 0, minus delta_i = sum_d dout * out)."""
    acc = _problem.lse_dtype(out.dtype)
    delta = (dout.astype(acc, copy=False) * out.astype(acc, copy=False)).sum(axis=-1)  # (.., seqlen_q, heads)
    delta = delta.T if packed else delta.transpose(0, 2, 1)  # the layout of lse
    lse = lse.astype(acc, copy=False)
    # lse is -inf only in a row that saw no key beside a sink of -inf: its sink has probability 0.
    unseen = xp.isneginf(lse)
    weight = xp.where(unseen, acc.type(0), xp.exp(_sink_rows(sinks, acc, packed) - xp.where(unseen, acc.type(0), lse)))
    return sink_gradient_from_terms(weight * delta, packed)


def sink_gradient_from_terms(terms, packed):
    """d loss / d sinks from the per-row terms exp(sinks[h] - lse) * delta (lse's layout: (batch, heads,
    seqlen_q), or (heads, total_q) packed): minus their sum per head, in a fixed order, float32 (heads,)."""
    total = terms.sum(axis=-1) if packed else terms.sum(axis=(0, 2))
    return (-total).astype(numpy.float32)
