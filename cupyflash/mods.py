"""Functions for score_mod and mask_mod (cupyflash.flash_attention's ``score_mod=``,
:meth:`cupyflash.BlockMask.from_mask_mod`).

Inside a traced function they build the expression the kernels compile; on NumPy or CuPy arrays (and
Python numbers) they are the arrays' own functions, so the same function also runs eagerly, for
example to look at a mask. ``clip(x, lo, hi)`` is ``minimum(maximum(x, lo), hi)``; ``sigmoid(x)`` is
``1 / (1 + exp(-x))``; ``where(c, a, b)`` is the only conditional a traced function can have.
"""

from . import _trace

__all__ = [
    "abs", "ceil", "clip", "exp", "exp2", "floor", "log", "log2", "logical_and", "logical_not", "logical_or",
    "maximum", "minimum", "sigmoid", "sqrt", "tanh", "where",
]


def _xp(*xs):
    return _trace.module(xs)


def _traced(*xs):
    return any(isinstance(x, _trace.Expr) for x in xs)


def _unary(name, doc):
    def fn(x):
        if _traced(x):
            return _trace.unary(name, x)
        if name == "sigmoid":
            xp = _xp(x)
            return 1 / (1 + xp.exp(-xp.asarray(x)))
        return getattr(_xp(x), name)(x)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


exp = _unary("exp", "e ** x.")
exp2 = _unary("exp2", "2 ** x.")
log = _unary("log", "The natural logarithm.")
log2 = _unary("log2", "The base-2 logarithm.")
sqrt = _unary("sqrt", "The square root.")
tanh = _unary("tanh", "The hyperbolic tangent.")
sigmoid = _unary("sigmoid", "1 / (1 + exp(-x)).")
abs = _unary("abs", "The absolute value (d|x|/dx is sign(x), 0 at 0).")  # noqa: A001 - NumPy's name
floor = _unary("floor", "The largest integer not above x (the identity on ints; a float stays a float).")
ceil = _unary("ceil", "The smallest integer not below x (the identity on ints; a float stays a float).")


def where(condition, x, y):
    """x where ``condition`` holds, else y; only the branch taken counts for buffer bounds and gradients."""
    if _traced(condition, x, y):
        return _trace.select(condition, x, y)
    return _xp(condition, x, y).where(condition, x, y)


def minimum(x, y):
    """The smaller of x and y (NaN if either is NaN); on a tie the gradient goes to x."""
    if _traced(x, y):
        return _trace.extremum("minimum", x, y)
    return _xp(x, y).minimum(x, y)


def maximum(x, y):
    """The larger of x and y (NaN if either is NaN); on a tie the gradient goes to x."""
    if _traced(x, y):
        return _trace.extremum("maximum", x, y)
    return _xp(x, y).maximum(x, y)


def clip(x, lo, hi):
    """``minimum(maximum(x, lo), hi)``."""
    return minimum(maximum(x, lo), hi)


def logical_and(x, y):
    """x & y for bools."""
    return x & y


def logical_or(x, y):
    """x | y for bools."""
    return x | y


def logical_not(x):
    """~x for bools."""
    if _traced(x):
        if x.kind != _trace.BOOL:
            raise TypeError(f"logical_not takes a bool, got a traced {x.kind}")
        return ~x
    return _xp(x).logical_not(x)
