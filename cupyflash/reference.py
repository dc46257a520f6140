"""Naive attention: the float64 oracle and the plain same-precision baseline.

This module materializes the full score matrix and applies the textbook
softmax-attention formulas.  It is written once against an array module
``xp`` (NumPy or CuPy, whichever owns the query array) and is meant for
testing, never for speed.

Two modes share the same code:

* ``compute_dtype=None`` is the oracle: every input is upcast to float64 and
  every stage is computed and returned in float64.  ``np.longdouble`` is also
  accepted (NumPy only) to judge float64 implementations.
* ``compute_dtype=<dtype>`` is the "plain same-precision implementation" the
  tests' tolerance rule compares against: matrix products accumulate in
  float32 (in float64 / longdouble for those dtypes), but the result of every
  stage (scores, probabilities, output, dP, dS, gradients) is rounded through
  ``compute_dtype``, as a straightforward implementation storing its
  intermediates in that dtype would do.

Layout conventions (shared with the rest of the package): ``q`` is
``(batch, seqlen_q, heads, headdim)``, ``k`` is
``(batch, seqlen_k, heads_k, headdim)``, ``v`` is
``(batch, seqlen_k, heads_k, headdim_v)``; query head ``h`` reads key/value
head ``h // (heads // heads_k)``.

Features (FlashAttention-2's definitions), with ``i`` the query row, ``j``
the key column, both counted from 0 within one sequence, and
``offset = seqlen_k - seqlen_q`` (masks and ALiBi are bottom-right aligned):

* scores ``s = softmax_scale * q . k``;
* ``softcap > 0`` (Gemma 2): ``s = softcap * tanh(s / softcap)``;
* ALiBi: ``s = s - slope[b, h] * |i + offset - j|``, one slope per query
  head (and optionally per batch entry);
* ``window_size = (left, right)``, -1 meaning unbounded on that side: query
  ``i`` sees key ``j`` iff ``i + offset - left <= j <= i + offset + right``;
  ``causal`` sets ``right = 0`` (plain causal is the window ``(-1, 0)``);
* ``block_mask`` (:class:`cupyflash.BlockMask`): ``(i, j)`` is allowed iff
  ``layout[b, h, i // block_q, j // block_k]`` (a leading axis of size 1
  broadcasts), ANDed with the window;
* ``sinks`` (one logit per query head, gpt-oss): ``exp(sinks[h])`` joins
  every row's softmax denominator as a key of value 0, so
  ``lse = ln(exp(sinks[h]) + sum_j exp(s_ij))`` and a row that sees no key
  gets ``lse = sinks[h]``;
* dropout: with ``keep`` a given boolean mask (see
  :func:`cupyflash.dropout_mask`), each probability becomes
  ``p_ij * keep_ij / (1 - dropout_rate(dropout_p))`` before the product
  with ``v`` (:func:`cupyflash.dropout_rate`: the rate the 8-bit decisions
  draw); lse is the softmax's before dropout;
* the maximum score of a head is the largest modified score over its rows
  and the keys they see (``-inf`` when it sees none); sinks are not scores;
* masked scores are ``-inf``; a row that sees no key gets ``out = 0``,
  ``lse = -inf`` and zero gradients, while NaN inputs propagate to the
  ``out`` and ``lse`` of every row whose scores they reach;
* :func:`attention_varlen` and :func:`attention_varlen_backward` take
  FlashAttention-2's packed variable-length layout and treat each sequence
  as an independent problem;
* :func:`merge_attention_states` merges attention over disjoint key sets;
  :func:`attention_with_kvcache` attends to a dense or paged KV cache with
  new tokens appended (FlashAttention-2's ``flash_attn_with_kvcache``), with
  :func:`apply_rotary` for the rotary embedding.

Every mask is computed here straight from these definitions, independently
of the kernels and of their shared mask policy.
"""

import functools
import math
import operator

import numpy as np

from . import _dropout, _fp8, _trace

#: Dtypes whose matrix products accumulate in float32 in the plain baseline.
_FLOAT32_ACCUMULATED = ("float16", "bfloat16", "float32")


