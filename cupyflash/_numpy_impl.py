"""NumPy (CPU) implementation of the tiled FlashAttention algorithm.

This is the CPU twin of the CUDA kernels, not the naive formula of
:mod:`cupyflash.reference`: the score matrix is never materialized beyond one
``(block_m, block_n)`` tile per (batch, head), the forward pass uses the
online softmax with a running maximum and sum, and the backward pass
recomputes the probabilities from the saved log-sum-exp.  Every tile is
processed for all batches and heads at once; grouped-query attention is
handled by reshaping the query heads to ``(heads_k, group)`` so that one
key/value tile broadcasts over its group.

Inputs are validated by the caller: NumPy arrays of one dtype (float16,
``ml_dtypes.bfloat16``, float32 or float64), possibly non-contiguous views,
and a Python float ``softmax_scale``.  Inputs are upcast to the accumulation
dtype before any arithmetic: NumPy's ``einsum`` rejects bfloat16, ``matmul``
on bfloat16 silently returns float32, and ``matmul`` on float16 bypasses BLAS
(about 100 times slower than float32).
"""

import numpy as np

from ._validate import acc_dtype, lse_dtype


def _split_heads(x, heads_k, acc):
    """Upcast ``(batch, seqlen, heads, dim)`` to ``acc`` as ``(batch, heads_k, group, seqlen, dim)``.

    ``max(heads_k, 1)`` only matters for empty ``heads == heads_k == 0``
    inputs, where any group size reshapes correctly.
    """
    batch, seqlen, heads, dim = x.shape
    group = heads // max(heads_k, 1)
    return x.astype(acc).transpose(0, 2, 1, 3).reshape(batch, heads_k, group, seqlen, dim)


def _merge_heads(x):
    """Inverse of :func:`_split_heads` (without the cast): ``(batch, seqlen, heads, dim)``."""
    batch, heads_k, group, seqlen, dim = x.shape
    return x.reshape(batch, heads_k * group, seqlen, dim).transpose(0, 2, 1, 3)


def _kv_heads(x, acc):
    """Upcast ``(batch, seqlen_k, heads_k, dim)`` to ``acc`` as ``(batch, heads_k, 1, seqlen_k, dim)``.

    The singleton axis broadcasts one key/value head over its query group.
    """
    return x.astype(acc).transpose(0, 2, 1, 3)[:, :, None]


def _scores(q_tile, k_tile, scale, causal, m0, n0, diagonal_offset):
    """Return one tile of scaled scores ``scale * q.k`` (natural-log units), causally masked.

    Like the general CUDA path this works in natural-log units: the scaled
    score is rounded once, and the backward pass recomputes exactly the same
    value, so ``exp(s - lse)`` carries only the rounding of ``lse`` itself.

    Parameters
    ----------
    q_tile : ndarray, shape (batch, heads_k, group, rows, headdim)
    k_tile : ndarray, shape (batch, heads_k, 1, cols, headdim)
    scale : numpy scalar
        ``softmax_scale`` in the accumulation dtype.
    causal : bool
    m0, n0 : int
        Global index of the tile's first query row and first key column.
    diagonal_offset : int
        ``seqlen_k - seqlen_q``: query ``i`` sees key ``j`` iff
        ``j <= i + diagonal_offset`` (bottom-right aligned causal mask).

    Returns
    -------
    s : ndarray, shape (batch, heads_k, group, rows, cols)
        ``-inf`` where the key is masked.
    """
    s = np.matmul(q_tile, k_tile.swapaxes(-1, -2)) * scale
    rows, cols = s.shape[-2:]
    # Like the kernels, only tiles crossing the diagonal pay for the mask:
    # if the tile's last key is visible to its first row, all of it is.
    if causal and n0 + cols - 1 > m0 + diagonal_offset:
        i = np.arange(m0, m0 + rows)[:, None]
        j = np.arange(n0, n0 + cols)[None, :]
        s = np.where(j <= i + diagonal_offset, s, -np.inf)
    return s


