"""The public functions: validation, then the CUDA kernels (CuPy arrays) or the NumPy twin."""

import numpy

from . import _numpy_impl, _validate

_SHAPES_DOC = """
    q : cupy.ndarray or numpy.ndarray, shape (batch, seqlen_q, heads, headdim)
    k : same kind and dtype as q, shape (batch, seqlen_k, heads_k, headdim)
    v : same kind and dtype as q, shape (batch, seqlen_k, heads_k, headdim_v)
        heads must be a multiple of heads_k: query head h reads kv head h // (heads // heads_k)
        (MQA/GQA). dtype float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64. Any strided
        view whose last axis is contiguous is used without a copy (e.g. ``x.transpose(0, 2, 1, 3)`` of a
        (batch, heads, seqlen, headdim) array); other layouts are copied once.
    causal : bool, keyword-only
        Causal mask aligned to the bottom-right corner: query i sees key j iff
        ``j <= i + seqlen_k - seqlen_q``. For seqlen_q = 3, seqlen_k = 5 (x = visible)::

            query 0: x x x . .
            query 1: x x x x .
            query 2: x x x x x

        and for seqlen_q > seqlen_k the first seqlen_q - seqlen_k queries see no key.
    softmax_scale : float or None, keyword-only
        Multiplies q . k before the softmax; default 1 / sqrt(headdim)."""


def _empty_forward(p):
    xp = p.xp
    out = xp.zeros(p.out_shape, dtype=p.dtype)
    lse = xp.full(p.lse_shape, -numpy.inf, dtype=_validate.lse_dtype(p.dtype))
    return out, lse


def _forward(q, k, v, p):
    if p.xp is numpy:
        return _numpy_impl.forward(q, k, v, p)
    from . import _cuda

    return _cuda.forward(q, k, v, p)


def _backward(dout, q, k, v, out, lse, p, deterministic):
    if p.xp is numpy:
        return _numpy_impl.backward(dout, q, k, v, out, lse, p)
    from . import _cuda

    return _cuda.backward(dout, q, k, v, out, lse, p, deterministic)


def _check_bool(name, value):
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def flash_attention(q, k, v, *, causal=False, softmax_scale=None, return_lse=False):
    """Exact attention ``softmax(softmax_scale * q k^T) v``, tiled so no score matrix is stored.

    Parameters
    ----------{shapes}
    return_lse : bool, keyword-only
        Also return the log-sum-exp needed by :func:`flash_attention_backward`.

    Returns
    -------
    out : array of q's kind and dtype, shape (batch, seqlen_q, heads, headdim_v)
        A row that sees no key (causal with seqlen_q > seqlen_k, or seqlen_k == 0) is 0, never NaN.
    lse : array, shape (batch, heads, seqlen_q)
        Only with ``return_lse=True``: ``ln(sum_j exp(softmax_scale * q_i . k_j))`` over the keys
        row i sees; -inf for a row that sees no key. float32 for float16/bfloat16 inputs, float64 for
        float32 and float64 inputs (the backward pass recomputes every probability from it, and a
        float32 lse would triple the error of float32 gradients).

    Notes
    -----
    CuPy arrays run on CuPy's current device and stream; NumPy arrays run the same tiled algorithm on
    the CPU. Accumulation is float32 (float64 for float64 inputs); float32 is true float32 (no TF32).
    """
    p = _validate.forward_problem(q, k, v, causal, softmax_scale)
    _check_bool("return_lse", return_lse)
    if p.is_empty:
        out, lse = _empty_forward(p)
    else:
        out, lse = _forward(q, k, v, p)
    return (out, lse) if return_lse else out


def flash_attention_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, deterministic=False):
    """Gradients of :func:`flash_attention` with respect to q, k and v.

    Recomputes the attention probabilities from ``lse`` block by block: the extra memory is
    O(batch * heads * seqlen_q), never O(seqlen_q * seqlen_k).

    Parameters
    ----------
    dout : array, shape (batch, seqlen_q, heads, headdim_v), dtype of q
        Gradient of the loss with respect to ``out``.{shapes}
    out, lse : arrays returned by ``flash_attention(q, k, v, ..., return_lse=True)`` with the same
        ``causal`` and ``softmax_scale``. A float32 or float64 lse of another origin is accepted and
        converted to the precision above.{deterministic}

    Returns
    -------
    dq, dk, dv : arrays with the shapes and dtype of q, k and v
        With GQA/MQA, dk and dv are summed over the query heads that share a kv head. Rows that see no
        key contribute nothing (their dq is 0).
    """
    p = _validate.backward_problem(dout, q, k, v, out, lse, causal, softmax_scale)
    _check_bool("deterministic", deterministic)
    if p.is_empty:
        xp = p.xp
        return (xp.zeros(q.shape, p.dtype), xp.zeros(k.shape, p.dtype), xp.zeros(v.shape, p.dtype))
    lse = lse.astype(_validate.lse_dtype(p.dtype), copy=False)
    return _backward(dout, q, k, v, out, lse, p, deterministic)


def flash_attention_vjp(q, k, v, *, causal=False, softmax_scale=None, deterministic=False):
    """Forward pass and a function that maps ``dout`` to ``(dq, dk, dv)``.

    Parameters
    ----------{shapes}{deterministic}

    Returns
    -------
    out : array, shape (batch, seqlen_q, heads, headdim_v)
    vjp : callable
        ``vjp(dout) -> (dq, dk, dv)``; keeps q, k, v, out and lse alive until it is released.
    """
    _check_bool("deterministic", deterministic)
    out, lse = flash_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True)

    def vjp(dout):
        return flash_attention_backward(
            dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, deterministic=deterministic
        )

    return out, vjp


_DETERMINISTIC_DOC = """
    deterministic : bool, keyword-only
        False (the default): the float16/bfloat16 tensor-core backward adds each key block's share of
        dq into a float32 buffer with atomic additions, in whatever order the blocks finish, so dq can
        differ from run to run in its last bits (dk and dv never do). True: the blocks add in a fixed
        order, so dq is bitwise identical from run to run on the same device, for 8-14% more time and a
        second float32 dq buffer (see bench/NOTES.md). The default is the faster mode because the
        run-to-run differences are far below the rounding error of the result; training that must
        replay exactly should pass True. Every other path (float32, float64, NumPy arrays) is
        deterministic either way."""

for _function in (flash_attention, flash_attention_backward, flash_attention_vjp):
    _function.__doc__ = _function.__doc__.replace("{shapes}", _SHAPES_DOC).replace("{deterministic}", _DETERMINISTIC_DOC)
