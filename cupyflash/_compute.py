"""The compute layer: attention of a validated problem (cupyflash._problem.Problem) on its arrays'
module, beneath every entry point: the public functions (cupyflash/_api.py), ring attention and the
KV-cache paths call it, and nothing here checks its inputs again. NumPy arrays run the tiled NumPy
twin (cupyflash/_numpy_impl.py), CuPy arrays the CUDA path (cupyflash/_cuda.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple, Union

import numpy

from . import _merge, _numpy_impl
from ._problem import Problem, lse_dtype

if TYPE_CHECKING:
    import cupy

    Array = Union[numpy.ndarray, cupy.ndarray]


def forward(p: Problem, q: Array, k: Array, v: Array, max_score: bool = False) -> Tuple[Array, ...]:
    """``(out, lse)`` of problem ``p`` for its operands q, k and v, and with ``max_score`` the largest
    score of each head, float32 (batch, heads).

    The CUDA forwards join the sinks to each row's sum in their epilogues (fragment/softmax.cuh's
    finish); the NumPy twin, and a problem with nothing to compute, merge them in afterwards as one more
    part (cupyflash/_merge.py's add_sinks, the same arithmetic)."""
    xp = p.xp
    if p.is_empty:
        results = xp.zeros(p.out_shape, dtype=p.output_dtype), xp.full(p.lse_shape, -numpy.inf, dtype=lse_dtype(p.dtype))
        if max_score:
            results += (xp.full((p.batch, p.heads), -numpy.inf, dtype=numpy.float32),)
    elif xp is numpy:
        results = _numpy_impl.forward(q, k, v, p, max_score=max_score)
    else:
        from . import _cuda

        return _cuda.forward(p, q, k, v, max_score=max_score)
    if p.sinks is not None:
        results = _merge.add_sinks(xp, results[0], results[1], p.sinks, p.varlen) + tuple(results[2:])
    return results


def backward(p: Problem, dout: Array, q: Array, k: Array, v: Array, out: Array, lse: Array,
             deterministic: bool) -> Tuple[Array, ...]:
    """``(dq, dk, dv)`` of problem ``p``, and ``dsinks`` after them when it has sinks; ``lse`` is float32
    or float64 (converted to the precision of the forward's). With score_mod buffers (``p.user_buffers``),
    the tuple of their gradients comes last (None for int and bool buffers).

    With sinks, ``lse`` already holds them, so the kernels' probabilities exp(s - lse) and delta =
    sum(dout * out) are those of the softmax with sinks, and dq, dk and dv need nothing more."""
    xp = p.xp
    buffer_grads = sink_terms = None
    if p.is_empty:
        grads = tuple(xp.zeros(x.shape, p.dtype) for x in (q, k, v))
    elif xp is numpy:
        grads = _numpy_impl.backward(dout, q, k, v, out, lse.astype(lse_dtype(p.dtype), copy=False), p)
        grads, buffer_grads = grads[:3], (grads[3] if len(grads) > 3 else None)
    else:
        from . import _cuda

        grads, sink_terms, buffer_grads = _cuda.backward(p, dout, q, k, v, out, lse, deterministic)
    grads = tuple(grads)
    if p.sinks is not None:
        # The GPU's bwd_delta writes the sinks' per-row terms beside delta; otherwise they are formed here.
        grads += (_merge.sink_gradient(xp, dout, out, lse, p.sinks, p.varlen) if sink_terms is None
                  else _merge.sink_gradient_from_terms(sink_terms, p.varlen),)
    if p.user_buffers is not None:
        grads += (_buffer_gradients(xp, p.user_buffers, buffer_grads),)
    return grads


def _buffer_gradients(xp, buffers, accumulated):
    """The score_mod buffers' gradients in their own dtypes: None for int and bool buffers, zeros for a
    problem with nothing to compute."""
    if accumulated is None:
        accumulated = [xp.zeros(b.shape, b.dtype) if b.dtype.kind == "f" else None for b in buffers]
    return tuple(None if g is None else g.astype(b.dtype) for g, b in zip(accumulated, buffers))


def plannable(p: Problem) -> bool:
    """Whether a call of problem ``p`` has a plan to keep: CuPy arrays and something to compute."""
    return p.xp is not numpy and not p.is_empty
