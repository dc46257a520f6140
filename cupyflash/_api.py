"""The public functions: a call whose layout has a plan runs it at once (cupyflash/_keys.py,
_plan.py); any other is checked (cupyflash/_problem.py, the only checks of a call) and computed
(cupyflash/_compute.py), and a CuPy call keeps the plan it built for the next call of its layout."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Tuple, Union

import numpy

from . import _compute, _dropout, _fp8, _keys, _kvcache, _merge, _plan, _problem, _ring

if TYPE_CHECKING:
    import cupy

    from ._block_mask import BlockMask
    from ._ring import VirtualRing

    #: An input or result: a NumPy array (the CPU path) or a CuPy array (the GPU path).
    Array = Union[numpy.ndarray, cupy.ndarray]
    Grads = Tuple[Array, Array, Array]

#: The plans of the dense and packed functions' calls, by key (cupyflash/_keys.py).
PLANS = _plan.PlanCache()
#: e4m3 inputs: their plans' runs take the three descales last (_cuda.tail_inputs).
_FP8_DTYPE = _fp8.E4M3

_SHAPES_DOC = """
    q : cupy.ndarray or numpy.ndarray, shape (batch, seqlen_q, heads, headdim)
    k : same kind and dtype as q, shape (batch, seqlen_k, heads_k, headdim)
    v : same kind and dtype as q, shape (batch, seqlen_k, heads_k, headdim_v)
        heads must be a multiple of heads_k: query head h reads kv head h // (heads // heads_k)
        (MQA/GQA). dtype float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64. Any strided
        view whose last axis is contiguous is used without a copy (e.g. ``x.transpose(0, 2, 1, 3)`` of a
        (batch, heads, seqlen, headdim) array); other layouts are copied once, and so are big-endian
        NumPy arrays. Masked arrays are refused (use ``window_size``, ``causal`` or ``block_mask``)."""

_VARLEN_SHAPES_DOC = """
    q : cupy.ndarray or numpy.ndarray, shape (total_q, heads, headdim)
    k : same kind and dtype as q, shape (total_k, heads_k, headdim)
    v : same kind and dtype as q, shape (total_k, heads_k, headdim_v)
        The sequences of a batch packed along the first axis (FlashAttention-2's varlen layout);
        sequence b holds rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and
        ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of k and v. Heads, dtypes and layouts as for
        :func:`flash_attention`.
    cu_seqlens_q, cu_seqlens_k : int32 arrays of q's kind, shape (batch + 1,)
        Row offsets, non-decreasing from 0 to total_q (total_k). Zero-length sequences are allowed.
    max_seqlen_q, max_seqlen_k : int or None, keyword-only
        The longest sequence of each (sizes the launch). With None (either one), cu_seqlens is copied to
        the host and checked there: a malformed one raises ValueError, at the cost of one
        device-to-host copy of batch + 1 integers that waits for the current stream (about 10-20 us).
        With both given, a CuPy call never synchronizes: cu_seqlens is checked on the device by a
        small kernel, and a malformed one (not non-decreasing from 0 to total, or a sequence longer
        than its max_seqlen) makes every output NaN; no access ever leaves the packed tensors. NumPy
        inputs are always checked on the host."""

_MASK_DOC = """
    causal : bool, keyword-only
        Causal mask aligned to the bottom-right corner: query i sees key j iff
        ``j <= i + seqlen_k - seqlen_q``; the same as ``window_size=(-1, 0)``, and it caps any window's
        right side at 0.
    softmax_scale : float or None, keyword-only
        Multiplies q . k before the softmax; default 1 / sqrt(headdim).
    window_size : (int, int), keyword-only
        Sliding-window (local) attention, FlashAttention-2's definition: query i sees key j iff
        ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right``; -1 leaves that side
        unbounded, and ``causal`` caps right at 0. The window is aligned to the bottom-right corner;
        for seqlen_q = 3, seqlen_k = 5 and window (1, 0) (x = visible)::

            query 0: . x x . .
            query 1: . . x x .
            query 2: . . . x x

        and for seqlen_q = 5, seqlen_k = 3, window (1, 0)::

            query 0: . . .   (sees no key)
            query 1: . . .   (sees no key)
            query 2: x . .
            query 3: x x .
            query 4: . x x

    softcap : float, keyword-only
        When positive, every scaled score s becomes ``softcap * tanh(s / softcap)`` before the softmax
        (Gemma 2); the gradient goes exactly through the tanh. 0 means none.
    alibi_slopes : float32 array of q's kind, shape (heads,) or (batch, heads), or None, keyword-only
        ALiBi: ``-slope[b, h] * |i + seqlen_k - seqlen_q - j|`` is added to each scaled (and capped)
        score of query head h, FlashAttention-2's definition. NumPy slopes must be finite (ValueError
        otherwise). CuPy slopes are not checked, since reading them would synchronize with the host: a
        NaN or infinite slope makes every row of its head (and batch entry, for (batch, heads) slopes)
        that sees a key NaN, in out and lse."""

_BLOCK_MASK_DOC = """
    block_mask : cupyflash.BlockMask or None, keyword-only
        Block-sparse attention: query i of head h may see key j only where the mask's layout sets block
        ``(i // block_q, j // block_k)`` (blocks aligned to the top-left corner), on top of ``causal`` and
        ``window_size``. Absent blocks are never read. See :class:`cupyflash.BlockMask`."""

_LSE_DOC = """
    lse : array
        Only with ``return_lse=True``: ``ln(sum_j exp(s_ij))`` over the keys row i sees, s being the
        scaled, capped and biased score (with ``sinks``, ``exp(sinks[h])`` joins the sum); -inf for a
        row that sees no key and NaN for a row whose scores hold a NaN. float32 for float16/bfloat16
        inputs, float64 for float32 and float64 inputs (the backward pass recomputes every probability
        from it, and a float32 lse would triple the error of float32 gradients)."""

_DETERMINISTIC_DOC = """
    deterministic : bool, keyword-only
        False (the default): the tensor-core backward (every dtype) adds each key tile's share of dq
        into a float32 buffer (float64 for float64) with atomic additions, in whatever order the tiles
        finish, so dq can differ from run to run in its last bits (dk and dv never do). True: the tiles add in a fixed
        order, so dq is bitwise identical from run to run on the same device, at the cost of time: 1-26%
        more on the H200's Hopper backward (at most 9% at head dims 64 and 96, 13% at 192 and 15% at
        128; 9-26% at head dim 256; bench/NOTES.md), and off the Hopper path of a second float32 dq
        buffer. The default is the faster mode because the run-to-run differences are far below the
        rounding error of the result; training that must replay exactly should pass True. The general
        kernels and NumPy arrays are deterministic either way, but for a score_mod's buffer gradients,
        which CuPy kernels add with atomics: with True into exact sums (a long accumulator per
        element), rounded once, so they too are bitwise identical from run to run."""

_PRECISION_DOC = """
    precision : {"highest", "tf32"}, keyword-only
        For float32 inputs (JAX's name for the knob; every other dtype takes only "highest", the
        default). "highest": float32 accuracy, errors within about twice a plain float32
        implementation's. "tf32": TF32's accuracy (a plain implementation whose products take inputs
        rounded to TF32's 10 mantissa bits). On compute capability 9.0 a forward call that returns no
        lse (dense, head dims up to 128, no softcap, ALiBi, sinks, score function or dropout) then runs
        on the TF32 tensor cores (sm90_fwd_tf32: scores off by about 2^-11 of them); the other
        tensor-core forwards, and calls whose lse leaves them (a backward may follow: it recomputes
        their scores), multiply two bfloat16 parts of each value in three products instead of three
        parts in six; every other path computes as for "highest"."""

_TRAINING_DOC = """
    sinks : float32 array of q's kind, shape (heads,), or None, keyword-only
        Attention sinks (gpt-oss): a learnable logit per query head in every row's softmax denominator,
        whose value is 0. Row i of head h is ``out_i = sum_j exp(s_ij - L_i) v_j`` with
        ``L_i = ln(exp(sinks[h]) + sum_j exp(s_ij))``, and the lse returned is ``L_i``; a row that sees no
        key gets out 0 and lse ``sinks[h]``. -inf is no sink. NumPy sinks may not be NaN or +inf
        (ValueError); CuPy sinks are not read on the host, and a NaN there makes its head's rows NaN.
    dropout_p : float in [0, 1), keyword-only
        Attention dropout: each probability is dropped with probability ``rate =``
        :func:`cupyflash.dropout_rate` ``(dropout_p)`` = ``round(256 dropout_p) / 256`` (8-bit
        decisions, like FlashAttention-2's; dropout_p must be 0 or in [1/512, 511/512)) and the kept
        ones are scaled by ``1 / (1 - rate)`` before the product with v, so the expectation of the
        output is the one without dropout; lse is the softmax's before dropout. On CuPy arrays the
        Hopper 16-bit and the general kernels draw the decisions.
    dropout_seed : int in [0, 2^64), keyword-only
        Required when ``dropout_p > 0``. The keep decision of (batch entry b, query head h, query i,
        key j) is a pure function of (seed, offset, b, h, i, j) (Philox4x32-7;
        :func:`cupyflash.dropout_mask` returns it), so the backward, given the same three arguments,
        drops the same probabilities, and every run draws the same ones.
    dropout_offset : int in [0, 2^32), keyword-only
        The generator's fourth counter word: one seed with a different offset per layer and step."""

_MAX_SCORE_DOC = """
    return_max_score : bool, keyword-only
        Also return ``max_score``: the largest score (after the scale, softcap and ALiBi; the sinks are
        not scores) over every row of each query head and the keys it sees, float32 (batch, heads), -inf
        where the head sees no key (QK-clip reads it). NumPy and CuPy arrays."""

_FP8_DOC = """
    q_descale, k_descale, v_descale : float32 arrays of q's kind, or None, keyword-only
        Only with q, k and v of dtype ``ml_dtypes.float8_e4m3fn`` (FP8, forward only): real value = stored
        value x descale (FlashAttention-3's convention; :func:`cupyflash.quantize_fp8` makes both for
        (batch, seqlen, heads, headdim) arrays), shape (batch, heads_k), q_descale also (batch, heads),
        with packed sequences (sequences, heads_k) made by the caller; None means 1.
    out_dtype : dtype, keyword-only
        FP8 inputs: out's dtype, bfloat16 (default) or float16; lse is float32. The attention is that of
        the dequantized inputs, its probabilities rounded to e4m3 for their product with v (as the FP8
        tensor cores take them). On CuPy arrays the Hopper FP8 forward (compute capability 9.0, dense
        batches: packed ones run on NumPy alone; NotImplementedError naming what it does not take)."""

_SCORE_MOD_DOC = """
    score_mod : callable or None, keyword-only
        ``score_mod(score, b, h, q_idx, kv_idx, *buffers)``: the score the softmax sees, from the scaled
        score ``softmax_scale * q . k`` of batch entry (or packed sequence) b, query head h, query q_idx and
        key kv_idx (0-based within the sequence). Traced once into an expression (:mod:`cupyflash.mods`
        holds its functions; Python control flow on its values is a TypeError); not with softcap or
        alibi_slopes, which it can write. The backward differentiates it.
    score_mod_buffers : tuple of arrays of q's kind, or None, keyword-only
        The arrays the score_mod indexes (at most 8; float32, float64, int32 or bool, rank at most 4), one int per axis;
        an index out of range makes the score NaN. Given, the backward returns their gradients last."""


_NOTES_DOC = """
    CuPy arrays run on CuPy's current device and stream; NumPy arrays run the same tiled algorithm on
    the CPU. Accumulation is float32 (float64 for float64 inputs); float32 is float32-accurate by default
    ("highest" never uses TF32) and TF32-accurate with ``precision="tf32"`` (see precision).
    A NaN (or an inf that makes one) in q or k reaches exactly the rows that see it."""


def _plain(sinks, dropout_p, dropout_seed, dropout_offset, return_max_score=False, score_mod=None, *fp8):
    """Whether a call leaves sinks, dropout, the maximum score, score_mod and the FP8 arguments (``fp8``:
    the descales and out_dtype) at their defaults: such calls have plans, and so do those that differ
    from one only as _fused_extras, the FP8 branch and _planned_dropout allow (the others take the
    checked path every call)."""
    return (sinks is None and dropout_p.__class__ is float and dropout_p == 0.0 and dropout_seed is None
            and dropout_offset.__class__ is int and dropout_offset == 0 and return_max_score is False
            and score_mod is None and all(x is None for x in fp8))


def _fused_extras(sinks, dropout_p, dropout_seed, dropout_offset, return_max_score=False, score_mod=None, *fp8):
    """Whether a call that is not plain differs from one only by its sinks or the maximum score, which the
    kernels join themselves: such calls have plans too (keyed by _keys.with_extras), whose runs take the
    sinks as their last problem input."""
    return ((return_max_score is False or return_max_score is True)
            and _plain(None, dropout_p, dropout_seed, dropout_offset, False, score_mod, *fp8))


def _planned_dropout(dropout_p, dropout_seed, dropout_offset, *fp8):
    """dropout_p where a call's dropout can take a plan (a float in (0, 1), an int seed and offset in range,
    and no FP8 arguments): such a plan is built with the seed _plan.DROPOUT_SEED and takes the seed and
    offset per run (Plan.dropout_scalars), so that a step's new seed or offset does not miss the plan.
    Else None (no dropout, or arguments for the checked path to judge). A rate no 8-bit decision draws
    gets a key but never a plan: the checked path refuses it."""
    if (dropout_p.__class__ is float and 0.0 < dropout_p < 1.0 and dropout_seed.__class__ is int
            and 0 <= dropout_seed <= _dropout.MAX_SEED and dropout_offset.__class__ is int
            and 0 <= dropout_offset <= _dropout.MAX_OFFSET and all(x is None for x in fp8)):
        return dropout_p
    return None


def _undropped(drop, dropout_p, dropout_seed, dropout_offset):
    """The dropout arguments a call's key is classified by: none where its dropout takes a plan's scalars
    (``drop`` not None), else its own."""
    return (0.0, None, 0) if drop is not None else (dropout_p, dropout_seed, dropout_offset)


def _planned_problem(p):
    """The problem a plan of ``p`` is built for: with dropout, the seed _plan.DROPOUT_SEED, whose words each
    run writes (see _planned_dropout)."""
    return dataclasses.replace(p, dropout_seed=_plan.DROPOUT_SEED) if p.dropout else p


def _planned_results(results, p_sinks, varlen):
    """A backward plan's results as the call returns them: (dq, dk, dv), then dsinks from the per-row
    terms the plan returned last where the call has sinks."""
    if p_sinks is None:
        return results
    return tuple(results[:3]) + (_merge.sink_gradient_from_terms(results[3], varlen),)


def _results(out, lse, max_score, return_lse, return_max_score):
    """out, then lse and max_score when asked for: a tuple when there is more than out."""
    results = (out,) + ((lse,) if return_lse else ()) + ((max_score,) if return_max_score else ())
    return results if len(results) > 1 else out


def _forward(key, p, q, k, v, return_lse, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
             return_max_score=False, seqused_k=None):
    """out, then lse with ``return_lse`` and max_score with ``return_max_score``, of a checked forward
    call; a CuPy call's plan is kept under ``key``."""
    if not return_lse:
        p = dataclasses.replace(p, lse_returned=False)
    if key is None or not _compute.plannable(p):
        results = _compute.forward(p, q, k, v, max_score=return_max_score)
        return _results(results[0], results[1], results[-1], return_lse, return_max_score)
    from . import _cuda

    plan = _cuda.forward_plan(_planned_problem(p), q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
                              return_lse=return_lse, max_score=return_max_score)
    PLANS.put(key, plan)
    results = plan.run(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, *_cuda.tail_inputs(p),
                       scalars=plan.dropout_scalars(p.dropout_seed, p.dropout_offset))
    return results if len(results) > 1 else results[0]


def _backward(key, p, dout, q, k, v, out, lse, deterministic, alibi_slopes=None, cu_seqlens_q=None,
              cu_seqlens_k=None):
    """(dq, dk, dv), and dsinks with sinks, of a checked backward call; a CuPy call's plan is kept under
    ``key``."""
    deterministic = _problem.check_flag("deterministic", deterministic)
    if key is None or not _compute.plannable(p):
        return _compute.backward(p, dout, q, k, v, out, lse, deterministic)
    from . import _cuda

    if p.sinks is not None and not _cuda.launchable(p):  # no kernel to write the sinks' terms: the checked path
        return _compute.backward(p, dout, q, k, v, out, lse, deterministic)

    plan = _cuda.backward_plan(_planned_problem(p), dout, q, k, v, out, lse, deterministic, alibi_slopes, cu_seqlens_q,
                               cu_seqlens_k)
    PLANS.put(key, plan)
    results = plan.run(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, None, *_cuda.tail_inputs(p),
                       scalars=plan.dropout_scalars(p.dropout_seed, p.dropout_offset))
    return _planned_results(results, p.sinks, p.varlen)


def flash_attention(q: Array, k: Array, v: Array, *, causal: bool = False, softmax_scale: Optional[float] = None,
                    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Array] = None,
                    block_mask: Optional[BlockMask] = None, return_lse: bool = False,
                    precision: str = "highest", sinks: Optional[Array] = None, dropout_p: float = 0.0,
                    dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                    score_mod: Optional[Callable] = None, score_mod_buffers: Optional[Sequence[Array]] = None,
                    return_max_score: bool = False, q_descale: Optional[Array] = None, k_descale: Optional[Array] = None,
                    v_descale: Optional[Array] = None, out_dtype=None) -> Union[Array, Tuple[Array, ...]]:
    """Exact attention ``softmax(softmax_scale * q k^T) v``, tiled so no score matrix is stored.

    Parameters
    ----------{shapes}{mask}{block_mask}
    return_lse : bool, keyword-only
        Also return the log-sum-exp needed by :func:`flash_attention_backward`.{precision}{training}{score_mod}{max_score}{fp8}

    Returns
    -------
    out : array of q's kind and dtype (out_dtype for FP8 inputs), shape (batch, seqlen_q, heads, headdim_v)
        A row that sees no key (causal with seqlen_q > seqlen_k, a window or block mask that hides every
        key, or seqlen_k == 0) is 0, never NaN.{lse}
    max_score : float32 array, shape (batch, heads)
        Only with ``return_max_score=True``, after lse when both are asked for.

    Notes
    -----{notes}
    """
    drop = _planned_dropout(dropout_p, dropout_seed, dropout_offset, q_descale, k_descale, v_descale, out_dtype)
    undropped = _undropped(drop, dropout_p, dropout_seed, dropout_offset)
    if _plain(sinks, *undropped, return_max_score, score_mod, q_descale, k_descale, v_descale, out_dtype):
        key = _keys.forward(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, block_mask, return_lse,
                            precision)
    elif _fused_extras(sinks, *undropped, return_max_score, score_mod, q_descale, k_descale, v_descale, out_dtype):
        key = _keys.with_extras(_keys.forward(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes,
                                              block_mask, return_lse, precision), sinks, return_max_score)
    elif sinks is None and _fused_extras(None, *undropped, return_max_score, score_mod):
        # FP8 arguments (and the maximum score): the plan's run takes the descales last.
        key = _keys.with_fp8(_keys.with_extras(_keys.forward(q, k, v, causal, softmax_scale, window_size, softcap,
                                                             alibi_slopes, block_mask, return_lse, precision),
                                               None, return_max_score), q_descale, k_descale, v_descale, out_dtype)
    else:
        key = None
    key = _keys.with_dropout(key, drop)
    plan = PLANS.get(key)
    if plan is not None:
        if q.dtype == _FP8_DTYPE:
            results = plan.run(q, k, v, alibi_slopes, None, None, None, q_descale, k_descale, v_descale)
        else:
            scalars = () if drop is None else plan.dropout_scalars(dropout_seed, dropout_offset)
            results = (plan.run(q, k, v, alibi_slopes, None, None, None, scalars=scalars) if sinks is None
                       else plan.run(q, k, v, alibi_slopes, None, None, None, sinks, scalars=scalars))
        return results if len(results) > 1 else results[0]
    q, k, v = _problem.arrays(q=q, k=k, v=v)
    p = _problem.forward_problem(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                                 softcap=softcap, alibi_slopes=alibi_slopes, block_mask=block_mask, precision=precision,
                                 sinks=sinks, dropout_p=dropout_p, dropout_seed=dropout_seed,
                                 dropout_offset=dropout_offset, score_mod=score_mod,
                                 score_mod_buffers=score_mod_buffers, q_descale=q_descale, k_descale=k_descale,
                                 v_descale=v_descale, out_dtype=out_dtype)
    return_lse = _problem.check_flag("return_lse", return_lse)
    return_max_score = _problem.check_flag("return_max_score", return_max_score)
    return _forward(key, p, q, k, v, return_lse, alibi_slopes, return_max_score=return_max_score)


def flash_attention_backward(dout: Array, q: Array, k: Array, v: Array, out: Array, lse: Array, *, causal: bool = False,
                             softmax_scale: Optional[float] = None, window_size: Tuple[int, int] = (-1, -1),
                             softcap: float = 0.0, alibi_slopes: Optional[Array] = None,
                             block_mask: Optional[BlockMask] = None, deterministic: bool = False,
                             precision: str = "highest", sinks: Optional[Array] = None, dropout_p: float = 0.0,
                             dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                             score_mod: Optional[Callable] = None, score_mod_buffers: Optional[Sequence[Array]] = None) -> Grads:
    """Gradients of :func:`flash_attention` with respect to q, k and v (and the sinks).

    Recomputes the attention probabilities from ``lse`` tile by tile: the extra memory is
    O(batch * heads * seqlen_q), never O(seqlen_q * seqlen_k).

    Parameters
    ----------
    dout : array, shape (batch, seqlen_q, heads, headdim_v), dtype of q
        Gradient of the loss with respect to ``out``.{shapes}
    out, lse : arrays returned by ``flash_attention(q, k, v, ..., return_lse=True)`` with the same
        mask and score arguments. A float32 or float64 lse of another origin is accepted and converted
        to the precision of :func:`flash_attention`'s.{mask}{block_mask}{deterministic}{precision}{training}{score_mod}
        The sinks and the three dropout arguments must be those of the forward call.

    Returns
    -------
    dq, dk, dv : arrays with the shapes and dtype of q, k and v
        With GQA/MQA, dk and dv are summed over the query heads that share a kv head. Rows that see no
        key contribute nothing (their dq is 0).
    dsinks : float32 array, shape (heads,)
        Only with ``sinks``: ``dsinks[h] = -sum_{b,i} exp(sinks[h] - lse_bhi) * sum_d(dout * out)_bhi``.
    dbuffers : tuple
        Only with ``score_mod_buffers``: one gradient per buffer, in its dtype (None for int32 and bool
        buffers), accumulated in float32 (float64 for float64 inputs).
    """
    drop = _planned_dropout(dropout_p, dropout_seed, dropout_offset)
    undropped = _undropped(drop, dropout_p, dropout_seed, dropout_offset)
    if _plain(sinks, *undropped, score_mod=score_mod):
        key = _keys.backward(dout, q, k, v, out, lse, causal, softmax_scale, window_size, softcap, alibi_slopes,
                             block_mask, deterministic, precision)
    elif _fused_extras(sinks, *undropped, score_mod=score_mod):
        key = _keys.with_extras(_keys.backward(dout, q, k, v, out, lse, causal, softmax_scale, window_size, softcap,
                                               alibi_slopes, block_mask, deterministic, precision), sinks)
    else:
        key = None
    key = _keys.with_dropout(key, drop)
    plan = PLANS.get(key)
    if plan is not None:
        scalars = () if drop is None else plan.dropout_scalars(dropout_seed, dropout_offset)
        if sinks is None:
            return plan.run(dout, q, k, v, out, lse, alibi_slopes, None, None, None, scalars=scalars)
        return _planned_results(plan.run(dout, q, k, v, out, lse, alibi_slopes, None, None, None, sinks,
                                         scalars=scalars), sinks, False)
    dout, q, k, v, out, lse = _problem.arrays(dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    p = _problem.backward_problem(dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
                                  window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                                  block_mask=block_mask, precision=precision, sinks=sinks, dropout_p=dropout_p,
                                  dropout_seed=dropout_seed, dropout_offset=dropout_offset,
        score_mod=score_mod, score_mod_buffers=score_mod_buffers)
    return _backward(key, p, dout, q, k, v, out, lse, deterministic, alibi_slopes)


def flash_attention_vjp(q: Array, k: Array, v: Array, *, causal: bool = False, softmax_scale: Optional[float] = None,
                        window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                        alibi_slopes: Optional[Array] = None, block_mask: Optional[BlockMask] = None,
                        deterministic: bool = False, precision: str = "highest", sinks: Optional[Array] = None,
                        dropout_p: float = 0.0, dropout_seed: Optional[int] = None,
                        dropout_offset: int = 0,
                        score_mod: Optional[Callable] = None,
                        score_mod_buffers: Optional[Sequence[Array]] = None) -> Tuple[Array, Callable[[Array], Grads]]:
    """Forward pass and a function that maps ``dout`` to ``(dq, dk, dv)`` (and ``dsinks``).

    Parameters
    ----------{shapes}{mask}{block_mask}{deterministic}{precision}{training}{score_mod}

    Returns
    -------
    out : array, shape (batch, seqlen_q, heads, headdim_v)
    vjp : callable
        ``vjp(dout) -> (dq, dk, dv)``, or ``(dq, dk, dv, dsinks)`` with ``sinks``, and the buffers' gradients last with
        ``score_mod_buffers``; keeps q, k, v, out and
        lse alive until it is released.
    """
    _problem.refuse_fp8_backward(q)
    deterministic = _problem.check_flag("deterministic", deterministic)
    options = {"causal": causal, "softmax_scale": softmax_scale, "window_size": window_size, "softcap": softcap,
               "alibi_slopes": alibi_slopes, "block_mask": block_mask, "precision": precision, "sinks": sinks,
               "dropout_p": dropout_p, "dropout_seed": dropout_seed, "dropout_offset": dropout_offset,
               "score_mod": score_mod, "score_mod_buffers": score_mod_buffers}
    out, lse = flash_attention(q, k, v, return_lse=True, **options)

    def vjp(dout):
        return flash_attention_backward(dout, q, k, v, out, lse, deterministic=deterministic, **options)

    return out, vjp


def flash_attention_varlen(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, *,
                           max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None, causal: bool = False,
                           softmax_scale: Optional[float] = None, window_size: Tuple[int, int] = (-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[Array] = None, return_lse: bool = False,
                           precision: str = "highest", sinks: Optional[Array] = None, dropout_p: float = 0.0,
                           dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                           score_mod: Optional[Callable] = None, score_mod_buffers: Optional[Sequence[Array]] = None,
                           return_max_score: bool = False, q_descale: Optional[Array] = None,
                           k_descale: Optional[Array] = None, v_descale: Optional[Array] = None,
                           out_dtype=None, seqused_k: Optional[Array] = None,
                           block_table: Optional[Array] = None) -> Union[Array, Tuple[Array, ...]]:
    """:func:`flash_attention` over a batch of sequences of different lengths, packed without padding.

    Every sequence is its own problem: masks, windows and ALiBi distances are aligned to its own
    seqlen_q and seqlen_k.

    Parameters
    ----------{varlen_shapes}{mask}
        For ALiBi, ``alibi_slopes`` of shape (batch, heads) gives each sequence its row.
    return_lse : bool, keyword-only
        Also return the log-sum-exp needed by :func:`flash_attention_varlen_backward`.{precision}{training}{score_mod}
        For dropout, the batch index of sequence b is b, and i and j count from its first row.{max_score}{fp8}
        Here the descales' batch axis is the sequence's index.
    seqused_k : int32 array of q's kind, shape (batch,), or None, keyword-only
        Sequence b attends to its first ``seqused_k[b]`` keys only (FlashAttention's varlen seqused_k;
        masks aligned to that count). NumPy values must lie in [0, its keys]; CuPy values are clamped into
        the sequence by the kernels. The forward only (the backward takes none).
    block_table : int32 array, shape (batch, max_pages), or None, keyword-only
        Paged keys and values (FlashAttention-2's varlen paged KV): k and v of shape (num_pages, page_size,
        heads_k, dim), sequence b's key t at row ``t % page_size`` of page ``block_table[b, t //
        page_size]``, its key count from cu_seqlens_k. The forward only. NumPy values are checked
        (ValueError); on CuPy arrays the pages are gathered on the device into each sequence's whole
        capacity (batch x max_pages pages of workspace; on an H100/H200 the Hopper forward reads them in
        place), and a sequence whose cu_seqlens_k or used pages are out of range gets NaN rows.

    Returns
    -------
    out : array of q's kind and dtype (out_dtype for FP8 inputs), shape (total_q, heads, headdim_v)
        Rows that see no key are 0.
    lse : array, shape (heads, total_q)
        Only with ``return_lse=True``; as in :func:`flash_attention`.
    max_score : float32 array, shape (batch, heads)
        Only with ``return_max_score=True``: per sequence and query head.

    Notes
    -----{notes}
    """
    paged_bad = pools = None
    drop = _planned_dropout(dropout_p, dropout_seed, dropout_offset, q_descale, k_descale, v_descale, out_dtype)
    undropped = _undropped(drop, dropout_p, dropout_seed, dropout_offset)
    if block_table is not None:  # packed keys and values (checked there)
        if _problem.array_module({"k": k, "v": v, "block_table": block_table}) is numpy:
            k, v = _problem.gather_paged(k, v, cu_seqlens_k, block_table)
        else:
            pools = k, v
            k, v, cu_seqlens_k, seqused_k, paged_bad, max_seqlen_k = _problem.paged_counts_on_device(
                k, v, cu_seqlens_k, seqused_k, block_table)
        key = None
    elif _plain(sinks, *undropped, return_max_score, score_mod, q_descale, k_descale, v_descale, out_dtype):
        key = _keys.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                   softmax_scale, window_size, softcap, alibi_slopes, return_lse, precision, seqused_k)
    elif _fused_extras(sinks, *undropped, return_max_score, score_mod, q_descale, k_descale, v_descale, out_dtype):
        key = _keys.with_extras(_keys.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                     causal, softmax_scale, window_size, softcap, alibi_slopes,
                                                     return_lse, precision, seqused_k), sinks, return_max_score)
    else:
        key = None
    key = _keys.with_dropout(key, drop)
    plan = PLANS.get(key)
    if plan is not None:
        scalars = () if drop is None else plan.dropout_scalars(dropout_seed, dropout_offset)
        results = (plan.run(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, scalars=scalars)
                   if sinks is None
                   else plan.run(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, scalars=scalars))
        return results if len(results) > 1 else results[0]
    q, k, v, cu_seqlens_q, cu_seqlens_k = _problem.arrays(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
                                                          cu_seqlens_k=cu_seqlens_k)
    p = _problem.varlen_forward_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                        max_seqlen_k=max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                                        window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                                        precision=precision, sinks=sinks, dropout_p=dropout_p,
                                        dropout_seed=dropout_seed, dropout_offset=dropout_offset,
                                        score_mod=score_mod, score_mod_buffers=score_mod_buffers, q_descale=q_descale,
                                        k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype,
                                        seqused_k=seqused_k)
    return_lse = _problem.check_flag("return_lse", return_lse)
    return_max_score = _problem.check_flag("return_max_score", return_max_score)
    if pools is not None:  # the Hopper forward reads the pages in place where it takes the problem
        from . import _cuda

        paged = _cuda.paged_in_place(p, q, *pools, block_table, return_max_score)
        p, (k, v) = (paged, pools) if paged is not None else (p, _problem.gather_pages_on_device(*pools, block_table))
    results = _forward(key, p, q, k, v, return_lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, return_max_score,
                       seqused_k)
    if paged_bad is not None:
        results = _problem.nan_bad_sequences(results, paged_bad, cu_seqlens_q, return_lse, return_max_score)
    return results


