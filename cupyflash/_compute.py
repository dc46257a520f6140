"""The compute layer: attention of a validated problem (cupyflash._problem.Problem) on its arrays'
module, beneath every entry point: the public functions (cupyflash/_api.py), ring attention and the
KV-cache paths call it, and nothing here checks its inputs again. NumPy arrays run the tiled NumPy
twin (cupyflash/_numpy_impl.py), CuPy arrays the CUDA path (cupyflash/_cuda.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple, Union

import numpy

from . import _numpy_impl
from ._problem import Problem, lse_dtype

if TYPE_CHECKING:
    import cupy

    Array = Union[numpy.ndarray, cupy.ndarray]


def forward(p: Problem, q: Array, k: Array, v: Array) -> Tuple[Array, Array]:
    """``(out, lse)`` of problem ``p`` for its operands q, k and v."""
    if p.is_empty:
        xp = p.xp
        return xp.zeros(p.out_shape, dtype=p.dtype), xp.full(p.lse_shape, -numpy.inf, dtype=lse_dtype(p.dtype))
    if p.xp is numpy:
        return _numpy_impl.forward(q, k, v, p)
    from . import _cuda

    return _cuda.forward(p, q, k, v)


def backward(p: Problem, dout: Array, q: Array, k: Array, v: Array, out: Array, lse: Array,
             deterministic: bool) -> Tuple[Array, Array, Array]:
    """``(dq, dk, dv)`` of problem ``p``; ``lse`` is float32 or float64 (converted to the precision of the
    forward's)."""
    if p.is_empty:
        xp = p.xp
        return tuple(xp.zeros(x.shape, p.dtype) for x in (q, k, v))
    if p.xp is numpy:
        return _numpy_impl.backward(dout, q, k, v, out, lse.astype(lse_dtype(p.dtype), copy=False), p)
    from . import _cuda

    return _cuda.backward(p, dout, q, k, v, out, lse, deterministic)


def plannable(p: Problem) -> bool:
    """Whether a call of problem ``p`` has a plan to keep: CuPy arrays and something to compute."""
    return p.xp is not numpy and not p.is_empty