def forward(q, k, v, causal, softmax_scale, block_m=64, block_n=64):
    """Tiled FlashAttention forward pass on the CPU.

    Parameters
    ----------
    q : ndarray, shape (batch, seqlen_q, heads, headdim)
    k : ndarray, shape (batch, seqlen_k, heads_k, headdim)
    v : ndarray, shape (batch, seqlen_k, heads_k, headdim_v)
        Validated inputs of one floating dtype; ``heads % heads_k == 0``.
    causal : bool
        Bottom-right aligned causal mask.
    softmax_scale : float
        Multiplier of ``q @ k^T`` (already defaulted by the caller).
    block_m, block_n : int, optional
        Query rows and key columns per tile.

    Returns
    -------
    out : ndarray, shape (batch, seqlen_q, heads, headdim_v)
        In the input dtype; rows seeing no key are 0.
    lse : ndarray, shape (batch, heads, seqlen_q)
        Natural-log log-sum-exp of the scaled scores, in
        ``_validate.lse_dtype`` (float64 for float32/float64 inputs, float32
        for 16-bit ones); ``-inf`` for rows seeing no key.
    """
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k, heads_k, headdim_v = v.shape[1:]
    acc = acc_dtype(q.dtype)
    lse_dt = lse_dtype(q.dtype)
    qh = _split_heads(q, heads_k, acc)
    kh = _kv_heads(k, acc)
    vh = _kv_heads(v, acc)
    group = qh.shape[2]
    scale = acc.type(softmax_scale)
    diagonal_offset = seqlen_k - seqlen_q

    out = np.empty((batch, heads_k, group, seqlen_q, headdim_v), dtype=acc)
    lse = np.empty((batch, heads_k, group, seqlen_q), dtype=lse_dt)
    for m0 in range(0, seqlen_q, block_m):
        m1 = min(m0 + block_m, seqlen_q)
        q_tile = qh[..., m0:m1, :]
        tile_shape = (batch, heads_k, group, m1 - m0)
        m_i = np.full(tile_shape, -np.inf, dtype=acc)  # running max of the scaled scores
        l_i = np.zeros(tile_shape, dtype=acc)  # running sum of exp(s - m_i)
        acc_o = np.zeros(tile_shape + (headdim_v,), dtype=acc)
        # Causal: the last row of the tile (m1 - 1) sees keys up to
        # m1 - 1 + diagonal_offset, so key tiles from there on are skipped.
        # (m1 may be < m0 + block_m only for the last tile, where the clip to
        # seqlen_k makes both bounds agree.)
        n_end = min(max(m1 + diagonal_offset, 0), seqlen_k) if causal else seqlen_k
        for n0 in range(0, n_end, block_n):
            n1 = min(n0 + block_n, seqlen_k)
            s = _scores(q_tile, kh[..., n0:n1, :], scale, causal, m0, n0, diagonal_offset)
            m_new = np.maximum(m_i, s.max(axis=-1))
            # While a row has seen only masked keys its max is -inf; using 0
            # as the subtraction base keeps exp(-inf - 0) = 0 where
            # -inf - (-inf) would be NaN.
            m_base = np.where(m_new == -np.inf, acc.type(0), m_new)
            # Rescale what was accumulated under the old max: exp(m_old -
            # m_new) <= 1, and exactly 0 while m_old is still -inf.
            alpha = np.exp(m_i - m_base)
            p = np.exp(s - m_base[..., None])
            l_i = l_i * alpha + p.sum(axis=-1)
            acc_o = acc_o * alpha[..., None] + np.matmul(p, vh[..., n0:n1, :])
            m_i = m_new
        seen = l_i > 0
        # Rows that saw no key keep l = 0: the substituted 1 avoids 0/0 and
        # log(0), and the where puts out = 0 and lse = -inf in their place.
        l_safe = np.where(seen, l_i, acc.type(1))
        out[..., m0:m1, :] = np.where(seen[..., None], acc_o / l_safe[..., None], acc.type(0))
        # lse = ln(sum_j exp(s_j)) = m + ln(l), exactly m when one key dominates, evaluated in the
        # lse dtype (float64 for float32 inputs, as the kernels do: see _validate.lse_dtype).
        lse[..., m0:m1] = np.where(seen, m_i.astype(lse_dt) + np.log(l_safe.astype(lse_dt)), -np.inf)
    return (
        _merge_heads(out).astype(q.dtype),
        lse.reshape(batch, heads_k * group, seqlen_q),
    )