def flash_attention_varlen_backward(dout: Array, q: Array, k: Array, v: Array, out: Array, lse: Array,
                                    cu_seqlens_q: Array, cu_seqlens_k: Array, *, max_seqlen_q: Optional[int] = None,
                                    max_seqlen_k: Optional[int] = None, causal: bool = False,
                                    softmax_scale: Optional[float] = None, window_size: Tuple[int, int] = (-1, -1),
                                    softcap: float = 0.0, alibi_slopes: Optional[Array] = None,
                                    deterministic: bool = False, precision: str = "highest",
                                    sinks: Optional[Array] = None, dropout_p: float = 0.0,
                                    dropout_seed: Optional[int] = None, dropout_offset: int = 0,
                                    score_mod: Optional[Callable] = None,
                                    score_mod_buffers: Optional[Sequence[Array]] = None) -> Grads:
    """Gradients of :func:`flash_attention_varlen` with respect to q, k and v (and the sinks).

    Parameters
    ----------
    dout : array, shape (total_q, heads, headdim_v), dtype of q
        Gradient of the loss with respect to ``out``.{varlen_shapes}
    out, lse : arrays returned by ``flash_attention_varlen(..., return_lse=True)`` with the same
        arguments; lse has shape (heads, total_q).{mask}{deterministic}{precision}{training}{score_mod}
        The sinks and the three dropout arguments must be those of the forward call.

    Returns
    -------
    dq, dk, dv : arrays with the shapes and dtype of q, k and v
    dsinks : float32 array, shape (heads,)
        Only with ``sinks``, as in :func:`flash_attention_backward`.
    dbuffers : tuple
        Only with ``score_mod_buffers``, as in :func:`flash_attention_backward`.
    """
    drop = _planned_dropout(dropout_p, dropout_seed, dropout_offset)
    undropped = _undropped(drop, dropout_p, dropout_seed, dropout_offset)
    if _plain(sinks, *undropped, score_mod=score_mod):
        key = _keys.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    causal, softmax_scale, window_size, softcap, alibi_slopes, deterministic, precision)
    elif _fused_extras(sinks, *undropped, score_mod=score_mod):
        key = _keys.with_extras(_keys.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                                      max_seqlen_k, causal, softmax_scale, window_size, softcap,
                                                      alibi_slopes, deterministic, precision), sinks)
    else:
        key = None
    key = _keys.with_dropout(key, drop)
    plan = PLANS.get(key)
    if plan is not None:
        scalars = () if drop is None else plan.dropout_scalars(dropout_seed, dropout_offset)
        if sinks is None:
            return plan.run(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, None, scalars=scalars)
        return _planned_results(plan.run(dout, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, None, sinks,
                                         scalars=scalars), sinks, True)
    dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = _problem.arrays(
        dout=dout, q=q, k=k, v=v, out=out, lse=lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k
    )
    p = _problem.varlen_backward_problem(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                         max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal,
                                         softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                                         alibi_slopes=alibi_slopes, precision=precision, sinks=sinks,
                                         dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_offset=dropout_offset,
        score_mod=score_mod, score_mod_buffers=score_mod_buffers)
    return _backward(key, p, dout, q, k, v, out, lse, deterministic, alibi_slopes, cu_seqlens_q, cu_seqlens_k)


