"""NumPy (CPU) implementation of the tiled FlashAttention algorithm.

This is the CPU twin of the CUDA kernels, not the naive formula of :mod:`cupyflash.reference`: the
score matrix is never materialized beyond one ``(block_m, block_n)`` tile per (batch, head), the
forward pass uses the online softmax with a running maximum and sum, and the backward pass recomputes
the probabilities from the saved log-sum-exp. Which tiles are visited and which need the element mask
follow the kernels' policy (:mod:`cupyflash._policy`). Every tile is processed for all batches and
heads at once; grouped-query attention is handled by reshaping the query heads to ``(heads_k, group)``
so that one key/value tile broadcasts over its group. Packed (varlen) batches run one sequence at a
time.

Inputs are validated by the caller (a :class:`cupyflash._problem.Problem`). They are upcast to the
accumulation dtype before any arithmetic: NumPy's ``einsum`` rejects bfloat16, ``matmul`` on bfloat16
silently returns float32, and ``matmul`` on float16 bypasses BLAS (about 100 times slower than
float32). Results are C-contiguous, as on the GPU.
"""

import dataclasses

import numpy as np

from . import _dropout, _fp8, _trace
from ._policy import Window, layout_cells, modify_scores, tiles_of
from ._problem import acc_dtype, lse_dtype


def _split_heads(x, heads_k, acc):
    """Upcast ``(batch, seqlen, heads, dim)`` to ``acc`` as ``(batch, heads_k, group, seqlen, dim)``."""
    batch, seqlen, heads, dim = x.shape
    group = heads // max(heads_k, 1)
    return x.astype(acc).transpose(0, 2, 1, 3).reshape(batch, heads_k, group, seqlen, dim)


def _merge_heads(x, dtype):
    """Inverse of :func:`_split_heads`, cast to ``dtype``: a C-contiguous ``(batch, seqlen, heads, dim)``."""
    batch, heads_k, group, seqlen, dim = x.shape
    return np.ascontiguousarray(x.reshape(batch, heads_k * group, seqlen, dim).transpose(0, 2, 1, 3).astype(dtype))


def _kv_heads(x, acc):
    """Upcast ``(batch, seqlen_k, heads_k, dim)`` to ``acc`` as ``(batch, heads_k, 1, seqlen_k, dim)``."""
    return x.astype(acc).transpose(0, 2, 1, 3)[:, :, None]


