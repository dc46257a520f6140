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
head ``h // (heads // heads_k)``.  Causal masking is bottom-right aligned:
query ``i`` sees key ``j`` iff ``j <= i + seqlen_k - seqlen_q``.
"""

import functools
import math

import numpy as np

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


def _probabilities(xp, q, k, causal, softmax_scale, store, acc):
    """Return the softmax probabilities, row maxima and row sums.

    Parameters
    ----------
    xp : module
        NumPy or CuPy.
    q : array, shape (batch, heads_k, group, seqlen_q, headdim)
    k : array, shape (batch, heads_k, 1, seqlen_k, headdim)
    causal : bool
    softmax_scale : float
    store, acc : numpy.dtype
        See :func:`_precisions`.

    Returns
    -------
    p : array, shape (batch, heads_k, group, seqlen_q, seqlen_k)
        Probabilities, rounded through ``store``; rows seeing no key are 0.
    m : array, shape (batch, heads_k, group, seqlen_q)
        Row maxima of the scaled scores (``-inf`` for rows seeing no key).
    l : array, shape (batch, heads_k, group, seqlen_q)
        Row sums of ``exp(scores - m)`` (0 for rows seeing no key).
    """
    rnd = _rounder(store, acc)
    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    s = rnd(xp.matmul(q, k.swapaxes(-1, -2)) * acc.type(softmax_scale))
    if causal:
        rows = xp.arange(seqlen_q)[:, None]
        cols = xp.arange(seqlen_k)[None, :]
        s = xp.where(cols <= rows + (seqlen_k - seqlen_q), s, acc.type(-np.inf))
    if seqlen_k == 0:
        # A maximum over an empty axis is undefined; no key means m = -inf.
        m = xp.full(s.shape[:-1], -np.inf, dtype=acc)
    else:
        m = s.max(axis=-1)
    # A row that sees no key has m = -inf; subtracting 0 instead keeps
    # exp(-inf - 0) = 0 where -inf - (-inf) would be NaN.
    m_base = xp.where(m == -np.inf, acc.type(0), m)
    e = xp.exp(s - m_base[..., None])
    l = e.sum(axis=-1)
    # Dividing by 1 where l == 0 avoids 0/0; those rows are all zeros anyway.
    p = rnd(e / xp.where(l > 0, l, acc.type(1))[..., None])
    return p, m, l


def _prepare(q, k, v, compute_dtype):
    """Return ``xp``, the precisions and the inputs in split-head ``acc`` layout."""
    xp = _array_module(q)
    store, acc = _precisions(compute_dtype)
    # Inputs are first made representable in ``store`` (a no-op when they
    # already are), then upcast for the arithmetic.
    q, k, v = (x.astype(store).astype(acc) for x in (q, k, v))
    heads_k = k.shape[2]
    return xp, store, acc, _split_heads(q, heads_k), _kv_heads(k), _kv_heads(v)


def _default_scale(softmax_scale, headdim):
    """Return ``softmax_scale``, defaulting to ``1 / sqrt(headdim)``."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    return float(softmax_scale)


def attention(q, k, v, causal=False, softmax_scale=None, *, compute_dtype=None):
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
        ``j <= i + seqlen_k - seqlen_q``.
    softmax_scale : float, optional
        Multiplier of ``q @ k^T``; defaults to ``1 / sqrt(headdim)``.
    compute_dtype : dtype-like, optional
        ``None`` (default) computes the float64 oracle.  A floating dtype
        (float16, ``ml_dtypes.bfloat16``, float32, float64, or
        ``np.longdouble`` with NumPy) computes the plain same-precision
        baseline described in the module docstring.

    Returns
    -------
    out : array, shape (batch, seqlen_q, heads, headdim_v)
        In float64 for the oracle, else in ``compute_dtype``.  Rows seeing
        no key are 0.
    lse : array, shape (batch, heads, seqlen_q)
        Natural-log log-sum-exp of each row's scaled (masked) scores; ``-inf``
        for rows seeing no key.  float64 for the oracle, float32 for 16- and
        32-bit ``compute_dtype``, else ``compute_dtype``.
    """
    softmax_scale = _default_scale(softmax_scale, q.shape[-1])
    xp, store, acc, qh, kh, vh = _prepare(q, k, v, compute_dtype)
    rnd = _rounder(store, acc)
    p, m, l = _probabilities(xp, qh, kh, causal, softmax_scale, store, acc)
    out = rnd(xp.matmul(p, vh))
    # log(0) is avoided by the substitution; the where puts -inf back.
    lse = xp.where(l > 0, m + xp.log(xp.where(l > 0, l, acc.type(1))), acc.type(-np.inf))
    batch, heads_k, group, seqlen_q = lse.shape
    lse = lse.reshape(batch, heads_k * group, seqlen_q)
    return _merge_heads(out).astype(store), lse


def attention_backward(dout, q, k, v, causal=False, softmax_scale=None, *, compute_dtype=None):
    """Naive softmax attention backward pass.

    Implements, with ``P = softmax(scale * q k^T)`` (masked) and
    ``O = P v``::

        dV = P^T dO,  dP = dO V^T,  delta = rowsum(dO * O),
        dS = P * (dP - delta),  dQ = scale * dS K,  dK = scale * dS^T Q.

    ``dK`` and ``dV`` are summed over the query heads sharing a key/value
    head.

    Parameters
    ----------
    dout : array, shape (batch, seqlen_q, heads, headdim_v)
        Gradient of the loss with respect to ``out``.
    q, k, v, causal, softmax_scale, compute_dtype
        As in :func:`attention`.

    Returns
    -------
    dq : array, shape of ``q``
    dk : array, shape of ``k``
    dv : array, shape of ``v``
        In float64 for the oracle, else in ``compute_dtype``.  Rows of ``q``
        seeing no key get a zero gradient.
    """
    softmax_scale = _default_scale(softmax_scale, q.shape[-1])
    xp, store, acc, qh, kh, vh = _prepare(q, k, v, compute_dtype)
    rnd = _rounder(store, acc)
    doh = _split_heads(dout.astype(store).astype(acc), k.shape[2])
    p, _, _ = _probabilities(xp, qh, kh, causal, softmax_scale, store, acc)
    out = rnd(xp.matmul(p, vh))
    scale = acc.type(softmax_scale)
    # Sums over the query group (axis 2) happen in ``acc`` before rounding.
    dv = rnd(xp.matmul(p.swapaxes(-1, -2), doh).sum(axis=2))
    dp = rnd(xp.matmul(doh, vh.swapaxes(-1, -2)))
    delta = (doh * out).sum(axis=-1)
    ds = rnd(p * (dp - delta[..., None]))
    dq = rnd(xp.matmul(ds, kh) * scale)
    dk = rnd(xp.matmul(ds.swapaxes(-1, -2), qh).sum(axis=2) * scale)
    return (
        _merge_heads(dq).astype(store),
        dk.transpose(0, 2, 1, 3).astype(store),
        dv.transpose(0, 2, 1, 3).astype(store),
    )