def flash_attention_varlen_vjp(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, *,
                               max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                               causal: bool = False, softmax_scale: Optional[float] = None,
                               window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                               alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                               precision: str = "highest", sinks: Optional[Array] = None, dropout_p: float = 0.0,
                               dropout_seed: Optional[int] = None,
                               dropout_offset: int = 0,
                               score_mod: Optional[Callable] = None,
                               score_mod_buffers: Optional[Sequence[Array]] = None) -> Tuple[Array, Callable[[Array], Grads]]:
    """Packed forward pass and a function that maps ``dout`` to ``(dq, dk, dv)`` (and ``dsinks``).

    Parameters
    ----------{varlen_shapes}{mask}{deterministic}{precision}{training}{score_mod}

    Returns
    -------
    out : array, shape (total_q, heads, headdim_v)
    vjp : callable
        ``vjp(dout) -> (dq, dk, dv)``, or ``(dq, dk, dv, dsinks)`` with ``sinks``, and the buffers' gradients last with
        ``score_mod_buffers``; keeps the inputs, out and
        lse alive until it is released.
    """
    _problem.refuse_fp8_backward(q)
    deterministic = _problem.check_flag("deterministic", deterministic)
    options = {"max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k, "causal": causal, "softmax_scale": softmax_scale,
               "window_size": window_size, "softcap": softcap, "alibi_slopes": alibi_slopes, "precision": precision,
               "sinks": sinks, "dropout_p": dropout_p, "dropout_seed": dropout_seed, "dropout_offset": dropout_offset,
               "score_mod": score_mod, "score_mod_buffers": score_mod_buffers}
    out, lse = flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, return_lse=True, **options)

    def vjp(dout):
        return flash_attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                               deterministic=deterministic, **options)

    return out, vjp