@dataclasses.dataclass
class _Masking:
    """The mask and score modifications of one dense problem, in the (batch, heads_k, group) layout."""

    window: Window
    scale: object  # softmax_scale in the accumulation dtype
    softcap: float
    slopes: object  # (batch, heads_k, group) or None
    layout: object  # (batch, heads_k, group, q_blocks, k_blocks) bool, or None
    block_size: tuple
    dropout: object  # _Dropout, or None
    user: object = None  # _UserScores, or None
    mask_fn: object = None  # a mask_mod's (traced, buffers, full layout like ``layout``, b, h), or None

    @classmethod
    def of(cls, p, acc):
        batch, heads, heads_k = p.batch, p.heads, p.heads_k
        shape = (batch, heads_k, heads // max(heads_k, 1))
        slopes = None
        if p.alibi_slopes is not None:
            slopes = np.broadcast_to(np.asarray(p.alibi_slopes, np.float32), (batch, heads)).reshape(shape)
        layout, block_size, mask_fn = None, None, None
        if p.block_mask is not None:
            full = p.block_mask.layout_on(np)
            layout = np.broadcast_to(full, (batch, heads) + full.shape[2:]).reshape(shape + full.shape[2:])
            block_size = p.block_mask.block_size
            if p.block_mask.mask_mod is not None:
                traced = p.block_mask.mask_mod[0]
                buffers, every = p.block_mask.mask_buffers_on(np), p.block_mask.full_on(np)
                every = np.broadcast_to(every, (batch, heads) + every.shape[2:]).reshape(shape + every.shape[2:])
                b, h = _positions(p, shape)
                # A mask built for a batch or heads of 1 is that entry's (b = 0, h = 0) for all of them.
                mask_fn = (traced, buffers, every, b if full.shape[0] > 1 else 0 * b, h if full.shape[1] > 1 else 0 * h)
        window = Window.of(p.seqlen_q, p.seqlen_k, p.window_left, p.window_right)
        dropout = _Dropout.of(p, shape, acc) if p.dropout else None
        user = _UserScores.of(p, shape, acc) if p.user_score is not None else None
        return cls(window, acc.type(p.softmax_scale), p.softcap, slopes, layout, block_size, dropout, user, mask_fn)

    def tile_blocks(self, m0, m1, n0, n1):
        """The layout's cells over rows [m0, m1) and keys [n0, n1), or None without a layout."""
        if self.layout is None:
            return None
        return layout_cells(self.layout, self.block_size, np.arange(m0, m1), np.arange(n0, n1))

    def scores(self, q_tile, k_tile, m0, n0, backward=False):
        """Scaled and modified scores of one tile, -inf where masked, d(modified)/d(scaled) (None for
        the identity), and the scaled scores themselves (for a score_mod's buffer gradients).

        Like the general CUDA path this works in natural-log units: the scaled score is rounded once,
        and the backward pass recomputes exactly the same value, so ``exp(s - lse)`` carries only the
        rounding of ``lse`` itself. Only tiles that are not full evaluate the mask.
        """
        s = np.matmul(q_tile, k_tile.swapaxes(-1, -2)) * self.scale
        scaled = s
        rows, cols = s.shape[-2:]
        i = np.arange(m0, m0 + rows)[:, None]
        j = np.arange(n0, n0 + cols)[None, :]
        offset = self.window.seqlen_k - self.window.seqlen_q
        if self.user is not None:
            s, grad = self.user.modify(s, i, j, backward)
        else:
            s, grad = modify_scores(np, s, i, j, self.softcap, self.slopes, offset)
        blocks = self.tile_blocks(m0, m0 + rows, n0, n0 + cols)
        if self.mask_fn is not None:
            # A mask_mod's tile is full where its function holds for every pair of the tile's blocks.
            blocks = layout_cells(self.mask_fn[2], self.block_size, np.arange(m0, m0 + rows), np.arange(n0, n0 + cols))
        full = self.window.tile_is_full(m0, rows, n0, cols) and (blocks is None or bool(blocks.all()))
        if not full:
            visible = self.window.visible(i, j)
            if self.mask_fn is not None:
                traced, buffers, _, b, h = self.mask_fn
                env = {"b": b, "h": h, "q_idx": i.astype(np.int32), "kv_idx": j.astype(np.int32)}
                (seen, ok), = _trace.evaluate([traced.root], env, buffers, np.float32, np)  # as from_mask_mod
                if ok is not None:
                    # An index out of range: the pair stays visible, with a NaN score.
                    s = np.where(ok, s, self.scale.dtype.type(np.nan))
                    seen = seen | ~ok
                visible = visible & seen
            elif blocks is not None:
                visible = visible & blocks
            s = np.where(visible, s, -np.inf)
        return s, grad, scaled

    def key_tiles(self, m0, block_m, block_n):
        """Start of every key tile that query tile [m0, m0 + block_m) visits."""
        begin, end = self.window.key_range(m0, block_m)
        m1 = min(m0 + block_m, self.window.seqlen_q)
        for t in tiles_of(begin, end, block_n):
            n0 = t * block_n
            blocks = self.tile_blocks(m0, m1, n0, min(n0 + block_n, self.window.seqlen_k))
            if blocks is None or blocks.any():
                yield n0

    def query_tiles(self, n0, block_m, block_n):
        """Start of every query tile that visits key tile [n0, n0 + block_n)."""
        begin, end = self.window.query_range(n0, block_n)
        n1 = min(n0 + block_n, self.window.seqlen_k)
        for t in tiles_of(begin, end, block_m):
            m0 = t * block_m
            blocks = self.tile_blocks(m0, min(m0 + block_m, self.window.seqlen_q), n0, n1)
            if blocks is None or blocks.any():
                yield m0


@dataclasses.dataclass
class _Dropout:
    """Dropout of one dense problem: the keep decisions of a tile (cupyflash/_dropout.py) as the factor
    that multiplies its probabilities, 0 or _dropout.keep_scale(dropout_p) in the accumulation dtype."""

    seed: int
    offset: int
    p: float
    bh: object  # (batch, heads_k, group): b * heads + h of every head, b counted from p.batch_start
    scale: object  # 1 / (1 - dropout_rate(p)) in the accumulation dtype

    @classmethod
    def of(cls, p, shape, acc):
        batch, heads_k, group = shape
        b = p.batch_start + np.arange(batch)[:, None, None]
        h = np.arange(heads_k)[None, :, None] * group + np.arange(group)[None, None, :]
        return cls(p.dropout_seed, p.dropout_offset, p.dropout_p, b * p.heads + h, acc.type(_dropout.keep_scale(p.dropout_p)))

    def factor(self, m0, m1, n0, n1):
        """(batch, heads_k, group, m1 - m0, n1 - n0): 0 where dropped, the scale where kept."""
        kept = _dropout.keep(self.seed, self.offset, self.bh, (m0, m1), (n0, n1), self.p)
        return np.where(kept, self.scale, self.scale.dtype.type(0))


def _positions(p, shape):
    """A score or mask function's ``b`` and ``h`` over the (batch, heads_k, group) layout ``shape``, as
    int32 arrays that broadcast against a tile: b counts from ``p.batch_start`` (a packed sequence's index)."""
    batch, heads_k, group = shape
    b = (p.batch_start + np.arange(batch, dtype=np.int32)).reshape(batch, 1, 1, 1, 1)
    h = (np.arange(heads_k, dtype=np.int32)[:, None] * group + np.arange(group, dtype=np.int32)).reshape(
        1, heads_k, group, 1, 1)
    return b, h


class _UserScores:
    """A score_mod (cupyflash/_trace.py) on the tiles of one dense problem, and the gradients of its
    floating-point buffers, accumulated in the accumulation dtype."""

    def __init__(self, traced, buffers, b, h, acc):
        self.traced, self.buffers, self.b, self.h, self.acc = traced, buffers, b, h, acc
        self.grads = [np.zeros(x.shape, acc) if x.dtype.kind == "f" else None for x in buffers]

    @classmethod
    def of(cls, p, shape, acc):
        return cls(p.user_score, p.user_buffers or (), *_positions(p, shape), acc)

    def _env(self, s, i, j):
        return {"score": s, "b": self.b, "h": self.h, "q_idx": i.astype(np.int32), "kv_idx": j.astype(np.int32)}

    def modify(self, s, i, j, backward):
        """The modified scores (NaN where an index they read is out of range) and, in the backward
        pass, their derivative with respect to the scaled scores ``s``."""
        roots = [self.traced.root] + ([self.traced.gradients()[0]] if backward else [])
        results = _trace.evaluate(roots, self._env(s, i, j), self.buffers, self.acc, np)
        value, valid = results[0]
        if valid is not None:
            value = np.where(valid, value, self.acc.type(np.nan))
        value = np.broadcast_to(value, s.shape)
        return value, (np.broadcast_to(results[1][0], s.shape) if backward else None)

    def scatter(self, scaled, i, j, ds_mod):
        """Adds ``ds_mod * d(modified)/d(load)`` of every floating-point buffer load into its gradient;
        pairs where ``ds_mod`` is 0 (masked, or of zero probability) add nothing."""
        _, loads = self.traced.gradients()
        if not loads:
            return
        env = self._env(scaled, i, j)
        roots = [g for _, g in loads] + [x for load, _ in loads for x in load.args]
        results = _trace.evaluate(roots, env, self.buffers, self.acc, np)
        at = len(loads)
        for (load, _), (g, ok) in zip(loads, results):
            number = load.value[0]
            buf = self.buffers[number]
            index = [r[0] for r in results[at:at + len(load.args)]]
            at += len(load.args)
            take = ds_mod != 0
            if ok is not None:
                take = take & ok
            for x, size in zip(index, buf.shape):
                take = take & (x >= 0) & (x < size)
            shape = ds_mod.shape
            picked = np.broadcast_to(take, shape)
            amount = (ds_mod * g)[picked]
            where = tuple(np.broadcast_to(x, shape)[picked] for x in index)
            np.add.at(self.grads[number], where, amount)

    def results(self):
        """The buffers' gradients in the accumulation dtype (None for int and bool buffers)."""
        return tuple(self.grads)


def _per_sequence(p, run, arrays, out_like):
    """Runs a dense ``run(sub_problem, *arrays)`` per sequence of a packed problem and packs the results.

    ``arrays`` are packed ``(total, heads, dim)`` arrays whose first axis is in query rows (``"q"``) or
    key rows (``"k"``) per the ``out_like`` key; ``out_like`` lists, per result, ``(kind, shape)`` where
    kind is ``"q"``, ``"k"``, ``"lse"`` or ``"batch"`` (one row per sequence: the maximum score).
    Sequence ``b`` runs as a problem of batch 1 whose ``batch_start`` is ``b`` (dropout's batch index).
    """
    cu_q, cu_k = np.asarray(p.cu_seqlens_q), np.asarray(p.cu_seqlens_k)
    # A sequence without queries sees no key: its maximum score stays -inf.
    results = [np.full(shape, -np.inf if kind == "batch" else 0, dtype) for kind, shape, dtype in out_like]
    used = None if p.seqused_k is None else np.asarray(p.seqused_k)
    for b in range(p.batch):
        # seqused_k: the sequence's first keys only (the others' gradients stay 0).
        k_end = cu_k[b + 1] if used is None else cu_k[b] + int(used[b])
        rows = {"q": slice(cu_q[b], cu_q[b + 1]), "k": slice(cu_k[b], k_end)}
        slopes = None
        if p.alibi_slopes is not None:
            slopes = np.asarray(p.alibi_slopes)
            slopes = slopes[b] if slopes.ndim == 2 else slopes
        descales = {name: None if getattr(p, name) is None else getattr(p, name)[b:b + 1]
                    for name in ("q_descale", "k_descale", "v_descale")}  # FP8: the sequence's row
        sub = dataclasses.replace(
            p, batch=1, seqlen_q=int(cu_q[b + 1] - cu_q[b]), seqlen_k=int(k_end - cu_k[b]), alibi_slopes=slopes,
            cu_seqlens_q=None, cu_seqlens_k=None, total_q=0, total_k=0, batch_start=b, seqused_k=None, **descales,
        )
        if sub.seqlen_q == 0:
            continue
        parts = run(sub, *(x[rows[kind]][None] for kind, x in arrays))
        for (kind, _, _), result, part in zip(out_like, results, parts):
            if kind == "batch":
                result[b] = part[0]
            elif kind == "lse":
                result[:, rows["q"]] = part[0]
            else:
                result[rows[kind]] = part[0]
    return results


def forward(q, k, v, p, block_m=64, block_n=64, max_score=False):
    """Tiled FlashAttention forward pass on the CPU (without the sinks, which cupyflash/_compute.py adds).

    Parameters
    ----------
    q, k, v : ndarray
        Validated inputs of problem ``p``: (batch, seqlen, heads, dim), or packed (total, heads, dim).
    p : cupyflash._problem.Problem
    block_m, block_n : int, optional
        Query rows and key columns per tile.
    max_score : bool, optional
        Also return the largest score each head sees.

    Returns
    -------
    out : ndarray, shape ``p.out_shape``
        In the input dtype; rows seeing no key are 0.
    lse : ndarray, shape ``p.lse_shape``
        Natural-log log-sum-exp of the modified scores, in ``_problem.lse_dtype`` (float64 for
        float32/float64 inputs, float32 for 16-bit ones); ``-inf`` for rows seeing no key.
    max_score : ndarray, float32, shape (batch, heads)
        Only with ``max_score``: the largest modified score over the head's rows and the keys they see
        (-inf where none; NaN where a score is NaN).
    """
    if p.varlen:
        results = (("q", p.out_shape, p.output_dtype), ("lse", p.lse_shape, lse_dtype(p.dtype)))
        if max_score:
            results += (("batch", (p.batch, p.heads), np.float32),)
        return tuple(_per_sequence(
            p, lambda sub, *xs: forward(*xs, sub, block_m, block_n, max_score), (("q", q), ("k", k), ("k", v)),
            results,
        ))
    acc = acc_dtype(q.dtype)
    lse_dt = lse_dtype(q.dtype)
    fp8 = q.dtype == _fp8.E4M3
    if fp8:
        # The dequantized inputs, float32 (stored value x descale, each product rounded once).
        q, k, v = (_fp8.dequantize(np, x, d, p.heads_k) for x, d in ((q, p.q_descale), (k, p.k_descale), (v, p.v_descale)))
    qh = _split_heads(q, p.heads_k, acc)
    kh = _kv_heads(k, acc)
    vh = _kv_heads(v, acc)
    masking = _Masking.of(p, acc)
    batch, heads_k, group, seqlen_q, _ = qh.shape

    out = np.empty((batch, heads_k, group, seqlen_q, p.headdim_v), dtype=acc)
    lse = np.empty((batch, heads_k, group, seqlen_q), dtype=lse_dt)
    top = np.full((batch, heads_k, group), -np.inf, dtype=acc)  # the largest score of each head
    for m0 in range(0, seqlen_q, block_m):
        m1 = min(m0 + block_m, seqlen_q)
        q_tile = qh[..., m0:m1, :]
        tile_shape = (batch, heads_k, group, m1 - m0)
        m_i = np.full(tile_shape, -np.inf, dtype=acc)  # running max of the scores
        l_i = np.zeros(tile_shape, dtype=acc)  # running sum of exp(s - m_i)
        acc_o = np.zeros(tile_shape + (p.headdim_v,), dtype=acc)
        for n0 in masking.key_tiles(m0, block_m, block_n):
            n1 = min(n0 + block_n, p.seqlen_k)
            s, _, _ = masking.scores(q_tile, kh[..., n0:n1, :], m0, n0)
            m_new = np.maximum(m_i, s.max(axis=-1))  # a NaN score makes the row NaN, as in the reference
            # While a row has seen only masked keys its max is -inf; using 0 as the subtraction base
            # keeps exp(-inf - 0) = 0 where -inf - (-inf) would be NaN.
            m_base = np.where(m_new == -np.inf, acc.type(0), m_new)
            # Rescale what was accumulated under the old max: exp(m_old - m_new) <= 1, and exactly 0
            # while m_old is still -inf.
            alpha = np.exp(m_i - m_base)
            e = np.exp(s - m_base[..., None])
            l_i = l_i * alpha + e.sum(axis=-1)  # lse is the softmax's before dropout
            if masking.dropout is not None:
                e = e * masking.dropout.factor(m0, m1, n0, n1)
            if fp8:  # the FP8 tensor cores take P as e4m3, scaled by 2^8 (the sum above keeps float32 values)
                e = (e * acc.type(_fp8.P_SCALE)).astype(_fp8.E4M3).astype(acc) / acc.type(_fp8.P_SCALE)
            acc_o = acc_o * alpha[..., None] + np.matmul(e, vh[..., n0:n1, :])
            m_i = m_new
        top = np.maximum(top, m_i.max(axis=-1, initial=-np.inf))
        # A row that saw no key keeps l = 0 (NaN scores give l = NaN, which propagates): the
        # substituted 1 avoids 0/0 and log(0), and the where puts out = 0 and lse = -inf in place.
        seen = l_i != 0
        l_safe = np.where(seen, l_i, acc.type(1))
        out[..., m0:m1, :] = np.where(seen[..., None], acc_o / l_safe[..., None], acc.type(0))
        # lse = ln(sum_j exp(s_j)) = m + ln(l), exactly m when one key dominates, evaluated in the lse
        # dtype (float64 for float32 inputs, as the kernels do: see _problem.lse_dtype).
        lse[..., m0:m1] = np.where(seen, m_i.astype(lse_dt) + np.log(l_safe.astype(lse_dt)), -np.inf)
    results = _merge_heads(out, p.output_dtype), lse.reshape(batch, heads_k * group, seqlen_q)
    if max_score:
        results += (top.reshape(batch, heads_k * group).astype(np.float32),)
    return results


def backward(dout, q, k, v, out, lse, p, block_m=64, block_n=64):
    """Tiled FlashAttention backward pass on the CPU.

    The outer loop runs over key tiles, whose ``dK`` and ``dV`` accumulate over every query tile that
    can see them and over all query heads of the group; ``dQ`` accumulates across key tiles in the
    accumulation dtype. The probabilities are recomputed from the saved log-sum-exp.

    Parameters
    ----------
    dout, q, k, v, out : ndarray
        As in :func:`forward` (``dout`` and ``out`` shaped like the output).
    lse : ndarray, shape ``p.lse_shape``
        Log-sum-exp returned by :func:`forward`.
    p, block_m, block_n
        As in :func:`forward`.

    Returns
    -------
    dq, dk, dv : ndarray
        Shapes of q, k and v, in the input dtype. Rows of ``q`` seeing no key get zero gradient.
    """
    if p.varlen:
        lse_rows = lse.T  # (total_q, heads): packed like the tensors
        buffer_grads = []  # a score_mod's, per sequence: summed over them

        def run(sub, do, q_, k_, v_, o_, l_):
            grads = backward(do, q_, k_, v_, o_, l_[0].T[None], sub, block_m, block_n)
            buffer_grads.append(grads[3:])
            return grads[:3]

        grads = tuple(_per_sequence(
            p, run, (("q", dout), ("q", q), ("k", k), ("k", v), ("q", out), ("q", lse_rows)),
            (("q", q.shape, p.dtype), ("k", k.shape, p.dtype), ("k", v.shape, p.dtype)),
        ))
        if p.user_score is None:
            return grads
        acc = acc_dtype(q.dtype)
        total = [np.zeros(x.shape, acc) if x.dtype.kind == "f" else None for x in p.user_buffers or ()]
        for (parts,) in buffer_grads:
            total = [None if t is None else t + g for t, g in zip(total, parts)]
        return grads + (tuple(total),)
    acc = acc_dtype(q.dtype)
    lse_dt = lse_dtype(q.dtype)
    qh = _split_heads(q, p.heads_k, acc)
    kh = _kv_heads(k, acc)
    vh = _kv_heads(v, acc)
    doh = _split_heads(dout, p.heads_k, acc)
    masking = _Masking.of(p, acc)
    batch, heads_k, group, seqlen_q, _ = qh.shape

    # delta_i = rowsum(dO * O) = rowsum(P * dP), from the stored output.
    delta = (doh * _split_heads(out, p.heads_k, acc)).sum(axis=-1)
    lse_base = lse.astype(lse_dt).reshape(batch, heads_k, group, seqlen_q)
    # A row that saw no key has lse = -inf; a base of +inf makes every exp(s - base) exactly 0 (also
    # for masked s = -inf, where -inf - (-inf) would be NaN), so such rows get P = 0 and zero gradients.
    lse_base = np.where(lse_base == -np.inf, np.inf, lse_base)

    dq = np.zeros(qh.shape, dtype=acc)
    dk = np.zeros((batch, heads_k, p.seqlen_k, p.headdim), dtype=acc)
    dv = np.zeros((batch, heads_k, p.seqlen_k, p.headdim_v), dtype=acc)
    for n0 in range(0, p.seqlen_k, block_n):
        n1 = min(n0 + block_n, p.seqlen_k)
        k_tile = kh[..., n0:n1, :]
        v_tile = vh[..., n0:n1, :]
        for m0 in masking.query_tiles(n0, block_m, block_n):
            m1 = min(m0 + block_m, seqlen_q)
            q_tile = qh[..., m0:m1, :]
            do_tile = doh[..., m0:m1, :]
            s, grad, scaled = masking.scores(q_tile, k_tile, m0, n0, backward=True)
            # P = exp(s - lse), recomputed from the same rounded s; the difference is taken in the lse
            # dtype, then the exponential in the accumulation dtype.
            prob = np.exp((s.astype(lse_dt) - lse_base[..., m0:m1, None]).astype(acc))
            dp = np.matmul(do_tile, v_tile.swapaxes(-1, -2))
            dropped = prob
            if masking.dropout is not None:
                # out = (P * Z) V with Z the tile's dropout factor: dV takes P * Z, and dP's share of
                # the loss reaches P through Z.
                factor = masking.dropout.factor(m0, m1, n0, n1)
                dropped = prob * factor
                dp = dp * factor
            # Sums over the query group (axis 2) fold GQA into one kv head.
            dv[..., n0:n1, :] += np.matmul(dropped.swapaxes(-1, -2), do_tile).sum(axis=2)
            ds = prob * (dp - delta[..., m0:m1, None])
            if masking.user is not None:
                # ds is the gradient of the modified score: the score_mod's buffers take it first.
                masking.user.scatter(scaled, np.arange(m0, m1)[:, None], np.arange(n0, n1)[None, :], ds)
            if grad is not None:
                ds = ds * grad  # through the softcap's tanh, or the score_mod
            dk[..., n0:n1, :] += np.matmul(ds.swapaxes(-1, -2), q_tile).sum(axis=2)
            dq[..., m0:m1, :] += np.matmul(ds, k_tile)
    # dS is the gradient with respect to the scaled product softmax_scale * q.k; the chain rule
    # through the scale is applied once, at the end.
    scale = acc.type(p.softmax_scale)
    grads = (
        _merge_heads(dq * scale, q.dtype),
        np.ascontiguousarray((dk * scale).transpose(0, 2, 1, 3).astype(q.dtype)),
        np.ascontiguousarray(dv.transpose(0, 2, 1, 3).astype(q.dtype)),
    )
    return grads + ((masking.user.results(),) if masking.user is not None else ())