@functools.lru_cache(maxsize=None)
def _cupy_or_none():
    """Return the ``cupy`` module, or ``None`` when it cannot be imported."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _array_module(x):
    """Return the array module (NumPy or CuPy) that owns ``x``."""
    cupy = _cupy_or_none()
    if cupy is None:
        return np
    return cupy.get_array_module(x)


def _precisions(compute_dtype):
    """Return ``(store, acc)``: the rounding dtype and the accumulation dtype.

    Parameters
    ----------
    compute_dtype : dtype-like or None
        ``None`` selects the float64 oracle.

    Returns
    -------
    store : numpy.dtype
        Every stage's result is rounded through this dtype.
    acc : numpy.dtype
        Dtype in which matrix products, reductions and the softmax run.
    """
    if compute_dtype is None:
        return np.dtype(np.float64), np.dtype(np.float64)
    store = np.dtype(compute_dtype)
    if store.name in _FLOAT32_ACCUMULATED:
        return store, np.dtype(np.float32)
    return store, store


def _rounder(store, acc):
    """Return a function rounding an ``acc`` array through ``store``.

    The round trip ``x.astype(store).astype(acc)`` leaves the value
    representable in ``store`` while keeping ``acc`` for the next stage.  It
    is the identity (and skipped) when both dtypes coincide.
    """
    if store == acc:
        return lambda x: x
    return lambda x: x.astype(store).astype(acc)


def _group_size(heads, heads_k):
    """Return the number of query heads sharing one key/value head.

    ``max(heads_k, 1)`` only matters for the empty ``heads == heads_k == 0``
    case, where any group size reshapes the empty arrays correctly.
    """
    return heads // max(heads_k, 1)


def _split_heads(x, heads_k):
    """Reshape ``(batch, seqlen, heads, dim)`` to ``(batch, heads_k, group, seqlen, dim)``."""
    batch, seqlen, heads, dim = x.shape
    group = _group_size(heads, heads_k)
    return x.transpose(0, 2, 1, 3).reshape(batch, heads_k, group, seqlen, dim)


def _merge_heads(x):
    """Inverse of :func:`_split_heads`: back to ``(batch, seqlen, heads, dim)``."""
    batch, heads_k, group, seqlen, dim = x.shape
    return x.reshape(batch, heads_k * group, seqlen, dim).transpose(0, 2, 1, 3)


def _kv_heads(x):
    """Reshape ``(batch, seqlen_k, heads_k, dim)`` to ``(batch, heads_k, 1, seqlen_k, dim)``.

    The singleton axis broadcasts one key/value head over its query group.
    """
    return x.transpose(0, 2, 1, 3)[:, :, None]


def _on_module(xp, x):
    """Return the NumPy or CuPy array ``x`` as an ``xp`` array (copied to the host if needed)."""
    cupy = _cupy_or_none()
    if xp is np and cupy is not None and isinstance(x, cupy.ndarray):
        return x.get()
    return xp.asarray(x)


def _window_bounds(window_size, causal):
    """Return the window's ``(left, right)`` extents, ``None`` for an unbounded side.

    Parameters
    ----------
    window_size : (int, int)
        ``(left, right)``; -1 means unbounded on that side.
    causal : bool
        Caps ``right`` at 0, whatever it was; ``left`` is unchanged.
    """
    if len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    left, right = (operator.index(w) for w in window_size)
    if min(left, right) < -1:
        raise ValueError(f"window_size entries must be -1 (unbounded) or at least 0, got {window_size!r}")
    if causal:
        right = 0
    return (None if left == -1 else left), (None if right == -1 else right)


def _window_mask(xp, seqlen_q, seqlen_k, left, right):
    """Return the bottom-right aligned window mask, or ``None`` when it allows everything.

    Query ``i`` sees key ``j`` iff ``d - left <= j <= d + right`` where
    ``d = i + seqlen_k - seqlen_q`` is the key on its diagonal; a ``None``
    extent leaves that side open.

    Returns
    -------
    mask : bool array, shape (seqlen_q, seqlen_k), or None
    """
    diagonal = xp.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    cols = xp.arange(seqlen_k)[None, :]
    mask = None
    if left is not None:
        mask = cols >= diagonal - left
    if right is not None:
        upper = cols <= diagonal + right
        mask = upper if mask is None else mask & upper
    return mask


def _block_cells(xp, block_mask, batch, heads_k, group, seqlen_q, seqlen_k):
    """Return a block mask's element mask in split-head layout.

    Pair ``(i, j)`` of batch entry ``b`` and query head ``h`` is allowed iff
    ``layout[b, h, i // block_q, j // block_k]``, a leading layout axis of
    size 1 applying to every batch entry or head.

    Parameters
    ----------
    xp : module
    block_mask : cupyflash.BlockMask
        Only its ``layout`` and ``block_size`` are used.
    batch, heads_k, group, seqlen_q, seqlen_k : int

    Returns
    -------
    cells : bool array, shape (batch or 1, heads_k or 1, group or 1, seqlen_q, seqlen_k)

    Raises
    ------
    ValueError
        When the layout does not fit the problem: its block grid is not
        ``(ceil(seqlen_q / block_q), ceil(seqlen_k / block_k))`` or a leading
        axis is neither 1 nor ``batch`` / ``heads``.
    """
    layout = _on_module(xp, block_mask.layout)
    block_q, block_k = block_mask.block_size
    heads = heads_k * group
    grid = (-(-seqlen_q // block_q), -(-seqlen_k // block_k))
    if layout.ndim != 4 or tuple(layout.shape[-2:]) != grid:
        raise ValueError(
            f"block_mask layout of shape {tuple(layout.shape)} does not fit seqlen_q={seqlen_q}, "
            f"seqlen_k={seqlen_k} with block_size {(block_q, block_k)}: expected (..., {grid[0]}, {grid[1]})"
        )
    if layout.shape[0] not in (1, batch) or layout.shape[1] not in (1, heads):
        raise ValueError(
            f"block_mask layout of shape {tuple(layout.shape)} does not fit batch={batch}, heads={heads}: "
            "its leading axes must be 1 or those sizes"
        )
    rows = xp.arange(seqlen_q) // block_q
    cols = xp.arange(seqlen_k) // block_k
    cells = layout[:, :, rows[:, None], cols[None, :]]
    if layout.shape[1] == 1:
        return cells[:, :, None]
    return cells.reshape(layout.shape[0], heads_k, group, seqlen_q, seqlen_k)


def _alibi_slopes(xp, alibi_slopes, batch, heads_k, group, acc):
    """Return ALiBi slopes in ``acc``, shaped (batch or 1, heads_k, group, 1, 1) to broadcast over scores.

    ``alibi_slopes`` has shape ``(heads,)`` (shared by the batch) or
    ``(batch, heads)``; query head ``h`` uses its own slope.
    """
    slopes = _on_module(xp, alibi_slopes).astype(acc)
    heads = heads_k * group
    if slopes.shape == (heads,):
        slopes = slopes[None]
    elif slopes.shape != (batch, heads):
        raise ValueError(
            f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}), got {tuple(slopes.shape)}"
        )
    return slopes.reshape(slopes.shape[0], heads_k, group, 1, 1)


def _softcap(softcap):
    """Return ``softcap`` as a float, checking that it is 0 (none) or positive."""
    softcap = float(softcap)
    if not softcap >= 0:
        raise ValueError(f"softcap must be 0 (none) or positive, got {softcap}")
    return softcap


def _user_score(xp, score_mod, score_mod_buffers, softcap, alibi_slopes):
    """Return ``(traced score_mod, buffers on xp)``, or None without a score_mod."""
    if score_mod is None:
        return None
    if softcap or alibi_slopes is not None:
        raise ValueError("score_mod cannot be combined with softcap or alibi_slopes")
    buffers = tuple(_on_module(xp, b) for b in (score_mod_buffers or ()))
    return _trace.trace(score_mod, "score", [(b.dtype, b.ndim) for b in buffers]), buffers


def _user_env(xp, s, heads_k, group):
    """The leaves of a score_mod over split-head scores ``s`` (batch, heads_k, group, seqlen_q, seqlen_k)."""
    batch, seqlen_q, seqlen_k = s.shape[0], s.shape[-2], s.shape[-1]
    h = xp.arange(heads_k, dtype=np.int32)[:, None] * group + xp.arange(group, dtype=np.int32)[None, :]
    return {"score": s, "b": xp.arange(batch, dtype=np.int32).reshape(batch, 1, 1, 1, 1),
            "h": h.reshape(1, heads_k, group, 1, 1), "q_idx": xp.arange(seqlen_q, dtype=np.int32)[:, None],
            "kv_idx": xp.arange(seqlen_k, dtype=np.int32)[None, :]}


def _buffer_gradients(xp, user, scaled, ds_mod, acc):
    """d(loss)/d(buffer) of a score_mod: ``ds_mod`` (the gradient of the modified scores) times the
    derivative of the score_mod with respect to each load, added at the load's index, where ``ds_mod``
    is not 0 and the load is in range; None for int and bool buffers."""
    traced, buffers = user
    _, loads = traced.gradients()
    env = _user_env(xp, scaled, scaled.shape[1], scaled.shape[2])
    grads = [xp.zeros(b.shape, acc) if b.dtype.kind == "f" else None for b in buffers]
    for load, g in loads:
        results = _trace.evaluate([g] + list(load.args), env, buffers, acc, xp)
        (value, ok), index = results[0], [r[0] for r in results[1:]]
        buf = buffers[load.value[0]]
        take = ds_mod != 0
        if ok is not None:
            take = take & ok
        for x, size in zip(index, buf.shape):
            take = take & (x >= 0) & (x < size)
        picked = xp.broadcast_to(take, ds_mod.shape)
        where = tuple(xp.broadcast_to(x, ds_mod.shape)[picked] for x in index)
        amount = (ds_mod * value)[picked]
        if xp is np:
            np.add.at(grads[load.value[0]], where, amount)
        else:
            xp.add.at(grads[load.value[0]], where, amount)
    return tuple(None if g is None else g.astype(b.dtype) for g, b in zip(grads, buffers))


def _scores(xp, q, k, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask, store, acc, user=None):
    """Return the modified, masked scores, their derivative with respect to the scaled scores and the
    scaled scores.

    In order: ``s = softmax_scale * q . k``; with a softcap,
    ``s = softcap * tanh(s / softcap)``; with ALiBi,
    ``s = s - slope * |i + seqlen_k - seqlen_q - j|``; finally ``-inf`` where
    the window (with causal) or the block mask hides the key.  Each stage is
    rounded through ``store``.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    q : array, shape (batch, heads_k, group, seqlen_q, headdim)
    k : array, shape (batch, heads_k, 1, seqlen_k, headdim)
    causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask
        As in :func:`attention` (``softmax_scale`` already defaulted).
    store, acc : numpy.dtype
        See :func:`_precisions`.
    user : tuple, optional
        ``(traced score_mod, buffers)`` from :func:`_user_score`: replaces the
        softcap and ALiBi (an index out of range makes the score NaN).

    Returns
    -------
    s : array, shape (batch, heads_k, group, seqlen_q, seqlen_k)
        Scores in ``acc``; masked entries are ``-inf``.
    grad : array of the shape of ``s``, or None
        d(modified score)/d(scaled score): ``1 - tanh^2(s0 / softcap)`` with a
        softcap, the score_mod's derivative with one, else None.
    s0 : array of the shape of ``s``
        The scaled scores ``softmax_scale * q . k``.
    """
    rnd = _rounder(store, acc)
    batch, heads_k, group, seqlen_q, _ = q.shape
    seqlen_k = k.shape[-2]
    softcap = _softcap(softcap)
    # Arguments are checked before the arithmetic starts.
    mask = _window_mask(xp, seqlen_q, seqlen_k, *_window_bounds(window_size, causal))
    poisoned = None
    if block_mask is not None:
        cells = _block_cells(xp, block_mask, batch, heads_k, group, seqlen_q, seqlen_k)
        if block_mask.mask_mod is not None:
            # The mask is its function, on every pair (the layout only says which blocks the kernels visit).
            traced, buffers = block_mask.mask_mod[:2]
            env = _user_env(xp, xp.zeros((batch, heads_k, group, seqlen_q, seqlen_k), acc), heads_k, group)
            del env["score"]
            # Built for a batch or heads of 1: entry b = 0 (head h = 0) serves every one.
            layout_batch, layout_heads = block_mask.layout.shape[:2]
            if layout_batch == 1:
                env["b"] = xp.zeros_like(env["b"])
            if layout_heads == 1:
                env["h"] = xp.zeros_like(env["h"])
            # Its floats are float32, as from_mask_mod classified its blocks with.
            (cells, ok), = _trace.evaluate([traced.root], env, tuple(_on_module(xp, b) for b in buffers), np.float32,
                                           xp)
            if ok is not None:
                poisoned, cells = ~ok, cells | ~ok
        mask = cells if mask is None else mask & cells
    slopes = None if alibi_slopes is None else _alibi_slopes(xp, alibi_slopes, batch, heads_k, group, acc)

    s = rnd(xp.matmul(q, k.swapaxes(-1, -2)) * acc.type(softmax_scale))
    scaled = s
    grad = None
    if user is not None:
        traced, buffers = user
        env = _user_env(xp, s, heads_k, group)
        (value, ok), (grad, _) = _trace.evaluate([traced.root, traced.gradients()[0]], env, buffers, acc, xp)
        if ok is not None:
            value = xp.where(ok, value, acc.type(np.nan))
        s = rnd(xp.broadcast_to(value, s.shape))
        grad = xp.broadcast_to(grad, s.shape)
    if softcap > 0:
        cap = acc.type(softcap)
        t = xp.tanh(s / cap)
        s = rnd(cap * t)
        grad = acc.type(1) - t * t
    if slopes is not None:
        rows = xp.arange(seqlen_q)[:, None]
        cols = xp.arange(seqlen_k)[None, :]
        distance = xp.abs(rows + (seqlen_k - seqlen_q) - cols).astype(acc)
        s = rnd(s - slopes * distance)
    if poisoned is not None:
        s = xp.where(poisoned, acc.type(np.nan), s)  # a mask_mod's index out of range
    if mask is not None:
        s = xp.where(mask, s, acc.type(-np.inf))
    return s, grad, scaled


def _sinks(xp, sinks, heads_k, group, acc):
    """Return ``sinks`` (heads,) as ``(1, heads_k, group, 1)`` in ``acc``, or None."""
    if sinks is None:
        return None
    sinks = _on_module(xp, sinks)
    if sinks.shape != (heads_k * group,):
        raise ValueError(f"sinks must have shape ({heads_k * group},), got {tuple(sinks.shape)}")
    return sinks.astype(acc).reshape(1, heads_k, group, 1)


def _dropout_factor(xp, dropout_p, dropout_mask, shape, acc):
    """Return ``keep / (1 - dropout_rate(dropout_p))`` in the split-head layout ``shape``, or None without
    dropout.

    ``dropout_mask`` is the boolean keep mask, (batch, heads, seqlen_q, seqlen_k).
    """
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    scale = _dropout.keep_scale(dropout_p)  # raises where no 8-bit decision draws dropout_p
    if dropout_p == 0.0:
        return None
    if dropout_mask is None:
        raise ValueError("dropout_p > 0 needs dropout_mask (the keep mask: cupyflash.dropout_mask)")
    batch, heads_k, group, seqlen_q, seqlen_k = shape
    keep = _on_module(xp, dropout_mask)
    if keep.shape != (batch, heads_k * group, seqlen_q, seqlen_k):
        raise ValueError(f"dropout_mask must have shape {(batch, heads_k * group, seqlen_q, seqlen_k)}, "
                         f"got {tuple(keep.shape)}")
    keep = keep.reshape(shape)
    return xp.where(keep, acc.type(scale), acc.type(0))


def _max_score(xp, s):
    """Return the largest score of each head, (batch, heads) float32; ``-inf`` where every score is."""
    batch, heads_k, group = s.shape[:3]
    if s.shape[-1] == 0 or s.shape[-2] == 0:
        top = xp.full((batch, heads_k, group), -np.inf, dtype=s.dtype)
    else:
        top = s.max(axis=(-2, -1))
    return top.reshape(batch, heads_k * group).astype(np.float32)


def _probabilities(xp, s, store, acc, sink=None):
    """Return the softmax probabilities, row maxima and row sums of masked scores.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    s : array, shape (batch, heads_k, group, seqlen_q, seqlen_k)
        Scores from :func:`_scores`, in ``acc``.
    store, acc : numpy.dtype
        See :func:`_precisions`.
    sink : array, shape (1, heads_k, group, 1), or None
        Sinks from :func:`_sinks`: one more term of every row's sum, as a
        score of its own.

    Returns
    -------
    p : array, shape of ``s``
        Probabilities, rounded through ``store``; rows seeing no key are 0.
    m : array, shape (batch, heads_k, group, seqlen_q)
        Row maxima of the scores and the sink (``-inf`` for rows seeing no
        key and no sink).
    total : array, shape (batch, heads_k, group, seqlen_q)
        Row sums of ``exp(scores - m)`` (and ``exp(sink - m)``): 0 exactly
        for rows seeing no key and no sink, NaN for rows reached by a NaN
        input.
    """
    rnd = _rounder(store, acc)
    if s.shape[-1] == 0:
        # A maximum over an empty axis is undefined; no key means m = -inf.
        m = xp.full(s.shape[:-1], -np.inf, dtype=acc)
    else:
        m = s.max(axis=-1)
    if sink is not None:
        m = xp.maximum(m, sink)
    # A row that sees no key has m = -inf; subtracting 0 instead keeps
    # exp(-inf - 0) = 0 where -inf - (-inf) would be NaN.
    m_base = xp.where(m == -np.inf, acc.type(0), m)
    e = xp.exp(s - m_base[..., None])
    total = e.sum(axis=-1)
    if sink is not None:
        total = total + xp.exp(sink - m_base)
    # Dividing by 1 where the sum is 0 avoids 0/0; those rows are all zeros anyway.
    # The test is ``total != 0``, not ``total > 0``, so that a NaN sum stays NaN.
    p = rnd(e / xp.where(total != 0, total, acc.type(1))[..., None])
    return p, m, total


def _prepare(q, k, v, compute_dtype):
    """Return ``xp``, the precisions and the inputs in split-head ``acc`` layout."""
    xp = _array_module(q)
    store, acc = _precisions(compute_dtype)
    # Inputs are first made representable in ``store`` (a no-op when they
    # already are), then upcast for the arithmetic.
    q, k, v = (x.astype(store).astype(acc) for x in (q, k, v))
    heads_k = k.shape[2]
    return xp, store, acc, _split_heads(q, heads_k), _kv_heads(k), _kv_heads(v)


def _fp8_inputs(q, k, v, q_descale, k_descale, v_descale, compute_dtype):
    """FP8 (float8_e4m3fn) inputs dequantized, stored value x descale (None: 1), and the compute_dtype to
    run them with: the oracle's float64 (exact products), or for ``compute_dtype=float8_e4m3fn`` the FP8
    emulation's float32 (each product rounded once)."""
    if compute_dtype is not None and np.dtype(compute_dtype) != _fp8.E4M3:
        raise ValueError(f"FP8 inputs take compute_dtype None (the oracle) or float8_e4m3fn (the emulation), "
                         f"got {np.dtype(compute_dtype)}")
    xp = _array_module(q)
    wide = np.float64 if compute_dtype is None else np.float32
    heads_k = k.shape[2]

    def dequantize(x, descale):
        values = _fp8.e4m3_values(xp, x).astype(wide)
        if descale is None:
            return values
        descale = _on_module(xp, descale).astype(wide)
        per_head = descale if descale.shape[1] == x.shape[2] else xp.repeat(descale, x.shape[2] // heads_k, axis=1)
        return values * per_head.reshape(x.shape[0], 1, x.shape[2], 1)

    q, k, v = dequantize(q, q_descale), dequantize(k, k_descale), dequantize(v, v_descale)
    return q, k, v, None if compute_dtype is None else np.dtype(np.float32)


def _default_scale(softmax_scale, headdim):
    """Return ``softmax_scale``, defaulting to ``1 / sqrt(headdim)``."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    return float(softmax_scale)


def attention(q, k, v, causal=False, softmax_scale=None, *, window_size=(-1, -1), softcap=0.0,
              alibi_slopes=None, block_mask=None, sinks=None, dropout_p=0.0, dropout_mask=None,
              return_max_score=False, score_mod=None, score_mod_buffers=None, q_descale=None, k_descale=None,
              v_descale=None, compute_dtype=None):
    """Naive softmax attention forward pass.

    Parameters
    ----------
    q : array, shape (batch, seqlen_q, heads, headdim)
    k : array, shape (batch, seqlen_k, heads_k, headdim)
    v : array, shape (batch, seqlen_k, heads_k, headdim_v)
        NumPy or CuPy arrays (all from the same module); ``heads`` must be a
        multiple of ``heads_k``.
    causal : bool, optional
        Bottom-right aligned causal mask: query ``i`` sees key ``j`` iff
        ``j <= i + seqlen_k - seqlen_q``.  Caps the window's ``right`` at 0.
    softmax_scale : float, optional
        Multiplier of ``q @ k^T``; defaults to ``1 / sqrt(headdim)``.
    window_size : (int, int), optional
        ``(left, right)`` local attention, -1 meaning unbounded on that side:
        query ``i`` sees key ``j`` iff
        ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right``.
    softcap : float, optional
        When positive, scores become ``softcap * tanh(s / softcap)`` (after
        the scale); 0 means none.
    alibi_slopes : array, shape (heads,) or (batch, heads), optional
        NumPy or CuPy (float32 in practice); adds
        ``-slope[b, h] * |i + seqlen_k - seqlen_q - j|`` to the score after
        the softcap.
    block_mask : cupyflash.BlockMask, optional
        Allows ``(i, j)`` iff ``layout[b, h, i // block_q, j // block_k]``
        (leading axes of size 1 broadcast), ANDed with the window.
    sinks : array, shape (heads,), optional
        One logit per query head in every row's softmax denominator.
    dropout_p : float, optional
        Dropout probability in [0, 1); kept probabilities are scaled by
        ``1 / (1 - dropout_rate(dropout_p))``.
    dropout_mask : bool array, shape (batch, heads, seqlen_q, seqlen_k), optional
        With ``dropout_p > 0``, True where a probability is kept
        (:func:`cupyflash.dropout_mask` gives the kernels' decisions); required then.
    return_max_score : bool, optional
        Also return each head's largest score, float32 (batch, heads).
    score_mod : callable, optional
        ``score_mod(score, b, h, q_idx, kv_idx, *buffers)`` (see
        :func:`cupyflash.flash_attention`), evaluated elementwise in the
        accumulation precision; not with a softcap or ALiBi.
    score_mod_buffers : sequence of arrays, optional
        The arrays it indexes.
    q_descale, k_descale, v_descale : float32 arrays, optional
        For q, k and v of dtype ``ml_dtypes.float8_e4m3fn``: real value =
        stored value x descale, shape (batch, heads_k) (q's also (batch,
        heads)); None means 1.
    compute_dtype : dtype-like, optional
        ``None`` (default) computes the float64 oracle.  A floating dtype
        (float16, ``ml_dtypes.bfloat16``, float32, float64, or
        ``np.longdouble`` with NumPy) computes the plain same-precision
        baseline described in the module docstring.  FP8 inputs take
        ``ml_dtypes.float8_e4m3fn``: the FP8 baseline, which computes the
        scores in float32 from the dequantized inputs, rounds the
        probabilities (after the row-max subtraction, before the sum divides
        them, scaled by 2^8 as the FP8 kernel scales them) to e4m3 for the
        product with v, and accumulates in float32.

    Returns
    -------
    out : array, shape (batch, seqlen_q, heads, headdim_v)
        In float64 for the oracle, else in ``compute_dtype`` (float32 for
        the FP8 baseline).  Rows seeing no key are 0.
    lse : array, shape (batch, heads, seqlen_q)
        Natural-log log-sum-exp of each row's modified, masked scores (and
        sink); ``-inf`` for rows seeing no key and no sink, NaN for rows
        reached by a NaN input.  float64 for the oracle, float32 for 16- and
        32-bit ``compute_dtype``, else ``compute_dtype``.
    max_score : array, float32, shape (batch, heads)
        Only with ``return_max_score``.

    Raises
    ------
    TypeError
        For a ``window_size`` that is not a pair of ints.
    ValueError
        For ``window_size`` entries below -1, a negative ``softcap``, or
        ``alibi_slopes`` or ``block_mask`` shapes that do not fit the problem.
    """
    softmax_scale = _default_scale(softmax_scale, q.shape[-1])
    fp8 = q.dtype == _fp8.E4M3
    emulate_fp8 = fp8 and compute_dtype is not None
    if fp8:
        if dropout_p:
            raise ValueError("FP8 inputs take no dropout")
        q, k, v, compute_dtype = _fp8_inputs(q, k, v, q_descale, k_descale, v_descale, compute_dtype)
    xp, store, acc, qh, kh, vh = _prepare(q, k, v, compute_dtype)
    rnd = _rounder(store, acc)
    user = _user_score(xp, score_mod, score_mod_buffers, softcap, alibi_slopes)
    s, _, _ = _scores(xp, qh, kh, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask, store, acc,
                      user)
    sink = _sinks(xp, sinks, qh.shape[1], qh.shape[2], acc)
    p, m, total = _probabilities(xp, s, store, acc, sink)
    factor = _dropout_factor(xp, dropout_p, dropout_mask, s.shape, acc)
    if factor is not None:
        p = rnd(p * factor)
    if emulate_fp8:
        # 2^8 exp(s - m) rounded to e4m3 for the product (the FP8 kernel's scaling: e4m3 then keeps
        # probabilities down to 2^-17 of the row's largest), then divided by 2^8 and the float32 sum.
        m_base = xp.where(m == -np.inf, acc.type(0), m)
        e = _fp8.e4m3_values(xp, _fp8.e4m3_bits(xp, xp.exp(s - m_base[..., None]) * acc.type(_fp8.P_SCALE)))
        out = xp.matmul(e, vh) / (xp.where(total != 0, total, acc.type(1))[..., None] * acc.type(_fp8.P_SCALE))
    else:
        out = rnd(xp.matmul(p, vh))
    # log(0) is avoided by the substitution; the where puts -inf back.  As in
    # _probabilities, ``total != 0`` lets a NaN sum through to a NaN lse.
    seen = total != 0
    lse = xp.where(seen, m + xp.log(xp.where(seen, total, acc.type(1))), acc.type(-np.inf))
    batch, heads_k, group, seqlen_q = lse.shape
    lse = lse.reshape(batch, heads_k * group, seqlen_q)
    if return_max_score:
        return _merge_heads(out).astype(store), lse, _max_score(xp, s)
    return _merge_heads(out).astype(store), lse


def attention_backward(dout, q, k, v, causal=False, softmax_scale=None, *, window_size=(-1, -1), softcap=0.0,
                       alibi_slopes=None, block_mask=None, sinks=None, dropout_p=0.0, dropout_mask=None,
                       score_mod=None, score_mod_buffers=None, compute_dtype=None):
    """Naive softmax attention backward pass.

    Implements, with ``P`` the (modified, masked) softmax probabilities and
    ``O = P v``::

        dV = P^T dO,  dP = dO V^T,  delta = rowsum(dO * O),
        dS = P * (dP - delta) [* (1 - tanh^2(s0 / softcap))],
        dQ = scale * dS K,  dK = scale * dS^T Q,

    the bracketed factor, the derivative of ``softcap * tanh(s0 / softcap)``
    at the scaled scores ``s0``, applying with a softcap.  ALiBi and the
    masks enter only through ``P``.  ``dK`` and ``dV`` are summed over the
    query heads sharing a key/value head.  With dropout (``Z = keep / (1 -
    dropout_rate(dropout_p))``, the rate the 8-bit decisions draw), ``O = (P * Z) V``, so
    ``dV = (P * Z)^T dO`` and ``dP`` becomes ``Z * (dO V^T)``.  With sinks, each row's sink is one more
    softmax entry whose value is 0: its probability ``p_sink = exp(sink -
    lse)`` gets the gradient ``p_sink * (0 - delta)``, summed over the rows
    of its head.

    Parameters
    ----------
    dout : array, shape (batch, seqlen_q, heads, headdim_v)
        Gradient of the loss with respect to ``out``.
    q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask, sinks, dropout_p, dropout_mask,
    score_mod, score_mod_buffers, compute_dtype
        As in :func:`attention`.

    Returns
    -------
    dq : array, shape of ``q``
    dk : array, shape of ``k``
    dv : array, shape of ``v``
        In float64 for the oracle, else in ``compute_dtype``.  Rows of ``q``
        seeing no key get a zero gradient.
    dsinks : array, shape (heads,)
        Only with ``sinks``, in the accumulation dtype.
    dbuffers : tuple
        Only with ``score_mod_buffers``: each buffer's gradient in its dtype
        (None for int32 and bool buffers), ``dS_mod * d(score_mod)/d(load)``
        added at every load's index, with ``dS_mod = P * (dP - delta)``.
    """
    softmax_scale = _default_scale(softmax_scale, q.shape[-1])
    xp, store, acc, qh, kh, vh = _prepare(q, k, v, compute_dtype)
    rnd = _rounder(store, acc)
    doh = _split_heads(dout.astype(store).astype(acc), k.shape[2])
    user = _user_score(xp, score_mod, score_mod_buffers, softcap, alibi_slopes)
    s, grad, scaled = _scores(xp, qh, kh, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask, store,
                              acc, user)
    sink = _sinks(xp, sinks, qh.shape[1], qh.shape[2], acc)
    p, m, total = _probabilities(xp, s, store, acc, sink)
    factor = _dropout_factor(xp, dropout_p, dropout_mask, s.shape, acc)
    dropped = p if factor is None else rnd(p * factor)
    out = rnd(xp.matmul(dropped, vh))
    scale = acc.type(softmax_scale)
    # Sums over the query group (axis 2) happen in ``acc`` before rounding.
    dv = rnd(xp.matmul(dropped.swapaxes(-1, -2), doh).sum(axis=2))
    dp = rnd(xp.matmul(doh, vh.swapaxes(-1, -2)))
    if factor is not None:
        dp = rnd(dp * factor)
    delta = (doh * out).sum(axis=-1)
    ds = p * (dp - delta[..., None])
    dbuffers = None
    if user is not None and score_mod_buffers is not None:
        dbuffers = _buffer_gradients(xp, user, scaled, ds, acc)
    if grad is not None:
        # Through the score modification: 1 - tanh^2(s0 / softcap) for the softcap.
        ds = ds * grad
    ds = rnd(ds)
    dq = rnd(xp.matmul(ds, kh) * scale)
    dk = rnd(xp.matmul(ds.swapaxes(-1, -2), qh).sum(axis=2) * scale)
    grads = (
        _merge_heads(dq).astype(store),
        dk.transpose(0, 2, 1, 3).astype(store),
        dv.transpose(0, 2, 1, 3).astype(store),
    )
    extra = () if dbuffers is None else (dbuffers,)
    if sink is None:
        return grads + extra
    # The sink's probability: exp(sink - m) / total, 0 where nothing (not even the sink) is seen.
    m_base = xp.where(m == -np.inf, acc.type(0), m)
    p_sink = xp.exp(sink - m_base) / xp.where(total != 0, total, acc.type(1))
    dsinks = -(p_sink * delta).sum(axis=(0, 3))
    return grads + (dsinks.reshape(-1),) + extra


def _sequences(cu_seqlens_q, cu_seqlens_k, total_q, total_k):
    """Return each sequence's query and key row ranges from the cumulative offsets.

    Parameters
    ----------
    cu_seqlens_q, cu_seqlens_k : int array, shape (batch + 1,)
        NumPy or CuPy; sequence ``b`` owns rows ``cu[b]:cu[b + 1]``.
    total_q, total_k : int
        Rows of the packed queries and keys.

    Returns
    -------
    list of ((int, int), (int, int))
        ``((q_begin, q_end), (k_begin, k_end))`` per sequence, on the host.

    Raises
    ------
    ValueError
        When the offsets are not non-decreasing integers within the packed
        rows, or the two arrays describe different batch sizes.
    """
    bounds = []
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, total_q), ("cu_seqlens_k", cu_seqlens_k, total_k)):
        cu = _on_module(np, cu)
        if (
            cu.ndim != 1
            or cu.size == 0
            or cu.dtype.kind not in "iu"
            or (np.diff(cu) < 0).any()
            or cu[0] < 0
            or cu[-1] > total
        ):
            raise ValueError(
                f"{name} must be a non-empty, non-decreasing 1-D integer array within [0, {total}], got {cu!r}"
            )
        bounds.append([int(c) for c in cu])
    cu_q, cu_k = bounds
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k have lengths {len(cu_q)} and {len(cu_k)}; they must match")
    return list(zip(zip(cu_q[:-1], cu_q[1:]), zip(cu_k[:-1], cu_k[1:])))


def _sequence_slopes(alibi_slopes, batch):
    """Return the ALiBi slopes of each sequence: shared ``(heads,)`` slopes, or row ``b`` of ``(batch, heads)``."""
    if alibi_slopes is None or alibi_slopes.ndim == 1:
        return [alibi_slopes] * batch
    if alibi_slopes.shape[0] != batch:
        raise ValueError(f"alibi_slopes of shape {tuple(alibi_slopes.shape)} do not fit {batch} sequences")
    return [alibi_slopes[b] for b in range(batch)]


def _sequence_masks(dropout_p, dropout_masks, batch):
    """Return each sequence's keep mask ``(1, heads, seqlen_q, seqlen_k)``, or Nones without dropout."""
    if float(dropout_p) == 0.0:
        return [None] * batch
    if dropout_masks is None or len(dropout_masks) != batch:
        raise ValueError(f"dropout_p > 0 needs dropout_masks: one keep mask per sequence ({batch})")
    return [mask[None] for mask in dropout_masks]


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, softmax_scale=None, *,
                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0,
                     dropout_masks=None, return_max_score=False, score_mod=None, score_mod_buffers=None,
                     q_descale=None, k_descale=None, v_descale=None, seqused_k=None, block_table=None,
                     compute_dtype=None):
    """Naive variable-length attention forward pass (FlashAttention-2's packed layout).

    Sequence ``b`` is an independent problem: queries
    ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` attend to the keys and values
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``, with its own ``seqlen_q`` and
    ``seqlen_k`` aligning causal, the window and ALiBi.  Each is computed by
    :func:`attention` with a batch of 1.

    Parameters
    ----------
    q : array, shape (total_q, heads, headdim)
    k : array, shape (total_k, heads_k, headdim)
    v : array, shape (total_k, heads_k, headdim_v)
    cu_seqlens_q, cu_seqlens_k : int array, shape (batch + 1,)
        NumPy or CuPy cumulative row offsets of the sequences.
    causal, softmax_scale, window_size, softcap, compute_dtype
        As in :func:`attention`.
    alibi_slopes : array, shape (heads,) or (batch, heads), optional
        Shared slopes, or row ``b`` for sequence ``b``.
    sinks, dropout_p, return_max_score, score_mod, score_mod_buffers
        As in :func:`attention`; the score_mod's ``b`` is the sequence index.
    q_descale, k_descale, v_descale : float32 arrays, shape (batch, heads_k) (q's also (batch, heads)), optional
        FP8 inputs, as in :func:`attention`: row ``b`` for sequence ``b``.
    seqused_k : int array, shape (batch,), optional
        Sequence ``b`` uses only its first ``seqused_k[b]`` keys (masks aligned to that count).
    block_table : int array, shape (batch, max_pages), optional
        Paged ``k`` and ``v`` of shape (num_pages, page_size, heads_k, dim): key ``t`` of sequence ``b``
        is row ``t % page_size`` of page ``block_table[b, t // page_size]`` (its count from
        ``cu_seqlens_k``).
    dropout_masks : sequence of bool arrays, optional
        With ``dropout_p > 0``, sequence ``b``'s keep mask, (heads, seqlen_q_b, seqlen_k_b).

    Returns
    -------
    out : array, shape (total_q, heads, headdim_v)
    lse : array, shape (heads, total_q)
        Dtypes as in :func:`attention`.  Rows of a sequence with no keys get
        ``out = 0`` and ``lse = -inf`` (the sink with sinks); rows outside
        every sequence ``out = 0`` and ``lse = -inf``.
    max_score : array, float32, shape (batch, heads)
        Only with ``return_max_score``.
    """
    xp = _array_module(q)
    if block_table is not None:  # the pages' rows in key order, packed
        table, cu = _on_module(np, block_table), _on_module(np, cu_seqlens_k)
        page_size = k.shape[1]
        for b in range(len(cu) - 1):
            used = table[b, : -(-(cu[b + 1] - cu[b]) // page_size)]
            if ((used < 0) | (used >= k.shape[0])).any():
                raise ValueError(f"block_table row {b} names pages outside the {k.shape[0]} of k and v")
        places = [(table[b, t // page_size], t % page_size) for b in range(len(cu) - 1) for t in range(cu[b + 1] - cu[b])]
        k, v = (xp.stack([x[page, row] for page, row in places]) if places else x[:0, 0] for x in (k, v))
    store, acc = _precisions(np.float32 if q.dtype == _fp8.E4M3 and compute_dtype is not None else compute_dtype)
    sequences = _sequences(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0])
    slopes = _sequence_slopes(alibi_slopes, len(sequences))
    masks = _sequence_masks(dropout_p, dropout_masks, len(sequences))
    out = xp.zeros(q.shape[:2] + v.shape[2:], dtype=store)
    lse = xp.full((q.shape[1], q.shape[0]), -np.inf, dtype=acc)
    top = xp.full((len(sequences), q.shape[1]), -np.inf, dtype=np.float32)
    used = None if seqused_k is None else _on_module(np, seqused_k)
    for b, (((q0, q1), (k0, k1)), sequence_slopes, mask) in enumerate(zip(sequences, slopes, masks)):
        if used is not None:
            if not 0 <= used[b] <= k1 - k0:
                raise ValueError(f"seqused_k[{b}] = {used[b]} must lie in [0, {k1 - k0}] (the sequence's keys)")
            k1 = k0 + int(used[b])
        seq_out, seq_lse, seq_top = attention(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, softmax_scale, window_size=window_size,
            softcap=softcap, alibi_slopes=sequence_slopes, sinks=sinks, dropout_p=dropout_p, dropout_mask=mask,
            return_max_score=True, score_mod=_sequence_score_mod(score_mod, b), score_mod_buffers=score_mod_buffers,
            compute_dtype=compute_dtype, **{name: None if d is None else d[b:b + 1] for name, d in (
                ("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))},
        )
        out[q0:q1] = seq_out[0]
        lse[:, q0:q1] = seq_lse[0]
        top[b] = seq_top[0]
    return (out, lse, top) if return_max_score else (out, lse)


def attention_varlen_backward(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, softmax_scale=None, *,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0,
                              dropout_masks=None, score_mod=None, score_mod_buffers=None, compute_dtype=None):
    """Naive variable-length attention backward pass.

    Each sequence runs :func:`attention_backward` with a batch of 1; see
    :func:`attention_varlen` for the layout.

    Parameters
    ----------
    dout : array, shape (total_q, heads, headdim_v)
        Gradient of the loss with respect to ``out``.
    q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, window_size, softcap, alibi_slopes, sinks,
    dropout_p, dropout_masks, score_mod, score_mod_buffers, compute_dtype
        As in :func:`attention_varlen`.

    Returns
    -------
    dq : array, shape of ``q``
    dk : array, shape of ``k``
    dv : array, shape of ``v``
        Dtypes as in :func:`attention_backward`.  Query rows seeing no key,
        keys of sequences without queries and rows outside every sequence get
        zero gradients.
    dsinks : array, shape (heads,)
        Only with ``sinks``: summed over the sequences.
    dbuffers : tuple
        Only with ``score_mod_buffers``: summed over the sequences.
    """
    xp = _array_module(q)
    store, acc = _precisions(compute_dtype)
    sequences = _sequences(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0])
    slopes = _sequence_slopes(alibi_slopes, len(sequences))
    masks = _sequence_masks(dropout_p, dropout_masks, len(sequences))
    dq, dk, dv = (xp.zeros(x.shape, dtype=store) for x in (q, k, v))
    dsinks = xp.zeros(q.shape[1], dtype=acc)
    buffers = None
    if score_mod_buffers is not None:
        buffers = [xp.zeros(b.shape, acc) if b.dtype.kind == "f" else None for b in score_mod_buffers]
    for b, (((q0, q1), (k0, k1)), sequence_slopes, mask) in enumerate(zip(sequences, slopes, masks)):
        grads = attention_backward(
            dout[None, q0:q1], q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal, softmax_scale,
            window_size=window_size, softcap=softcap, alibi_slopes=sequence_slopes, sinks=sinks, dropout_p=dropout_p,
            dropout_mask=mask, score_mod=_sequence_score_mod(score_mod, b), score_mod_buffers=score_mod_buffers,
            compute_dtype=compute_dtype,
        )
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (g[0] for g in grads[:3])
        if sinks is not None:
            dsinks = dsinks + grads[3]
        if buffers is not None:
            buffers = [None if t is None else t + g for t, g in zip(buffers, grads[-1])]
    result = (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)
    if buffers is not None:
        result += (tuple(None if t is None else t.astype(b.dtype) for t, b in zip(buffers, score_mod_buffers)),)
    return result


def _sequence_score_mod(score_mod, index):
    """``score_mod`` of packed sequence ``index`` run as a batch of 1: its ``b`` is ``index``."""
    if score_mod is None:
        return None
    return lambda score, b, *rest: score_mod(score, b + index, *rest)


def merge_attention_states(outs, lses):
    """Naive merge of attention computed over disjoint key sets, in float64.

    Parameters
    ----------
    outs : sequence of arrays
        Each part's output, all of one shape: ``(batch, seqlen_q, heads, headdim_v)`` (the layout of
        :func:`attention`) or ``(total_q, heads, headdim_v)`` (of :func:`attention_varlen`).
    lses : sequence of arrays
        Each part's log-sum-exp: ``(batch, heads, seqlen_q)`` or ``(heads, total_q)``.

    Returns
    -------
    out : array, float64
        ``sum_i exp(lse_i - lse) * out_i``; 0 in rows where every part's ``lse_i`` is ``-inf``.
    lse : array, float64
        ``log(sum_i exp(lse_i))``, accumulated with ``logaddexp``; ``-inf`` where every part's is,
        NaN where any part's is NaN.
    """
    xp = _array_module(outs[0])
    lses = [lse.astype(np.float64) for lse in lses]
    packed = outs[0].ndim == 3
    out = xp.zeros(outs[0].shape, np.float64)
    # NaN rows and rows where every part is -inf (-inf - -inf) compute NaN on the way, by design.
    with np.errstate(invalid="ignore"):
        lse = lses[0]
        for part in lses[1:]:
            lse = xp.logaddexp(lse, part)
        for part_out, part_lse in zip(outs, lses):
            # A part whose row saw no key weighs 0, also where no part's row saw one.
            weight = xp.where(xp.isneginf(part_lse), 0.0, xp.exp(part_lse - lse))
            rows = weight.T if packed else weight.transpose(0, 2, 1)
            out = out + rows[..., None] * part_out.astype(np.float64)
    return out, lse


def apply_rotary(x, cos, sin, positions, interleaved=True):
    """Rotary position embedding of ``x`` in float64 (FlashAttention-2's definition).

    Parameters
    ----------
    x : array, shape (batch, seqlen, heads, headdim)
    cos, sin : arrays, shape (max_position, rotary_dim / 2)
        Row ``p`` holds the angles' cosines and sines at position ``p``; ``rotary_dim <= headdim``.
    positions : int array, shape (batch, seqlen)
        Position of each row.
    interleaved : bool
        True rotates the pairs of columns (0, 1), (2, 3), ...; False (GPT-NeoX) the pairs (c, c +
        rotary_dim / 2). Columns from ``rotary_dim`` on are left alone.

    Returns
    -------
    array, float64, shape of ``x``
        Each pair ``(a, b)`` becomes ``(a cos - b sin, a sin + b cos)``.
    """
    xp = _array_module(x)
    out = x.astype(np.float64)
    half = cos.shape[1]
    positions = _on_module(xp, positions)
    c = cos.astype(np.float64)[positions][:, :, None, :]  # (batch, seqlen, 1, half)
    s = sin.astype(np.float64)[positions][:, :, None, :]
    if interleaved:
        first, second = out[..., 0:2 * half:2], out[..., 1:2 * half:2]
    else:
        first, second = out[..., :half], out[..., half:2 * half]
    first, second = first * c - second * s, first * s + second * c
    if interleaved:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = first, second
    else:
        out[..., :half], out[..., half:2 * half] = first, second
    return out


def attention_with_kvcache(q, k_cache, v_cache, *, k=None, v=None, cache_seqlens=None, cache_batch_idx=None,
                           block_table=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=True,
                           causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           sinks=None, return_max_score=False, cache_leftpad=None, q_descale=None, k_descale=None,
                           v_descale=None, score_mod=None, score_mod_buffers=None, compute_dtype=None):
    """Naive attention of queries to a KV cache (FlashAttention-2's ``flash_attn_with_kvcache``).

    Batch entry ``b`` attends to the first ``cache_seqlens[b]`` keys of its cache and, when ``k`` and
    ``v`` are given, to the ``seqlen_new`` new ones, written into the cache at positions
    ``cache_seqlens[b], cache_seqlens[b] + 1, ...`` first. Masks, ALiBi and causal alignment (bottom
    right) follow that batch entry's key count, as in :func:`attention`. The caches given are not
    modified: the updated ones are returned.

    Parameters
    ----------
    q : array, shape (batch, seqlen_q, heads, headdim)
    k_cache, v_cache : arrays
        Dense: (batch_cache, cache_len, heads_k, headdim or headdim_v). Paged (with ``block_table``):
        (num_pages, page_size, heads_k, headdim or headdim_v).
    k, v : arrays, shape (batch, seqlen_new, heads_k, headdim or headdim_v), optional
        New keys and values, appended to the cache before attending.
    cache_seqlens : int or int array, shape (batch,), optional
        Keys already in each batch entry's cache (before the append); default: the capacity less
        ``seqlen_new`` (the cache full after the append).
    cache_batch_idx : int array, shape (batch,), optional
        The dense cache row of each batch entry (default: ``b``).
    block_table : int array, shape (batch, max_pages), optional
        Paged cache: position ``t`` of batch entry ``b`` is row ``t % page_size`` of page
        ``block_table[b, t // page_size]``.
    rotary_cos, rotary_sin : arrays, shape (max_position, rotary_dim / 2), optional
        Rotary embedding (see :func:`apply_rotary`), with ``k`` only: the new keys are rotated at their
        cache positions; ``q`` at ``cache_seqlens[b] + i`` when ``causal`` or a window is set, else all
        of its rows at ``cache_seqlens[b]``.
    rotary_interleaved : bool
    causal, softmax_scale, window_size, softcap, alibi_slopes, sinks, return_max_score, compute_dtype
        As in :func:`attention` (``alibi_slopes`` of shape (heads,) or (batch, heads)).
    cache_leftpad : int array, shape (batch,), optional
        Left-padded caches: batch entry ``b``'s keys are its positions ``cache_leftpad[b]`` up to
        ``cache_seqlens[b] + seqlen_new`` (masks and ALiBi count them from there); new keys are written
        at ``cache_seqlens[b]`` and rotary positions are absolute, as without it.
    q_descale, k_descale, v_descale : float32 arrays, shape (batch, heads_k) (q's also (batch, heads)), optional
        float8_e4m3fn q, caches and new keys and values: each batch entry's row, as in :func:`attention`
        (whose FP8 baseline ``compute_dtype=float8_e4m3fn`` selects).
    score_mod, score_mod_buffers : optional
        As in :func:`attention`: ``b`` is the batch entry, ``q_idx`` the query row and ``kv_idx`` the
        key's position in the entry's cache (its new keys after its cached ones).

    Returns
    -------
    out : array, shape (batch, seqlen_q, heads, headdim_v)
    lse : array, shape (batch, heads, seqlen_q)
        Dtypes as in :func:`attention`.
    max_score : array, float32, shape (batch, heads)
        Only with ``return_max_score``.
    k_cache, v_cache : arrays
        Copies of the caches with the new keys (rotated, rounded to the cache dtype) and values written.
    """
    xp = _array_module(q)
    batch, seqlen_q = q.shape[:2]
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    seqlen_new = 0 if k is None else k.shape[1]
    if cache_seqlens is None:
        lengths = np.full(batch, capacity - seqlen_new, np.int64)
    else:
        lengths = np.broadcast_to(_on_module(np, cache_seqlens), (batch,)).astype(np.int64)
    rows = np.arange(batch) if cache_batch_idx is None else _on_module(np, cache_batch_idx).astype(np.int64)
    table = _on_module(np, block_table).astype(np.int64) if paged else None
    if (lengths < 0).any() or (lengths + seqlen_new > capacity).any():
        raise ValueError(f"cache_seqlens {lengths.tolist()} plus {seqlen_new} new keys do not fit caches of {capacity}")
    starts = np.zeros(batch, np.int64) if cache_leftpad is None else _on_module(np, cache_leftpad).astype(np.int64)
    if (starts < 0).any() or (starts > lengths).any():
        raise ValueError(f"cache_leftpad {starts.tolist()} must lie in [0, cache_seqlens] ({lengths.tolist()})")

    def where(b, positions):
        """(cache index, row) of batch entry b's positions, as index arrays of q's module."""
        if paged:
            index, row = table[b, positions // k_cache.shape[1]], positions % k_cache.shape[1]
        else:
            index, row = np.full_like(positions, rows[b]), positions
        return xp.asarray(index), xp.asarray(row)

    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    new_positions = lengths[:, None] + np.arange(seqlen_new)[None, :]
    fp8 = q.dtype == _fp8.E4M3  # the stored values throughout, dequantized by attention()
    if k is not None:
        k_new, v_new = (k, v) if fp8 else (k.astype(np.float64), v.astype(np.float64))
        if rotary_cos is not None:
            k_new = apply_rotary(k, rotary_cos, rotary_sin, new_positions, rotary_interleaved)
            local = causal or tuple(window_size) != (-1, -1)
            q_positions = lengths[:, None] + (np.arange(seqlen_q)[None, :] if local else 0)
            q = apply_rotary(q, rotary_cos, rotary_sin, np.broadcast_to(q_positions, (batch, seqlen_q)),
                             rotary_interleaved)
        for b in range(batch):
            index, row = where(b, new_positions[b])
            k_cache[index, row] = k_new[b].astype(k_cache.dtype)
            v_cache[index, row] = v_new[b].astype(v_cache.dtype)
    slopes = _sequence_slopes(alibi_slopes, batch)
    outs, lses, tops = [], [], []
    for b in range(batch):
        old = np.arange(starts[b], lengths[b])
        index, row = where(b, old)
        keys, values = k_cache[index, row], v_cache[index, row]
        if not fp8:
            keys, values = keys.astype(np.float64), values.astype(np.float64)
        if k is not None:  # the new keys unrounded, as a kernel holding them in registers would use them
            keys = xp.concatenate([keys, k_new[b]])
            values = xp.concatenate([values, v_new[b]])
        descales = {name: None if d is None else d[b:b + 1] for name, d in (
            ("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))}
        out, lse, top = attention(q[b:b + 1], keys[None], values[None], causal, softmax_scale,
                                  window_size=window_size, softcap=softcap, alibi_slopes=slopes[b], sinks=sinks,
                                  return_max_score=True, score_mod=_sequence_score_mod(score_mod, b),
                                  score_mod_buffers=score_mod_buffers, compute_dtype=compute_dtype, **descales)
        outs.append(out)
        lses.append(lse)
        tops.append(top)
    if return_max_score:
        return xp.concatenate(outs), xp.concatenate(lses), xp.concatenate(tops), k_cache, v_cache
    return xp.concatenate(outs), xp.concatenate(lses), k_cache, v_cache