_DOCS = {
    "{shapes}": _SHAPES_DOC,
    "{varlen_shapes}": _VARLEN_SHAPES_DOC,
    "{mask}": _MASK_DOC,
    "{block_mask}": _BLOCK_MASK_DOC,
    "{lse}": _LSE_DOC,
    "{deterministic}": _DETERMINISTIC_DOC,
    "{precision}": _PRECISION_DOC,
    "{training}": _TRAINING_DOC,
    "{score_mod}": _SCORE_MOD_DOC,
    "{max_score}": _MAX_SCORE_DOC,
    "{fp8}": _FP8_DOC,
    "{notes}": _NOTES_DOC,
}
for _function in (flash_attention, flash_attention_backward, flash_attention_vjp, flash_attention_varlen,
                  flash_attention_varlen_backward, flash_attention_varlen_vjp):
    for _key, _text in _DOCS.items():
        _function.__doc__ = _function.__doc__.replace(_key, _text)



_MERGE_DOC = """
    The parts must hold attention of the same queries over disjoint sets of keys (a split of the keys,
    a cached prefix and the new tokens, the steps of a ring); the result is then the attention over the
    union, as if computed at once. Per row, with ``lse_i`` the log-sum-exp each part returned::

        lse = ln(sum_i exp(lse_i))        out = sum_i exp(lse_i - lse) * out_i

    evaluated shifted by the row's largest ``lse_i``, so nothing overflows. A part whose row saw no key
    (``lse_i = -inf``, ``out_i = 0``) has weight 0; when no part's row saw a key, the merged row is
    ``out = 0, lse = -inf``. A NaN ``lse_i`` makes the merged row NaN. Parts are in the layout that
    :func:`flash_attention` returns (out (batch, seqlen_q, heads, headdim_v), lse (batch, heads,
    seqlen_q)) or that :func:`flash_attention_varlen` returns (out (total_q, heads, headdim_v), lse
    (heads, total_q))."""