def backward(dout, q, k, v, out, lse, causal, softmax_scale, block_m=64, block_n=64):
    """Tiled FlashAttention backward pass on the CPU.

    The outer loop runs over key tiles, whose ``dK`` and ``dV`` accumulate
    over every query tile that can see them and over all query heads of the
    group; ``dQ`` accumulates across key tiles in the accumulation dtype.
    The probabilities are recomputed from the saved log-sum-exp.

    Parameters
    ----------
    dout : ndarray, shape (batch, seqlen_q, heads, headdim_v)
        Gradient of the loss with respect to ``out``.
    q, k, v : ndarray
        As in :func:`forward`.
    out : ndarray, shape (batch, seqlen_q, heads, headdim_v)
        Output of :func:`forward`, as stored (in the input dtype).
    lse : ndarray, shape (batch, heads, seqlen_q)
        Log-sum-exp returned by :func:`forward`.
    causal, softmax_scale, block_m, block_n
        As in :func:`forward`.

    Returns
    -------
    dq : ndarray, shape of ``q``
    dk : ndarray, shape of ``k``
    dv : ndarray, shape of ``v``
        In the input dtype.  Rows of ``q`` seeing no key get zero gradient.
    """
    batch, seqlen_q, heads, headdim = q.shape
    seqlen_k, heads_k, headdim_v = v.shape[1:]
    acc = acc_dtype(q.dtype)
    lse_dt = lse_dtype(q.dtype)
    qh = _split_heads(q, heads_k, acc)
    kh = _kv_heads(k, acc)
    vh = _kv_heads(v, acc)
    doh = _split_heads(dout, heads_k, acc)
    group = qh.shape[2]
    scale = acc.type(softmax_scale)
    diagonal_offset = seqlen_k - seqlen_q

    # delta_i = rowsum(dO * O) = rowsum(P * dP), from the stored output.
    delta = (doh * _split_heads(out, heads_k, acc)).sum(axis=-1)
    lse_base = lse.astype(lse_dt).reshape(batch, heads_k, group, seqlen_q)
    # A row that saw no key has lse = -inf; a base of +inf makes every
    # exp(s - base) exactly 0 (also for masked s = -inf, where
    # -inf - (-inf) would be NaN), so such rows get P = 0 and zero gradients.
    lse_base = np.where(lse_base == -np.inf, np.inf, lse_base)

    dq = np.zeros(qh.shape, dtype=acc)
    dk = np.zeros((batch, heads_k, seqlen_k, headdim), dtype=acc)
    dv = np.zeros((batch, heads_k, seqlen_k, headdim_v), dtype=acc)
    for n0 in range(0, seqlen_k, block_n):
        n1 = min(n0 + block_n, seqlen_k)
        k_tile = kh[..., n0:n1, :]
        v_tile = vh[..., n0:n1, :]
        dk_acc = np.zeros((batch, heads_k, n1 - n0, headdim), dtype=acc)
        dv_acc = np.zeros((batch, heads_k, n1 - n0, headdim_v), dtype=acc)
        # Causal: row i sees key n0 iff i >= n0 - diagonal_offset; start at
        # the query tile holding the first such row.
        m_start = (max(n0 - diagonal_offset, 0) // block_m) * block_m if causal else 0
        for m0 in range(m_start, seqlen_q, block_m):
            m1 = min(m0 + block_m, seqlen_q)
            q_tile = qh[..., m0:m1, :]
            do_tile = doh[..., m0:m1, :]
            s = _scores(q_tile, k_tile, scale, causal, m0, n0, diagonal_offset)
            # P = exp(scale * q.k - lse), recomputed from the same rounded s; the difference is
            # taken in the lse dtype, then the exponential in the accumulation dtype.
            p = np.exp((s.astype(lse_dt) - lse_base[..., m0:m1, None]).astype(acc))
            # Sums over the query group (axis 2) fold GQA into one kv head.
            dv_acc += np.matmul(p.swapaxes(-1, -2), do_tile).sum(axis=2)
            dp = np.matmul(do_tile, v_tile.swapaxes(-1, -2))
            ds = p * (dp - delta[..., m0:m1, None])
            dk_acc += np.matmul(ds.swapaxes(-1, -2), q_tile).sum(axis=2)
            dq[..., m0:m1, :] += np.matmul(ds, k_tile)
        dk[..., n0:n1, :] = dk_acc
        dv[..., n0:n1, :] = dv_acc
    # dS is the gradient with respect to the unscaled product q.k; the chain
    # rule through the softmax scale is applied once, at the end.
    return (
        _merge_heads(dq * scale).astype(q.dtype),
        (dk * scale).transpose(0, 2, 1, 3).astype(q.dtype),
        dv.transpose(0, 2, 1, 3).astype(q.dtype),
    )