_MERGE_RETURNS_DOC = """
    Returns
    -------
    out : array of the parts' kind, dtype and layout
    lse : array, float32 for float16/bfloat16 parts, float64 for float32 and float64 ones

    Notes
    -----
    The merge runs in the precision of the returned lse. CuPy arrays are merged by one kernel per 16
    parts (kernels_cu/common/merge.cu) on the current stream, without synchronizing with the host; NumPy arrays on the CPU."""


def merge_attention_states(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> Tuple[Array, Array]:
    """Attention over the union of two disjoint key sets, from the attention over each.
    {merge}

    Parameters
    ----------
    out_a, out_b : cupy.ndarray or numpy.ndarray of one shape and dtype (float16, bfloat16, float32 or
        float64)
    lse_a, lse_b : arrays of the same kind, float32 or float64: the log-sum-exp of out_a and out_b
    {merge_returns}
    """
    key = _keys.merge((out_a, lse_a, out_b, lse_b))
    plan = PLANS.get(key)
    if plan is not None:
        return plan.run(out_a, lse_a, out_b, lse_b)
    out_a, lse_a, out_b, lse_b = _problem.arrays(out_a=out_a, lse_a=lse_a, out_b=out_b, lse_b=lse_b)
    xp, packed = _problem.merge_parts({"out_a": out_a, "out_b": out_b}, {"lse_a": lse_a, "lse_b": lse_b})
    if key is None or xp is numpy or lse_a.size == 0:  # (no rows: no launch, no graph)
        return _merge.merge(xp, [out_a, out_b], [lse_a, lse_b], packed)
    from ._families import common

    plan = common.merge_plan([out_a, out_b], [lse_a, lse_b], packed)
    PLANS.put(key, plan)
    return plan.run(out_a, lse_a, out_b, lse_b)


def merge_attention_states_stacked(out: Array, lse: Array, *, packed: bool = False) -> Tuple[Array, Array]:
    """Attention over the union of n disjoint key sets, from the attention over each, stacked.
    {merge}

    Parameters
    ----------
    out : cupy.ndarray or numpy.ndarray, n >= 1 parts stacked along a new first axis
        (float16, bfloat16, float32 or float64): shape (n, batch, seqlen_q, heads, headdim_v), or with
        ``packed=True`` (n, total_q, heads, headdim_v)
    lse : array of the same kind, float32 or float64: each part's log-sum-exp, shape (n, batch, heads,
        seqlen_q), or with ``packed=True`` (n, heads, total_q)
    packed : bool, keyword-only
        The parts are in the packed (varlen) layout. It must be said: a 4-dimensional ``out`` is either
        packed parts or, by mistake, one unstacked (batch, seqlen_q, heads, headdim_v) result whose batch
        entries would be merged as parts; so without ``packed=True`` it is refused.
    {merge_returns}
    """
    key = _keys.merge((out, lse), packed)
    plan = PLANS.get(key)
    if plan is not None:
        return plan.run(out, lse)
    out, lse = _problem.arrays(out=out, lse=lse)
    packed = _problem.check_flag("packed", packed)
    xp, parts = _problem.merge_stacked(out, lse, packed)
    if key is None or xp is numpy or lse.size == 0:  # (no rows: no launch, no graph)
        return _merge.merge(xp, [out[i] for i in range(parts)], [lse[i] for i in range(parts)], packed)
    from ._families import common

    plan = common.merge_stacked_plan(out, lse, parts, packed)
    PLANS.put(key, plan)
    return plan.run(out, lse)


for _function in (merge_attention_states, merge_attention_states_stacked):
    _function.__doc__ = _function.__doc__.replace("{merge}", _MERGE_DOC).replace("{merge_returns}", _MERGE_RETURNS_DOC)


def flash_attention_with_kvcache(q: Array, k_cache: Array, v_cache: Array, *, k: Optional[Array] = None,
                                 v: Optional[Array] = None, cache_seqlens: Union[int, Array, None] = None,
                                 cache_batch_idx: Optional[Array] = None, block_table: Optional[Array] = None,
                                 rotary_cos: Optional[Array] = None, rotary_sin: Optional[Array] = None,
                                 rotary_interleaved: bool = True, causal: bool = False,
                                 window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                 alibi_slopes: Optional[Array] = None, softmax_scale: Optional[float] = None,
                                 num_splits: int = 0, return_lse: bool = False,
                                 precision: str = "highest", sinks: Optional[Array] = None,
                                 return_max_score: bool = False, score_mod: Optional[Callable] = None,
                                 score_mod_buffers: Optional[Sequence[Array]] = None,
                                 cache_leftpad: Optional[Array] = None, q_descale: Optional[Array] = None,
                                 k_descale: Optional[Array] = None, v_descale: Optional[Array] = None,
                                 out_dtype=None) -> Union[Array, Tuple[Array, ...]]:
    """Attention of new queries to a KV cache, after appending new keys and values to it
    (FlashAttention-2's ``flash_attn_with_kvcache``): decoding, chunked prefill, speculative
    verification.

    Batch entry ``b`` attends to the first ``cache_seqlens[b] + seqlen_new`` keys of its cache: those
    already there and, when ``k`` and ``v`` are given, its ``seqlen_new`` new ones, which are first
    written **into the caches in place** at positions ``cache_seqlens[b], cache_seqlens[b] + 1, ...``.
    Masks, windows and ALiBi distances are aligned to the bottom-right corner of each entry's
    ``seqlen_q`` x ``cache_seqlens[b] + seqlen_new`` score matrix, as in :func:`flash_attention`.

    Parameters
    ----------
    q : cupy.ndarray or numpy.ndarray, shape (batch, seqlen_q, heads, headdim)
        float16, bfloat16, float32 or float64. One token per sequence (decoding) or a chunk.
    k_cache, v_cache : arrays of q's kind and dtype, with a contiguous last axis
        Dense: (batch_cache, cache_len, heads_k, headdim) and (..., headdim_v), entry ``b`` (or
        ``cache_batch_idx[b]``) serving batch entry ``b``. Paged (with ``block_table``): (num_pages,
        page_size, heads_k, headdim), any page size from 1. heads must be a multiple of heads_k (GQA);
        the query heads that share a kv head are computed together, so the cache is read once. With
        ``k`` and ``v`` both caches are written, so both must be writable: a read-only NumPy cache
        raises ValueError before anything is written.
    k, v : arrays, shape (batch, seqlen_new, heads_k, headdim) and (..., headdim_v), keyword-only
        New keys and values to append, or None.
    cache_seqlens : int, int32 array of shape (batch,), or None, keyword-only
        Keys already in each entry's cache; None: the cache is full (capacity - seqlen_new).
    cache_batch_idx : int32 array, shape (batch,), or None, keyword-only
        Dense caches only: the cache entry of each batch entry.
    cache_leftpad : int32 array, shape (batch,), or None, keyword-only
        Dense caches only (FlashAttention-2's left-padded caches): batch entry ``b``'s keys start at
        position ``cache_leftpad[b]`` (``0 <= cache_leftpad[b] <= cache_seqlens[b]``): it attends to
        positions ``cache_leftpad[b]`` up to ``cache_seqlens[b] + seqlen_new``, and its masks and ALiBi
        distances count keys from ``cache_leftpad[b]``. New keys are still written at
        ``cache_seqlens[b]`` and rotary positions stay absolute. Not with a score_mod (NotImplementedError).
    q_descale, k_descale, v_descale, out_dtype : keyword-only
        float8_e4m3fn q, caches and new keys and values (an e4m3 cache), as in :func:`flash_attention`:
        the descales (batch, heads_k) per batch entry and kv head (q_descale also (batch, heads)); new
        tokens share their cache's; not with rotary or a score_mod. On CuPy arrays the e4m3 decode kernel
        (compute capability 9.0, head dims up to 256, a paged cache or at most 64 query rows per kv head,
        no softcap; NotImplementedError otherwise).
    block_table : int32 array, shape (batch, max_pages), or None, keyword-only
        A paged cache: position ``t`` of batch entry ``b`` is row ``t % page_size`` of page
        ``block_table[b, t // page_size]``. Capacity is ``max_pages * page_size``.
    rotary_cos, rotary_sin : arrays of q's dtype, shape (max_position, rotary_dim / 2), keyword-only
        Rotary embedding, with ``k`` only (max_position at least the capacity, and with ``causal`` or a
        window at least capacity - seqlen_new + seqlen_q, the last query's position): new key ``i`` is
        rotated at position ``cache_seqlens[b] + i`` before it is stored; the queries at
        ``cache_seqlens[b] + i`` with ``causal`` or a window, else all at ``cache_seqlens[b]``
        (FlashAttention-2's convention). See :func:`cupyflash.reference.apply_rotary`.
    rotary_interleaved : bool, keyword-only
        True: pairs of columns (0, 1), (2, 3), ...; False (GPT-NeoX): (c, c + rotary_dim / 2).
    causal, window_size, softcap, alibi_slopes, softmax_scale : keyword-only
        As in :func:`flash_attention`.
    num_splits : int, keyword-only
        Parts the keys of each entry are cut into and computed in parallel, then merged (flash
        decoding), for the decode kernel; 0 picks a count from the device's SMs, the batch, the heads
        and the cache length. At most 256.
    return_lse : bool, keyword-only
        Also return the log-sum-exp (see :func:`flash_attention`).
    precision : {"highest", "tf32"}, keyword-only
        As in :func:`flash_attention` (the forward families run float32 caches).
    sinks : float32 array of q's kind, shape (heads,), or None, keyword-only
        Attention sinks, as in :func:`flash_attention` (the lse returned includes them).
    return_max_score : bool, keyword-only
        Also return each batch entry's and query head's largest score, as in :func:`flash_attention`.
    score_mod, score_mod_buffers : keyword-only
        A score function and its buffers, as in :func:`flash_attention` (a custom bias while decoding):
        ``b`` is the batch entry, ``q_idx`` the query's row in ``q`` and ``kv_idx`` the key's position in
        the entry's cache (a decoding query at cache position ``cache_seqlens[b] + seqlen_new - 1``
        gets ``q_idx`` 0: pass ``cache_seqlens`` as a buffer to read positions).

    Returns
    -------
    out : array of q's kind and dtype (out_dtype for an e4m3 cache), shape (batch, seqlen_q, heads, headdim_v)
    lse : array, shape (batch, heads, seqlen_q)
        Only with ``return_lse=True``.
    max_score : float32 array, shape (batch, heads)
        Only with ``return_max_score=True``, after lse when both are asked for.

    Notes
    -----
    Out-of-range values: a NumPy call, or a CuPy call with ``cache_seqlens`` given as an int, raises
    ValueError when ``cache_seqlens`` plus ``seqlen_new`` exceeds the capacity or ``cache_batch_idx`` /
    ``block_table`` name entries or pages outside the cache. A CuPy call never copies those arrays to
    the host (it does not synchronize, and can be captured in a CUDA graph) unless ``CUPYFLASH_CHECK=1``
    is set (then it raises as a NumPy call does): it checks them on the device instead, and a batch
    entry with an out-of-range value gets NaN in all its output rows and lse, while no read or write
    leaves the caches: an entry whose cache_seqlens or cache_batch_idx is
    out of range writes nothing, and a new token whose page is out of range is not written.

    Batch entries must not share the cache rows that new tokens go to: a CuPy call may write an
    entry's new tokens while another entry reads the same rows (repeated ``cache_batch_idx`` values,
    pages in two block-table rows), as FlashAttention's own kernel does; NumPy calls, and CuPy calls in
    the checked mode, raise ValueError instead. Shared rows that only hold cached keys (a common
    prefix) are fine.

    CuPy calls run on the current stream with no allocation outside CuPy's memory pool. Keep the
    returned arrays referenced while a captured graph that wrote them may replay.
    """
    return _kvcache.attention(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos,
                              rotary_sin, rotary_interleaved, causal, window_size, softcap, alibi_slopes, softmax_scale,
                              num_splits, return_lse, precision, sinks, return_max_score, score_mod, score_mod_buffers,
                              cache_leftpad, q_descale, k_descale, v_descale, out_dtype)


_RING_DOC = """
    q, k, v : this rank's shard: (batch, seqlen / world, heads, headdim), (batch, seqlen / world, heads_k,
        headdim) and (..., headdim_v), NumPy or CuPy arrays as for :func:`flash_attention`. Every rank's
        shards have the same shapes.
    comm : cupy.cuda.nccl.NcclCommunicator or cupyflash.VirtualRing
        The ring: rank ``comm.rank_id()`` of ``comm.size()`` (CuPy arrays on the communicator's GPU, which
        must be the current device), or one rank of a :class:`cupyflash.VirtualRing` (ranks as threads of
        one process). Blocks go to rank + 1 and come from rank - 1. Every rank must make the same ring
        calls, in the same order, with the same options (``causal``, ``window_size``, ``layout``,
        ``softmax_scale``, ``precision``, ``sinks``), dtype and shard shapes. A VirtualRing rank checks this at the
        start of every call (ValueError naming the ranks and the values that differ), and a rank that
        waits for a block that cannot come raises instead of hanging (see :class:`cupyflash.VirtualRing`).
        An NCCL ring is not checked: that would take a collective and a host synchronization in every
        call. There a mismatch gives wrong results, an NCCL error or a hang.
    causal : bool, keyword-only
        Causal over the global sequence. Needs ``layout``.
    softmax_scale : float or None, keyword-only
        As in :func:`flash_attention`.
    window_size : (int, int), keyword-only
        Sliding window over the global sequence, as in :func:`flash_attention` (query i sees key j iff
        ``i - left <= j <= i + right``, -1 unbounded). Needs ``layout``. The ring stops after the last
        step that brings a visible block to some rank: with ``layout="contiguous"`` and a window that
        reaches less than a shard back and none forward (``left >= 0`` with ``right = 0`` or
        ``causal``), after one step (the previous rank's block) instead of world - 1. (Blocks ahead of a
        shard, and a zigzag shard's neighbours, arrive last: every step.)
    layout : "zigzag", "contiguous" or None, keyword-only
        How the global sequence is sharded, for a causal or windowed ring: "zigzag" (rank r holds
        chunks r and 2 * world - 1 - r of 2 * world, see :func:`cupyflash.zigzag_shard`: every rank
        does the same causal work) or "contiguous" (rank r holds chunk r of world). Both need the
        same number of query and key rows on a rank. Checked always, used only with a mask.
    precision : {"highest", "tf32"}, keyword-only
        As in :func:`flash_attention`, for each step's calls.
    sinks : float32 array of q's kind, shape (heads,), or None, keyword-only
        Attention sinks, as in :func:`flash_attention`: the same on every rank. They join each row's
        softmax once, after the blocks are merged; the backward returns their gradient summed over every
        rank's rows (the same bits on every rank)."""


def ring_flash_attention(q: Array, k: Array, v: Array, comm: Union[VirtualRing, cupy.cuda.nccl.NcclCommunicator], *,
                         causal: bool = False, softmax_scale: Optional[float] = None,
                         window_size: Tuple[int, int] = (-1, -1), layout: Optional[str] = None,
                         return_lse: bool = False, precision: str = "highest",
                         sinks: Optional[Array] = None) -> Union[Array, Tuple[Array, Array]]:
    """Attention over a sequence sharded across the ranks of a ring (ring attention): each rank's
    queries attend to every rank's keys and values as the K/V blocks pass around the ring, the partial
    results merged by their log-sum-exp. No rank holds more than its shard and two blocks.

    Parameters
    ----------{ring}
    return_lse : bool, keyword-only
        Also return the log-sum-exp (over the global keys) needed by the backward.

    Returns
    -------
    out : array, this rank's rows (batch, seqlen / world, heads, headdim_v)
    lse : array, (batch, heads, seqlen / world); only with ``return_lse=True``
        Equal, within rounding, to the rows of :func:`flash_attention` on the unsharded sequence.
    """
    return_lse = _problem.check_flag("return_lse", return_lse)
    out, lse, _ = _ring_forward_call(q, k, v, comm, causal, softmax_scale, window_size, layout, precision, sinks)
    return (out, lse) if return_lse else out


def _ring_forward_call(q, k, v, comm, causal, softmax_scale, window_size, layout, precision, sinks):
    """ring_flash_attention's checks and forward: (out, lse, the K/V block the walk ended on)."""
    if getattr(q, "dtype", None) == _problem.FP8_DTYPE:
        raise TypeError("ring attention takes no float8_e4m3fn inputs (no descales cross the ring): run it in bfloat16")
    q, k, v = _problem.arrays(q=q, k=k, v=v)
    p = _problem.forward_problem(q, k, v, softmax_scale=softmax_scale, precision=precision, sinks=sinks)
    _, ring, geometry = _ring._check("ring_flash_attention", {"q": q, "k": k, "v": v}, comm, causal, window_size,
                                      layout, p.softmax_scale, p.precision, p.sinks)
    return _ring.ring_forward(p, q, k, v, ring, geometry, keep_last=True)


def ring_flash_attention_backward(dout: Array, q: Array, k: Array, v: Array, out: Array, lse: Array,
                                  comm: Union[VirtualRing, cupy.cuda.nccl.NcclCommunicator], *, causal: bool = False,
                                  softmax_scale: Optional[float] = None, window_size: Tuple[int, int] = (-1, -1),
                                  layout: Optional[str] = None, deterministic: bool = False,
                                  precision: str = "highest", sinks: Optional[Array] = None) -> Grads:
    """Gradients of :func:`ring_flash_attention` for this rank's shard: dq of its queries, and dk, dv of
    its keys and values summed over every rank's queries (the accumulators travel with the blocks).

    Parameters
    ----------
    dout : array, this rank's rows of the gradient of the loss with respect to out
    q, k, v, comm, causal, softmax_scale, window_size, layout, precision, sinks
        As given to :func:`ring_flash_attention`.{ring_unused}
    out, lse : this rank's results of ``ring_flash_attention(..., return_lse=True)``
    deterministic : bool, keyword-only
        As in :func:`flash_attention_backward`; the ring's own sums run in a fixed order either way.

    Returns
    -------
    dq, dk, dv : arrays with the shapes and dtype of this rank's q, k and v
    dsinks : float32 array, shape (heads,)
        Only with ``sinks``: summed over every rank's rows, the same on every rank.
    """
    return _ring_backward_call(dout, q, k, v, out, lse, comm, causal, softmax_scale, window_size, layout,
                               deterministic, precision, sinks)


def _ring_backward_call(dout, q, k, v, out, lse, comm, causal, softmax_scale, window_size, layout, deterministic,
                        precision, sinks, start=None):
    """ring_flash_attention_backward's checks and backward; ``start``: the vjp's K/V block in hand, where
    the walk back begins (_ring.ring_backward)."""
    dout, q, k, v, out, lse = _problem.arrays(dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    p = _problem.backward_problem(dout, q, k, v, out, lse, softmax_scale=softmax_scale, precision=precision,
                                  sinks=sinks)
    _, ring, geometry = _ring._check("ring_flash_attention_backward",
                                      {"dout": dout, "q": q, "k": k, "v": v, "out": out, "lse": lse}, comm, causal,
                                      window_size, layout, p.softmax_scale, p.precision, p.sinks)
    deterministic = _problem.check_flag("deterministic", deterministic)
    lse = lse.astype(_problem.lse_dtype(p.dtype), copy=False)
    return _ring.ring_backward(p, dout, q, k, v, out, lse, ring, geometry, deterministic, start)


def ring_flash_attention_vjp(q: Array, k: Array, v: Array, comm: Union[VirtualRing, cupy.cuda.nccl.NcclCommunicator],
                             *, causal: bool = False, softmax_scale: Optional[float] = None,
                             window_size: Tuple[int, int] = (-1, -1), layout: Optional[str] = None,
                             deterministic: bool = False, precision: str = "highest",
                             sinks: Optional[Array] = None) -> Tuple[Array, Callable[[Array], Grads]]:
    """:func:`ring_flash_attention` and a function that maps this rank's ``dout`` to its ``(dq, dk, dv)``
    (a ring call too: every rank must make it).

    Parameters
    ----------{ring}
    deterministic : bool, keyword-only
        As in :func:`flash_attention_backward`.

    Returns
    -------
    out : array, this rank's rows
    vjp : callable
        ``vjp(dout) -> (dq, dk, dv)`` of this rank's shard (:func:`ring_flash_attention_backward`), and
        dsinks after them with ``sinks``.
    """
    out, lse, last = _ring_forward_call(q, k, v, comm, causal, softmax_scale, window_size, layout, precision, sinks)

    def vjp(dout):
        # The walk back starts on the K/V block the forward ended on: no transfer before its first block,
        # and no trip home for the dK/dV sums at its end.
        return _ring_backward_call(dout, q, k, v, out, lse, comm, causal, softmax_scale, window_size, layout,
                                   deterministic, precision, sinks, start=last)

    return out, vjp


for _function in (ring_flash_attention, ring_flash_attention_backward, ring_flash_attention_vjp):
    _function.__doc__ = _function.__doc__.replace("{ring}", _RING_DOC).replace("{ring_unused}", "")


def apply_rotary(x: Array, cos: Array, sin: Array, *, interleaved: bool = False, seqlen_offsets: Union[int, Array] = 0,
                 cu_seqlens: Optional[Array] = None, max_seqlen: Optional[int] = None, conjugate: bool = False,
                 inplace: bool = False) -> Array:
    """Rotary position embedding (RoPE) for training, FlashAttention's ``apply_rotary_emb``.

    Row t of each sequence sits at position ``p = seqlen_offsets[b] + t``; each pair (a, b) of its first
    ``rotary_dim = 2 * cos.shape[1]`` columns becomes ``(a cos[p, c] - b sin[p, c], a sin[p, c] + b cos[p,
    c])``, the columns from rotary_dim on pass through. The arithmetic runs in float32 (float64 for
    float64 x) and rounds once to x's dtype.

    Parameters
    ----------
    x : cupy.ndarray or numpy.ndarray, shape (batch, seqlen, heads, headdim)
        Or, with ``cu_seqlens``, packed sequences (total, heads, headdim). float16, bfloat16, float32 or
        float64.
    cos, sin : arrays of x's kind, shape (seqlen_rotary, rotary_dim / 2), x's dtype or float32
        Row p holds the cosines and sines of position p's angles; rotary_dim <= headdim.
    interleaved : bool, keyword-only
        False (GPT-NeoX, the default): pairs (c, c + rotary_dim / 2). True (GPT-J): pairs (2c, 2c + 1).
    seqlen_offsets : int, or int32 array of shape (batch,) of x's kind, keyword-only
        The position of each sequence's first row (a KV cache's length when rotating new tokens).
        Positions must stay below seqlen_rotary: ValueError for an int or NumPy offsets; CuPy offsets
        are not read on the host, and a row past the tables gets NaN in its rotated columns.
    cu_seqlens : int32 array of x's kind, shape (batch + 1,), or None, keyword-only
        Packed x: sequence b holds rows ``cu_seqlens[b]:cu_seqlens[b + 1]``, its positions counted from
        its first row.
    max_seqlen : int or None, keyword-only
        Packed x: the longest sequence. None reads cu_seqlens on the host (one device-to-host copy for
        CuPy), which also checks it.
    conjugate : bool, keyword-only
        Rotate by the opposite angles: the inverse rotation, which is also the gradient (``dx =
        apply_rotary(dy, cos, sin, conjugate=True, <the same keywords>)``).
    inplace : bool, keyword-only
        Write the result into x and return x.

    Returns
    -------
    array of x's kind, shape and dtype
        x rotated (x itself with ``inplace=True``).
    """
    from . import _rotary

    x, cos, sin = _problem.arrays(written=("x",) if _problem.check_flag("inplace", inplace) else (), x=x, cos=cos,
                                  sin=sin)
    r = _problem.rotary_problem(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets,
                                cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, conjugate=conjugate, inplace=inplace)
    return _rotary.apply(r, x, cos, sin)
