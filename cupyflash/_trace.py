"""Score and mask functions written in Python, traced once into an expression.

A ``score_mod(score, b, h, q_idx, kv_idx, *buffers)`` or ``mask_mod(b, h, q_idx, kv_idx, *buffers)`` is
called once with symbolic arguments (:class:`Expr`); what it computes becomes a DAG of typed nodes,
hash-consed so that equal subexpressions are one node. The DAG is then

* evaluated elementwise on NumPy (or CuPy) arrays by :func:`evaluate` (the NumPy twin and
  :mod:`cupyflash.reference`),
* differentiated symbolically (:func:`Traced.gradients`: d(result)/d(score) and d(result)/d(each load of
  a floating-point buffer), themselves expressions), and
* written out as CUDA by :func:`cuda_source` for the kernels.

Its :attr:`Traced.key` names the expression, never the Python function, the buffers' values, shapes or
addresses: compiled variants are cached by it.

Semantics, the same on every path:

* Three kinds of value: bool, int (32-bit signed, wrapping) and float (the problem's compute precision:
  float64 for float64 inputs, else float32; Python float constants are rounded to it). Arithmetic promotes
  bool to int to float as Python does; ``/`` always gives a float; ``//`` and ``%`` round toward minus
  infinity (Python's rule), and an integer division by 0 gives 0. ``&``, ``|``, ``^``, ``~`` are logical on
  bools and bitwise on ints.
* ``x.astype(numpy.int32)`` truncates toward zero (NaN gives 0, out-of-range values saturate);
  ``astype(bool)`` is ``x != 0``; ``astype(float)`` (or float32, float64) converts to the compute float.
* A buffer is indexed by exactly one int per axis. An index outside the buffer makes the result NaN (the
  score; for a mask_mod, the pair stays visible with a NaN score), so an error is never silent. A load in
  the branch that :func:`mods.where <cupyflash.mods.where>` does not take does not count: guard indices
  with ``mods.where``.
* ``minimum``/``maximum`` propagate NaN, as NumPy's do.
"""

import math
import numbers

import numpy

#: Value kinds, in promotion order.
BOOL, INT, FLOAT = "bool", "int", "float"
_RANK = {BOOL: 0, INT: 1, FLOAT: 2}
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1

#: Buffer dtypes a function may index, and the kind each load gives.
BUFFER_KINDS = {
    numpy.dtype(numpy.float32): FLOAT,
    numpy.dtype(numpy.float64): FLOAT,
    numpy.dtype(numpy.int32): INT,
    numpy.dtype(numpy.bool_): BOOL,
}
#: Buffers per function and axes per buffer that the kernels' argument block holds.
MAX_BUFFERS = 8
MAX_RANK = 4

#: Elementwise functions of one float argument (cupyflash.mods): NumPy's (CuPy's) function of that name,
#: but sigmoid, 1 / (1 + exp(-x)).
_UNARY_FLOAT = ("exp", "exp2", "log", "log2", "sqrt", "tanh", "sigmoid")


class _Context:
    """The trace in progress: the table that hash-conses its nodes."""

    def __init__(self):
        self.nodes = {}

    def node(self, op, args, kind, value=None):
        key = (op, tuple(id(a) for a in args), kind, _const_key(value))
        found = self.nodes.get(key)
        if found is None:
            found = Expr(self, op, args, kind, value)
            self.nodes[key] = found
        return found


def _const_key(value):
    # 1, 1.0 and True are equal in Python; -0.0 and 0.0 too. repr tells them apart.
    return (type(value).__name__, repr(value)) if isinstance(value, (bool, int, float)) else value


def _describe(x):
    return f"{type(x).__module__}.{type(x).__qualname__}" if not isinstance(x, Expr) else f"a traced {x.kind}"


_NOT_A_NUMBER = ("a traced value cannot become a Python float: math and NumPy functions cannot be traced; use the "
                 "functions of cupyflash.mods")


class Expr:
    """A traced value: the operators and :mod:`cupyflash.mods` build the expression; anything that needs
    its value now (``if``, ``bool()``, ``float()``, NumPy or ``math`` functions) is a TypeError."""

    __slots__ = ("ctx", "op", "args", "kind", "value")
    __array_ufunc__ = None  # NumPy hands binary operators back to Expr and refuses its ufuncs on it

    def __init__(self, ctx, op, args, kind, value=None):
        self.ctx, self.op, self.args, self.kind, self.value = ctx, op, args, kind, value

    def __repr__(self):
        return f"<traced {self.kind} {self.op}>"

    # What cannot be traced.
    def __bool__(self):
        raise TypeError("a traced value has no truth value at trace time: Python control flow (if, while, and, "
                        "or, not, chained comparisons) cannot depend on it; use mods.where, &, | and ~")

    def __float__(self):
        raise TypeError(_NOT_A_NUMBER)

    __int__ = __index__ = __complex__ = __float__

    def __iter__(self):
        raise TypeError("a traced value is a scalar: it cannot be iterated")

    def __len__(self):
        raise TypeError("a traced value is a scalar: it has no len()")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)  # protocols probed by Python and NumPy (__array__, __deepcopy__...)
        raise TypeError(f"a traced value has no attribute {name!r} (it supports arithmetic, comparisons, astype "
                        "and the functions of cupyflash.mods)")

    def __hash__(self):
        return id(self)

    def astype(self, dtype):
        """Converts to int (numpy.int32: truncation toward zero), bool (``!= 0``) or float."""
        if dtype is float:
            return convert(self, FLOAT)
        if dtype is int:
            return convert(self, INT)
        if dtype is bool:
            return convert(self, BOOL)
        try:
            dt = numpy.dtype(dtype)
        except TypeError:
            dt = None
        if dt in (numpy.float32, numpy.float64):
            return convert(self, FLOAT)
        if dt == numpy.int32:
            return convert(self, INT)
        if dt == numpy.bool_:
            return convert(self, BOOL)
        raise TypeError(f"astype takes numpy.int32, bool or a float dtype (float, numpy.float32, numpy.float64), "
                        f"got {dtype!r}")

    # Arithmetic.
    def __add__(self, other):
        return arithmetic("add", self, other)

    def __radd__(self, other):
        return arithmetic("add", other, self)

    def __sub__(self, other):
        return arithmetic("sub", self, other)

    def __rsub__(self, other):
        return arithmetic("sub", other, self)

    def __mul__(self, other):
        return arithmetic("mul", self, other)

    def __rmul__(self, other):
        return arithmetic("mul", other, self)

    def __truediv__(self, other):
        return arithmetic("truediv", self, other)

    def __rtruediv__(self, other):
        return arithmetic("truediv", other, self)

    def __floordiv__(self, other):
        return arithmetic("floordiv", self, other)

    def __rfloordiv__(self, other):
        return arithmetic("floordiv", other, self)

    def __mod__(self, other):
        return arithmetic("mod", self, other)

    def __rmod__(self, other):
        return arithmetic("mod", other, self)

    def __pow__(self, other):
        return power(self, other)

    def __rpow__(self, other):
        raise TypeError("only a Python number can be an exponent: write mods.exp2(x * mods.log2(base)) for "
                        "base ** x")

    def __neg__(self):
        x = convert(self, INT) if self.kind == BOOL else self
        return self.ctx.node("neg", (x,), x.kind)

    def __pos__(self):
        return convert(self, INT) if self.kind == BOOL else self

    def __abs__(self):
        return unary("abs", self)

    # Comparisons.
    def __eq__(self, other):
        return compare("eq", self, other)

    def __ne__(self, other):
        return compare("ne", self, other)

    def __lt__(self, other):
        return compare("lt", self, other)

    def __le__(self, other):
        return compare("le", self, other)

    def __gt__(self, other):
        return compare("gt", self, other)

    def __ge__(self, other):
        return compare("ge", self, other)

    # Logic (bools) and bits (ints).
    def __and__(self, other):
        return bitwise("and", self, other)

    __rand__ = __and__

    def __or__(self, other):
        return bitwise("or", self, other)

    __ror__ = __or__

    def __xor__(self, other):
        return bitwise("xor", self, other)

    __rxor__ = __xor__

    def __invert__(self):
        if self.kind == FLOAT:
            raise TypeError("~ takes a bool or an int, got a traced float")
        return self.ctx.node("invert", (self,), self.kind)


def lift(ctx, x, what="an operand"):
    """``x`` as a node of trace ``ctx``: an Expr of this trace, or a Python (or NumPy scalar) number."""
    if isinstance(x, Expr):
        if x.ctx is not ctx:
            raise TypeError("a traced value of another function's trace cannot be used here")
        return x
    if isinstance(x, (bool, numpy.bool_)):
        return ctx.node("const", (), BOOL, bool(x))
    if isinstance(x, numbers.Integral):
        if not _INT_MIN <= int(x) <= _INT_MAX:
            raise ValueError(f"integer constant {int(x)} does not fit the 32-bit ints score functions compute with")
        return ctx.node("const", (), INT, int(x))
    if isinstance(x, numbers.Real):
        return ctx.node("const", (), FLOAT, float(x))
    raise TypeError(f"{what} of a score or mask function must be a traced value or a Python number, got "
                    f"{_describe(x)} (pass arrays as buffers and index them)")


def _context(*xs):
    for x in xs:
        if isinstance(x, Expr):
            return x.ctx
    return None


def convert(x, kind):
    """``x`` converted to ``kind`` (a node of its own unless it already has that kind)."""
    if x.kind == kind:
        return x
    if x.op == "const":
        value = {BOOL: bool, INT: _to_int_scalar, FLOAT: float}[kind](x.value)
        return x.ctx.node("const", (), kind, value)
    return x.ctx.node("to_" + kind, (x,), kind)


def _to_int_scalar(v):
    if isinstance(v, float):
        if math.isnan(v):
            return 0
        return int(min(max(math.trunc(v), _INT_MIN), _INT_MAX)) if math.isfinite(v) else (_INT_MAX if v > 0 else _INT_MIN)
    return int(v)


def _promote(ctx, a, b, floor=INT):
    """Both operands at their common kind, at least ``floor``."""
    kind = max((a.kind, b.kind, floor), key=_RANK.__getitem__)
    return convert(a, kind), convert(b, kind), kind


def arithmetic(op, a, b):
    ctx = _context(a, b)
    a, b = lift(ctx, a), lift(ctx, b)
    if op == "truediv":
        a, b, kind = _promote(ctx, a, b, FLOAT)
    else:
        a, b, kind = _promote(ctx, a, b)
    return ctx.node(op, (a, b), kind)


def power(base, exponent):
    ctx = base.ctx
    if isinstance(exponent, Expr) or not isinstance(exponent, numbers.Real) or isinstance(exponent, bool):
        raise TypeError(f"the exponent of ** must be a Python number, got {_describe(exponent)}: write "
                        "mods.exp2(y * mods.log2(x)) for x ** y")
    if isinstance(exponent, numbers.Integral) and 0 <= int(exponent) <= 8:
        # Small integer powers are products, exact for ints and as rounded as x * x ... for floats.
        x = convert(base, INT) if base.kind == BOOL else base
        result = lift(ctx, 1 if x.kind == INT else 1.0)
        for _ in range(int(exponent)):
            result = x if result.op == "const" and result.value == 1 else arithmetic("mul", result, x)
        return result
    return ctx.node("pow", (convert(base, FLOAT),), FLOAT, float(exponent))


def compare(op, a, b):
    ctx = _context(a, b)
    a, b = lift(ctx, a), lift(ctx, b)
    a, b, _ = _promote(ctx, a, b, BOOL if op in ("eq", "ne") else INT)
    return ctx.node(op, (a, b), BOOL)


def bitwise(op, a, b):
    ctx = _context(a, b)
    a, b = lift(ctx, a), lift(ctx, b)
    if FLOAT in (a.kind, b.kind):
        raise TypeError(f"{ {'and': '&', 'or': '|', 'xor': '^'}[op]} takes bools or ints, got a float operand")
    a, b, kind = _promote(ctx, a, b, BOOL)
    return ctx.node(op, (a, b), kind)


def unary(op, x):
    """``op`` (abs, floor, ceil, or one of _UNARY_FLOAT) of the traced ``x``."""
    if op in _UNARY_FLOAT:
        return x.ctx.node(op, (convert(x, FLOAT),), FLOAT)
    if op == "abs":
        x = convert(x, INT) if x.kind == BOOL else x
        return x.ctx.node("abs", (x,), x.kind)
    # floor and ceil: the identity on ints, as on Python ints.
    if x.kind != FLOAT:
        return convert(x, INT)
    return x.ctx.node(op, (x,), FLOAT)


def select(cond, a, b):
    ctx = _context(cond, a, b)
    cond = lift(ctx, cond, "the condition of mods.where")
    if cond.kind != BOOL:
        raise TypeError(f"the condition of mods.where must be a bool (a comparison, &, |, ~), got a traced {cond.kind}")
    a, b = lift(ctx, a), lift(ctx, b)
    a, b, kind = _promote(ctx, a, b, BOOL)
    return ctx.node("where", (cond, a, b), kind)


def extremum(op, a, b):
    ctx = _context(a, b)
    a, b = lift(ctx, a), lift(ctx, b)
    a, b, kind = _promote(ctx, a, b, INT)
    return ctx.node(op, (a, b), kind)


class Buffer:
    """A traced buffer: index it with one int per axis (``table[h, q_idx - kv_idx + 128]``)."""

    def __init__(self, ctx, number, dtype, ndim):
        self._ctx, self._number, self._dtype, self.ndim = ctx, number, dtype, ndim

    def __repr__(self):
        return f"<traced buffer {self._number}: {self._dtype} of rank {self.ndim}>"

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        where = f"buffer {self._number} ({self._dtype}, rank {self.ndim})"
        if len(index) != self.ndim:
            raise TypeError(f"{where} takes exactly {self.ndim} indices (one int per axis), got {len(index)}")
        nodes = []
        for axis, i in enumerate(index):
            if i is None or i is Ellipsis or isinstance(i, slice):
                raise TypeError(f"{where} takes one int per axis; axis {axis} got {i!r} (slices, None and ... "
                                "cannot be traced)")
            node = lift(self._ctx, i, f"index {axis} of {where}")
            if node.kind == FLOAT:
                raise TypeError(f"index {axis} of {where} is a float: convert it with .astype(numpy.int32)")
            nodes.append(convert(node, INT))
        return self._ctx.node("load", tuple(nodes), BUFFER_KINDS[self._dtype], (self._number, self._dtype.name))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TypeError(f"a traced buffer supports only indexing, not {name!r} (its shape is not part of the "
                        "trace: pass sizes as Python numbers or as buffers)")

    def __array__(self, *args, **kwargs):
        raise TypeError("a traced buffer cannot become an array: index it with one int per axis")


_LEAVES = {"score": ("score", "b", "h", "q_idx", "kv_idx"), "mask": ("b", "h", "q_idx", "kv_idx")}


def _topological(root, stop=()):
    """The nodes under ``root``, each after its arguments; past the nodes whose ids are in ``stop`` (listed,
    their arguments not)."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if id(node) not in stop:
            stack.extend((a, False) for a in reversed(node.args) if id(a) not in seen)
    return order


class Traced:
    """One traced function: its expression, key and (for score_mods) gradients.

    ``kind`` is "score" (result: float) or "mask" (result: bool); ``buffers`` the (dtype, ndim) of each
    buffer argument.
    """

    def __init__(self, kind, ctx, root, buffers, name):
        self.kind, self.ctx, self.root, self.buffers, self.name = kind, ctx, root, tuple(buffers), name
        self.nodes = _topological(root)
        self.key = _key(self.nodes, kind, self.buffers)
        self._gradients = None

    def leaf(self, name):
        return self.ctx.nodes.get((name, (), INT if name != "score" else FLOAT, None))

    def reads(self, name):
        """Whether the result depends on argument ``name`` ("b", "h", "q_idx", ...)."""
        leaf = self.leaf(name)
        return leaf is not None and any(n is leaf for n in self.nodes)

    def gradients(self):
        """``(dscore, loads)``: the derivative of the result with respect to the score, and for every load
        of a floating-point buffer, ``(load, derivative)``; both expressions in the same trace."""
        if self._gradients is None:
            self._gradients = _reverse(self)
        return self._gradients

    @property
    def buffer_gradients(self):
        """Whether the function reads a floating-point buffer, whose gradient the backward then adds."""
        return bool(self.gradients()[1])

    @property
    def additive(self):
        """Whether d(result)/d(score) is 1 and no derivative or load index reads the score (a bias added to
        the score: dS is the gradient the buffers' terms take, as it is)."""
        dscore, _ = self.gradients()
        return dscore.op == "const" and dscore.value == 1.0 and not self.gradients_read_score

    @property
    def gradients_read_score(self):
        """Whether d(result)/d(score), a buffer gradient's derivative or a load's index reads the score
        (additive biases' do not: kernels can then take the gradients after the probabilities)."""
        dscore, loads = self.gradients()
        score = self.leaf("score")
        roots = [dscore] + [g for _, g in loads] + [x for load, _ in loads for x in load.args]
        return score is not None and any(n is score for n in _topological_many(roots))


def _key(nodes, kind, buffers):
    number = {id(n): i for i, n in enumerate(nodes)}
    return (kind, tuple((d.name, r) for d, r in buffers),
            tuple((n.op, n.kind, tuple(number[id(a)] for a in n.args), _const_key(n.value)) for n in nodes))


def trace(fn, kind, buffers, argument="score_mod"):
    """Traces ``fn`` (a score_mod if ``kind`` is "score", else a mask_mod) over buffers of the given
    (dtype, ndim); returns a :class:`Traced`. Raises TypeError naming what cannot be traced."""
    if not callable(fn):
        raise TypeError(f"{argument} must be a function, got {_describe(fn)}")
    if len(buffers) > MAX_BUFFERS:
        raise ValueError(f"{argument} takes at most {MAX_BUFFERS} buffers, got {len(buffers)}")
    ctx = _Context()
    leaves = [ctx.node(name, (), FLOAT if name == "score" else INT) for name in _LEAVES[kind]]
    proxies = [Buffer(ctx, i, numpy.dtype(d), r) for i, (d, r) in enumerate(buffers)]
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        result = fn(*leaves, *proxies)
    except TypeError as e:
        # A NumPy ufunc refuses Expr (__array_ufunc__ = None) in words of its own.
        reason = _NOT_A_NUMBER if "does not support ufuncs" in str(e) else str(e)
        raise TypeError(f"{argument} {name} cannot be traced: {reason}") from e
    try:
        root = lift(ctx, result, "the result")
    except TypeError as e:
        raise TypeError(f"{argument} {name} must return a traced value or a number, got {_describe(result)}") from e
    if kind == "score":
        if root.kind == BOOL:
            raise TypeError(f"{argument} {name} returned a bool; a score_mod returns the score (a mask belongs in "
                            "a mask_mod: BlockMask.from_mask_mod)")
        root = convert(root, FLOAT)
    elif root.kind != BOOL:
        raise TypeError(f"mask_mod {name} must return a bool (a comparison, &, |, ~), got a traced {root.kind}")
    return Traced(kind, ctx, root, [(numpy.dtype(d), r) for d, r in buffers], name)


# ----------------------------------------------------------------------------------------------------------
# Gradients: reverse mode over the DAG, building expressions.

def _zero(ctx):
    return ctx.node("const", (), FLOAT, 0.0)


def _add(a, b):
    if a is None:
        return b
    if b.op == "const" and b.value == 0.0:
        return a
    if a.op == "const" and a.value == 0.0:
        return b
    return arithmetic("add", a, b)


def _mul(a, b):
    for x, y in ((a, b), (b, a)):
        if x.op == "const" and x.value == 1.0 and y.kind == FLOAT:
            return y
    return arithmetic("mul", a, b)


def _local_derivatives(n):
    """d(n)/d(arg) for each float argument of node ``n``, as expressions (None for none)."""
    ctx = n.ctx
    a = n.args[0] if n.args else None
    one = lift(ctx, 1.0)
    op = n.op
    if op == "add":
        return one, one
    if op == "sub":
        return one, lift(ctx, -1.0)
    if op == "mul":
        return n.args[1], n.args[0]
    if op == "truediv":
        b = n.args[1]
        return arithmetic("truediv", one, b), -arithmetic("truediv", n, b)
    if op == "neg":
        return (lift(ctx, -1.0),)
    if op == "exp":
        return (n,)
    if op == "exp2":
        return (n * math.log(2.0),)
    if op == "log":
        return (arithmetic("truediv", one, a),)
    if op == "log2":
        return (arithmetic("truediv", lift(ctx, 1.0 / math.log(2.0)), a),)
    if op == "sqrt":
        return (arithmetic("truediv", lift(ctx, 0.5), n),)
    if op == "tanh":
        return (one - n * n,)
    if op == "sigmoid":
        return (n * (one - n),)
    if op == "pow":
        return (n.value * ctx.node("pow", (a,), FLOAT, n.value - 1.0),)
    if op == "abs":
        return (select(a < 0.0, -1.0, select(a > 0.0, 1.0, 0.0)),)
    if op == "minimum":
        return select(n.args[0] <= n.args[1], 1.0, 0.0), select(n.args[0] <= n.args[1], 0.0, 1.0)
    if op == "maximum":
        return select(n.args[0] >= n.args[1], 1.0, 0.0), select(n.args[0] >= n.args[1], 0.0, 1.0)
    if op == "where":
        return None, select(a, 1.0, 0.0), select(a, 0.0, 1.0)
    # floor, ceil, mod, floordiv, conversions, comparisons: no gradient flows (piecewise constant, or ints).
    return ()


def _reverse(t):
    ctx = t.ctx
    adjoint = {id(t.root): lift(ctx, 1.0)}
    loads = []
    for n in reversed(t.nodes):
        g = adjoint.get(id(n))
        if g is None or n.kind != FLOAT:
            continue
        if n.op == "load":
            loads.append((n, g))
            continue
        if n.op == "where":
            # Selecting, not multiplying: a NaN or inf in the branch not taken must not reach the other.
            cond, a, b = n.args
            contributions = (None, select(cond, g, 0.0), select(cond, 0.0, g))
        else:
            contributions = tuple(None if d is None else _mul(g, d) for d in _local_derivatives(n))
        for arg, c in zip(n.args, contributions):
            if c is not None and arg.kind == FLOAT:
                adjoint[id(arg)] = _add(adjoint.get(id(arg)), c)
    score = t.leaf("score")
    dscore = adjoint.get(id(score)) if score is not None else None
    return (dscore if dscore is not None else _zero(ctx)), loads[::-1]


# ----------------------------------------------------------------------------------------------------------
# Elementwise evaluation on NumPy or CuPy arrays.

def module(arrays):
    """cupy if any of ``arrays`` (arrays, numbers or None) is a CuPy array, else numpy."""
    for x in arrays:
        if x is not None and type(x).__module__.startswith("cupy"):
            import cupy

            return cupy
    return numpy


def evaluate(roots, env, buffers, ftype, xp=None):
    """Values of the expressions ``roots`` (nodes of one trace) on arrays.

    ``env`` maps the leaves ("score", "b", "h", "q_idx", "kv_idx") to arrays that broadcast together
    (ints as int32, the score in ``ftype``); ``buffers`` are the buffer arrays. Returns, per root, its
    value and whether every load it depends on was in range (an array, or None when it has no loads).
    """
    xp = xp or module(list(env.values()) + list(buffers))
    ftype = numpy.dtype(ftype)
    values, valid = {}, {}
    order = _topological_many(roots)
    with numpy.errstate(all="ignore"):
        for n in order:
            args = [values[id(a)] for a in n.args]
            values[id(n)] = _evaluate_node(xp, n, args, env, buffers, ftype)
            if n.op == "where":
                # Only the branch taken counts: a guarded index is in range where it is read.
                c, a, b = n.args
                va, vb = valid.get(id(a)), valid.get(id(b))
                flags = [] if valid.get(id(c)) is None else [valid[id(c)]]
                if va is not None or vb is not None:
                    flags.append(xp.where(args[0], True if va is None else va, True if vb is None else vb))
            else:
                flags = [valid[id(a)] for a in n.args if valid.get(id(a)) is not None]
                if n.op == "load":
                    flags.append(_in_range(xp, args, buffers[n.value[0]].shape))
            valid[id(n)] = _all(flags)
    return [(values[id(r)], valid.get(id(r))) for r in roots]


def _topological_many(roots, stop=()):
    order, seen = [], set()
    for r in roots:
        for n in _topological(r, stop):
            if id(n) not in seen:
                seen.add(id(n))
                order.append(n)
    return order


def _all(flags):
    result = None
    for f in flags:
        result = f if result is None else result & f
    return result


def _in_range(xp, indices, shape):
    ok = None
    for i, size in zip(indices, shape):
        f = (i >= 0) & (i < size)
        ok = f if ok is None else ok & f
    return ok


def _int32(xp, x):
    return xp.asarray(x).astype(numpy.int32, copy=False)


def _evaluate_node(xp, n, args, env, buffers, ftype):
    op, kind = n.op, n.kind
    dtype = {BOOL: numpy.bool_, INT: numpy.int32, FLOAT: ftype}[kind]
    if op == "const":
        return xp.asarray(n.value, dtype=dtype)
    if op in ("score", "b", "h", "q_idx", "kv_idx"):
        return xp.asarray(env[op], dtype=dtype)
    if op == "load":
        buf = buffers[n.value[0]]
        index = tuple(xp.clip(i, 0, max(size - 1, 0)) for i, size in zip(args, buf.shape))
        if buf.size == 0:
            return xp.zeros(xp.broadcast(*index).shape if index else (), dtype)
        return buf[index].astype(dtype)
    if op == "to_float":
        return args[0].astype(ftype)
    if op == "to_int":
        x = args[0]
        if x.dtype.kind == "f":
            # Truncation toward zero; NaN gives 0, beyond the int32 range saturates (as cvt.rzi.s32 does).
            t = xp.trunc(x.astype(numpy.float64))
            return xp.where(xp.isnan(t), 0, xp.clip(t, _INT_MIN, _INT_MAX)).astype(numpy.int32)
        return x.astype(numpy.int32)
    if op == "to_bool":
        return args[0] != 0
    if op in ("add", "sub", "mul"):
        f = {"add": xp.add, "sub": xp.subtract, "mul": xp.multiply}[op]
        return f(args[0], args[1]).astype(dtype)  # int32 wraps
    if op == "truediv":
        return (args[0] / args[1]).astype(dtype)
    if op in ("floordiv", "mod"):
        a, b = args
        if kind == INT:
            safe = xp.where(b == 0, 1, b).astype(numpy.int32)
            r = xp.floor_divide(a, safe) if op == "floordiv" else xp.remainder(a, safe)
            return xp.where(b == 0, 0, r).astype(numpy.int32)
        q = xp.floor(a / b).astype(dtype)
        return q if op == "floordiv" else (a - b * q).astype(dtype)
    if op == "neg":
        return (-args[0]).astype(dtype)
    if op == "abs":
        return xp.abs(args[0]).astype(dtype)
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        f = {"eq": xp.equal, "ne": xp.not_equal, "lt": xp.less, "le": xp.less_equal, "gt": xp.greater,
             "ge": xp.greater_equal}[op]
        return f(args[0], args[1])
    if op in ("and", "or", "xor"):
        f = {"and": xp.bitwise_and, "or": xp.bitwise_or, "xor": xp.bitwise_xor}[op]
        return f(args[0], args[1]).astype(dtype)
    if op == "invert":
        return (xp.logical_not(args[0]) if kind == BOOL else xp.invert(args[0])).astype(dtype)
    if op == "where":
        return xp.where(args[0], args[1], args[2]).astype(dtype)
    if op in ("minimum", "maximum"):
        return getattr(xp, op)(args[0], args[1]).astype(dtype)
    if op in ("floor", "ceil"):
        return getattr(xp, op)(args[0]).astype(dtype)
    if op == "sigmoid":
        one = dtype.type(1)
        return (one / (one + xp.exp(-args[0]))).astype(dtype)
    if op == "pow":
        return xp.power(args[0], dtype.type(n.value)).astype(dtype)
    if op in _UNARY_FLOAT:
        return getattr(xp, op)(args[0]).astype(dtype)
    raise AssertionError(f"unknown node {op}")


# ----------------------------------------------------------------------------------------------------------
# CUDA (kernels_cu/common/user_mod.cuh holds the operations; the kernels include what this writes).

_CTYPE = {BOOL: "bool", INT: "int", FLOAT: "F"}
_BUFFER_CTYPE = {"float32": "float", "float64": "double", "int32": "int", "bool": "bool"}
_INFIX = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_BITS = {"and": "&", "or": "|", "xor": "^"}
_HELPER = {"add": "user_add", "sub": "user_sub", "mul": "user_mul", "truediv": "user_div", "floordiv": "user_floordiv",
           "mod": "user_mod", "minimum": "user_minimum", "maximum": "user_maximum"}


def _float_literal(value):
    if math.isnan(value):
        return "user_nan(F(0))"
    if math.isinf(value):
        return ("-" if value < 0 else "") + "user_inf(F(0))"
    # A hexadecimal double, rounded to F as NumPy rounds a Python float to float32.
    return f"F({value.hex()})"


def _int_literal(value):
    return "(-2147483647 - 1)" if value == _INT_MIN else f"{value}"


#: The float functions a score function of the 16-bit tensor-core kernels takes in their fast forms
#: (kernels_cu/common/user_mod.cuh's user_fast_*: the special-function unit's approximations).
_FAST = ("exp", "exp2", "log", "log2", "tanh", "sigmoid")
#: Float arithmetic in the fast forms: plain operators (the compiler may fuse them into FMAs).
_FAST_ARITHMETIC = {"add": "+", "sub": "-", "mul": "*", "truediv": "/"}
#: Nodes whose arguments decide something discrete (an int, a bool, a rounding, a load's index): those
#: arguments, and everything they are computed from, keep the accurate forms even in fast code, so
#: ``floor(kv_idx / 41.0)`` picks the bucket NumPy picks (a reciprocal product is 1 ulp low at 41).
_DISCRETE = {"to_int", "to_bool", "floor", "ceil", "floordiv", "mod", "load", "eq", "ne", "lt", "le", "gt", "ge"}


def _exact_nodes(roots):
    """Ids of the nodes (of the DAGs under ``roots``) whose values reach a discrete decision (_DISCRETE, or
    a ``where``'s condition)."""
    exact, stack = set(), []
    for n in _topological_many(roots):
        if n.op in _DISCRETE:
            stack.extend(n.args)
        elif n.op == "where":
            stack.append(n.args[0])
    while stack:
        x = stack.pop()
        if id(x) not in exact:
            exact.add(id(x))
            stack.extend(x.args)
    return exact


def _expression(n, name, fast=False):
    """C++ of node ``n``, its arguments named by ``name``; ``fast``: the fast forms of _FAST."""
    a = [name(x) for x in n.args]
    op, kind = n.op, n.kind
    if op == "const":
        if kind == BOOL:
            return "true" if n.value else "false"
        return _int_literal(n.value) if kind == INT else _float_literal(n.value)
    if op in _LEAVES["score"]:
        return op
    if op == "to_float":
        return f"F({a[0]})"
    if op == "to_int":
        return f"user_to_int({a[0]})" if n.args[0].kind == FLOAT else f"int({a[0]})"
    if op == "to_bool":
        return f"({a[0]} != 0)"
    if fast and kind == FLOAT and op in _FAST_ARITHMETIC:
        # Contractible arithmetic (FMAs), and a division by a constant whose reciprocal is a normal float
        # as a product with that reciprocal (F(1) / constant: folded by the compiler, rounded to F).
        divisor = n.args[1]
        if op == "truediv" and divisor.op == "const" and 2.0**-126 <= abs(divisor.value) <= 2.0**126:
            return f"({a[0]} * (F(1) / {a[1]}))"
        return f"user_fast_div({a[0]}, {a[1]})" if op == "truediv" else f"({a[0]} {_FAST_ARITHMETIC[op]} {a[1]})"
    if op in _HELPER:
        return f"{_HELPER[op]}({a[0]}, {a[1]})"
    if op in _INFIX:
        return f"({a[0]} {_INFIX[op]} {a[1]})"
    if op in _BITS:
        return f"{_CTYPE[kind]}({a[0]} {_BITS[op]} {a[1]})"
    if op == "invert":
        return f"(!{a[0]})" if kind == BOOL else f"(~{a[0]})"
    if op == "neg":
        return f"user_neg({a[0]})"
    if op == "where":
        return f"({a[0]} ? {a[1]} : {a[2]})"
    if op == "pow":
        return f"user_pow({a[0]}, {_float_literal(n.value)})"
    if fast and op in _FAST:
        return f"user_fast_{op}({a[0]})"
    return f"user_{op}({a[0]})"  # abs, floor, ceil and the float functions


class _Writer:
    """Statements computing a set of nodes, each once, with validity flags where loads are involved."""

    def __init__(self, buffers_name, fast=False, load="user_load"):
        self.lines, self.names, self.ok, self.buffers_name, self.fast = [], {}, {}, buffers_name, fast
        self.load = load  # the loading function of kernels_cu/common/user_mod.cuh
        self.exact = set()  # nodes kept in the accurate forms (_exact_nodes)

    def name(self, n):
        return self.names[id(n)]

    def flag(self, n):
        return self.ok.get(id(n))

    def preset(self, n, name, flag):
        """Node ``n`` as the value ``name`` (and validity ``flag``, or None) computed elsewhere."""
        self.names[id(n)] = name
        if flag is not None:
            self.ok[id(n)] = flag

    def emit(self, roots):
        if self.fast:
            self.exact |= _exact_nodes(roots)
        for n in _topological_many(roots, stop=self.names):
            if id(n) in self.names:
                continue
            v = f"v{len(self.names)}"
            flags = [self.flag(x) for x in n.args if self.flag(x) is not None]
            if n.op == "load":
                number, dtype = n.value
                index = ", ".join(self.name(x) for x in n.args)
                ok = f"ok{len(self.names)}"
                self.lines.append(f"const int {v}_at[{max(len(n.args), 1)}] = {{{index or '0'}}};")
                self.lines.append(f"bool {ok}_in;")
                self.lines.append(f"const {_CTYPE[n.kind]} {v} = {_CTYPE[n.kind]}({self.load}<{_BUFFER_CTYPE[dtype]}>("
                                  f"{self.buffers_name}.buf[{number}], {v}_at, {len(n.args)}, &{ok}_in));")
                flags.append(f"{ok}_in")
            else:
                fast = self.fast and id(n) not in self.exact
                self.lines.append(f"const {_CTYPE[n.kind]} {v} = {_expression(n, self.name, fast)};")
            if n.op == "where":
                c, x, y = n.args
                fx, fy = self.flag(x), self.flag(y)
                flags = [] if self.flag(c) is None else [self.flag(c)]
                if fx is not None or fy is not None:
                    flags.append(f"({self.name(c)} ? {fx or 'true'} : {fy or 'true'})")
            self.names[id(n)] = v
            if flags:
                ok = f"ok{len(self.names) - 1}"
                self.lines.append(f"const bool {ok} = {' && '.join(flags)};")
                self.ok[id(n)] = ok

    def body(self, indent="    "):
        return "\n".join(indent + line for line in self.lines)


class _RangeWriter:
    """Statements computing the range (kernels_cu/common/user_range.cuh) of a set of nodes, none of which
    reads the score, over queries [q0, q1] and keys [k0, k1] of one (b, h), in the accurate forms, which
    cuda_source makes those nodes take everywhere."""

    def __init__(self):
        self.lines, self.names, self.loads = [], {}, []

    def name(self, n):
        return self.names[id(n)]

    def emit(self, roots):
        for n in _topological_many(roots):
            if id(n) not in self.names:
                v = f"r{len(self.names)}"
                for line in self._statements(n, v):
                    self.lines.append(line)
                self.names[id(n)] = v

    def _statements(self, n, v):
        a = [self.name(x) for x in n.args]
        op, kind = n.op, n.kind
        rtype = "UserFloatRange<F>" if kind == FLOAT else "UserIntRange"
        if op == "load":
            self.loads.append(n)
            number, dtype = n.value
            points = " && ".join(f"user_range_one({x})" for x in a) or "true"
            index = ", ".join(f"int({x}.lo)" for x in a) or "0"
            value = {FLOAT: "F", INT: "int", BOOL: "int"}[kind]
            return [f"const int {v}_at[{max(len(a), 1)}] = {{{index}}};", f"bool {v}_in;",
                    f"const {value} {v}_x = {value}(user_load<{_BUFFER_CTYPE[dtype]}>(score_buffers.buf[{number}], "
                    f"{v}_at, {len(a)}, &{v}_in));",
                    f"const {rtype} {v} = ({points}) ? user_range_point({v}_x) : "
                    + ("user_range_unknown(F(0));" if kind == FLOAT else
                       "user_range_bool();" if kind == BOOL else "user_range_all_ints();")]
        return [f"const {rtype} {v} = {self._expression(n, a)};"]

    def _expression(self, n, a):
        op, kind = n.op, n.kind
        if op == "const":
            if kind == FLOAT:
                return f"user_range_point({_float_literal(n.value)})"
            return f"user_range_point({_int_literal(int(n.value)) if kind == INT else int(bool(n.value))})"
        if op in ("b", "h"):
            return f"user_range_point({op})"
        if op == "q_idx":
            return "UserIntRange{q0, q1}"
        if op == "kv_idx":
            return "UserIntRange{k0, k1}"
        if op == "to_float":
            return f"user_range_to_float({a[0]}, F(0))"
        if op == "to_int":
            return f"user_range_to_int({a[0]})" if n.args[0].kind == FLOAT else a[0]
        if op == "to_bool":
            return f"user_range_to_bool({a[0]})"
        if op in ("and", "or", "xor") and kind == INT:
            return f"user_range_bits({a[0]}, {a[1]}, int({a[0]}.lo) {_BITS[op]} int({a[1]}.lo))"
        if op == "invert":
            return f"user_range_not({a[0]})" if kind == BOOL else f"user_range_invert_int({a[0]})"
        if op == "truediv":
            return f"user_range_div({a[0]}, {a[1]})"
        if op in _FAST or op == "sqrt":
            return f"user_range_rising({a[0]}, user_{op}({a[0]}.lo), user_{op}({a[0]}.hi))"
        if op == "pow":
            return f"user_range_other({a[0]}, user_pow({a[0]}.lo, {_float_literal(n.value)}))"
        return f"user_range_{op}({', '.join(a)})"  # + - * // % neg abs floor ceil, comparisons, where, extrema

    def body(self, indent="    "):
        return "\n".join(indent + line for line in self.lines)


def _results(t):
    """A score_mod's results as nodes: the value, dscore, the buffer gradients' derivatives and the loads'
    indices."""
    dscore, loads = t.gradients()
    return [t.root, dscore] + [g for _, g in loads] + [x for load, _ in loads for x in load.args]


def _reading(nodes, leaves):
    """Ids of the nodes (in topological order) that read one of the leaves named ``leaves``."""
    found = set()
    for n in nodes:
        if n.op in leaves or any(id(a) in found for a in n.args):
            found.add(id(n))
    return found


def _taken_by_score(t, keep):
    """The nodes that do not read the score but that a node reading it takes, or that are results, and
    for which ``keep(node, ids of the nodes reading q_idx or kv_idx)`` holds; each once."""
    roots = _results(t)
    nodes = _topological_many(roots)
    score, positions = _reading(nodes, ("score",)), _reading(nodes, ("q_idx", "kv_idx"))
    taken, seen = [], set()
    for n in [a for n in nodes if id(n) in score for a in n.args] + roots:
        if id(n) not in score and id(n) not in seen and keep(n, positions):
            seen.add(id(n))
            taken.append(n)
    return taken


def _uniform_checks(t):
    """The nodes a tile must hold one value of for the function of each pair to be its function at one
    pair: those that read q_idx or kv_idx but not the score, where a node that reads the score (or a
    result) takes them."""
    return _taken_by_score(t, lambda n, positions: id(n) in positions)


#: Operations that can map many positions to one value: bounds (clip is minimum(maximum(...))), selections,
#: roundings, comparisons, integer division and bit operations, loads (a table of equal entries), and the
#: float functions whose results saturate (tanh(100) is 1, exp2(-200) is 0).
_SATURATING = _DISCRETE | {"minimum", "maximum", "where", "and", "or", "xor", "invert", "pow", "exp", "exp2", "tanh",
                           "sigmoid"}


def _freezable(checks):
    """Whether the position-dependent parts ``checks`` can hold one value over a tile of many pairs: only
    through a _SATURATING operation on the way from q_idx or kv_idx. Without one (ALiBi's slope times
    |q_idx - kv_idx|) a tile's pairs take as many values as its positions do, so the kernels leave the
    frozen branch out (its range test per tile and a second copy of the scores' code)."""
    nodes = _topological_many(checks)
    positions = _reading(nodes, ("q_idx", "kv_idx"))
    return any(id(n) in positions and n.op in _SATURATING for n in nodes)


_SCORE_PARAMS = "F score, int b, int h, int q_idx, int kv_idx, const ModBuffers& score_buffers"
_MASK_PARAMS = "int b, int h, int q_idx, int kv_idx, const ModBuffers& mask_buffers"


def cuda_source(t, fast=False):
    """C++ of traced function ``t``: struct cupyflash::UserScore (a score_mod: value, dscore and scatter)
    or cupyflash::UserMask (a mask_mod: visible), which the kernels take as template arguments; needs
    common/user_mod.cuh and common/user_range.cuh. ``fast``: a score_mod's exp, log, tanh and sigmoid in their fast forms (a
    mask_mod's never: its blocks were classified with the accurate ones)."""
    header = f"// Generated by cupyflash/_trace.py from {t.kind}_mod {t.name!r}.\n"
    if t.kind == "mask":
        w = _Writer("mask_buffers", load="user_mask_load")
        w.emit([t.root])
        ok = w.flag(t.root)
        return header + (
            "namespace cupyflash {\nstruct UserMask {\n    static constexpr bool kEnabled = true;\n"
            "    // Whether query q_idx sees key kv_idx; *poisoned when an index it reads is out of range (the\n"
            "    // pair then stays visible, with a NaN score). Its floats are float32 on every path.\n"
            f"    CUPYFLASH_HD static bool visible({_MASK_PARAMS}, bool* poisoned) {{\n        using F = float;\n"
            f"{w.body(' ' * 8)}\n"
            f"        *poisoned = {'!' + ok if ok else 'false'};\n"
            f"        return {w.name(t.root)}{' || !' + ok if ok else ''};\n    }}\n}};\n}}  // namespace cupyflash\n"
        )
    dscore, loads = t.gradients()
    checks = _uniform_checks(t)
    ranges = _RangeWriter()
    ranges.emit(checks)
    # One value per check, and per load the ranges read one index (its validity, which reaches the
    # results, is then one value too).
    uniform = " && ".join([f"user_range_one({ranges.name(c)})" for c in checks] +
                          [f"user_range_one({ranges.name(x)})" for load in ranges.loads for x in load.args])
    # The accurate forms for what the ranges compute (so the pairs compute it with the same correctly
    # rounded operations, uncontracted: the ranges hold their values) and for what reaches a discrete
    # decision in any of the functions (so every function, frozen or not, decides alike).
    exact = _exact_nodes(_results(t)) | set(ranges.names)
    # The frozen forms: the parts that do not read the score computed once (freeze), the rest from them.
    frontier = _frontier(t)
    freeze = _Writer("score_buffers", fast)
    freeze.exact |= exact
    freeze.emit(frontier)
    members, values, preset = [], [], []
    for k, n in enumerate(frontier):
        members.append(f"{_CTYPE[n.kind]} v{k};")
        values.append(freeze.name(n))
        flag = freeze.flag(n)
        if flag:
            members.append(f"bool ok{k};")
            values.append(flag)
        preset.append((n, f"fz.v{k}", f"fz.ok{k}" if flag else None))
    indent = " " * 8
    whole, frozen = _score_functions(t, fast, exact, ()), _score_functions(t, fast, exact, preset)
    return header + (
        "namespace cupyflash {\nstruct UserScore {\n    static constexpr bool kEnabled = true;\n"
        f"    // Whether it reads a floating-point buffer (the backward adds the buffer's gradient), and whether\n"
        f"    // its derivatives or load indices read the score.\n"
        f"    static constexpr bool kBufferGradients = {'true' if loads else 'false'};\n"
        f"    static constexpr bool kGradientsReadScore = {'true' if t.gradients_read_score else 'false'};\n"
        "    // Whether d(value)/d(score) is 1 and its derivatives read no score (Traced.additive).\n"
        f"    static constexpr bool kAdditive = {'true' if t.additive else 'false'};\n"
        "    // Whether it reads q_idx or kv_idx where the score or a result depends on them (uniform can be\n"
        "    // false).\n"
        f"    static constexpr bool kReadsPositions = {'true' if checks else 'false'};\n"
        "    // Whether those reads can hold one value over a tile of many pairs (a clip, a rounding, a\n"
        "    // selection, a load or a saturating function on the way): the kernels' frozen branch.\n"
        f"    static constexpr bool kFreezable = {'true' if checks and _freezable(checks) else 'false'};\n"
        "    // Whether its float functions take their fast forms (the 16-bit kernels'), in which the kernels\n"
        "    // also fold an additive function's scale into one FMA (common/user_calls.cuh).\n"
        f"    static constexpr bool kFast = {'true' if fast else 'false'};\n"
        "    // Whether, over queries [q0, q1] and keys [k0, k1] of (b, h), every part of the function that reads\n"
        "    // q_idx or kv_idx and not the score holds one value (common/user_range.cuh): the value, dscore\n"
        "    // and scatter of every pair there are then theirs at (q0, k0).\n"
        f"    template <typename F>\n    CUPYFLASH_HD static bool uniform(int b, int h, int q0, int q1, int k0, int k1, "
        f"const ModBuffers& score_buffers) {{\n{ranges.body(indent)}\n"
        f"        (void)b; (void)h; (void)q0; (void)q1; (void)k0; (void)k1; (void)score_buffers;\n"
        f"        return {uniform or 'true'};\n    }}\n"
        "    // The parts that do not read the score, at one pair (freeze), and the functions below from them\n"
        "    // (the *_frozen forms): a tile where uniform holds computes them once.\n"
        f"    template <typename F>\n    struct Frozen {{\n" + "".join(f"        {m}\n" for m in members) + "    };\n"
        f"    template <typename F>\n    CUPYFLASH_HD static Frozen<F> freeze(int b, int h, int q_idx, int kv_idx, "
        f"const ModBuffers& score_buffers) {{\n{freeze.body(indent)}\n"
        f"        (void)b; (void)h; (void)q_idx; (void)kv_idx; (void)score_buffers;\n"
        f"        return Frozen<F>{{{', '.join(values)}}};\n    }}\n"
        + whole.replace("@PARAMS@", _SCORE_PARAMS).replace("@SUFFIX@", "")
        + frozen.replace("@PARAMS@", "F score, const Frozen<F>& fz, const ModBuffers& score_buffers")
                .replace("@SUFFIX@", "_frozen")
        + "};\n}  // namespace cupyflash\n"
    )


def _frontier(t):
    """The nodes, constants aside, that do not read the score but that a node reading it takes (or that
    are results): what freeze computes."""
    return _taken_by_score(t, lambda n, positions: n.op != "const")


def _score_functions(t, fast, exact, preset):
    """C++ of a score_mod's value, dscore and scatter, with parameters @PARAMS@ and names ending @SUFFIX@;
    the nodes whose ids are in ``exact`` in the accurate forms, those of ``preset`` ((node, name, validity
    flag) triples) taken as computed."""
    dscore, loads = t.gradients()
    writers = []
    for _ in range(3):
        w = _Writer("score_buffers", fast)
        w.exact |= exact
        for n, name, flag in preset:
            w.preset(n, name, flag)
        writers.append(w)
    value, grad, scatter = writers
    value.emit([t.root])
    ok = value.flag(t.root)
    result = f"({ok} ? {value.name(t.root)} : user_nan(F(0)))" if ok else value.name(t.root)
    grad.emit([dscore])
    scatter.emit([g for _, g in loads] + [x for load, _ in loads for x in load.args])
    adds = []
    for load, g in loads:
        number, dtype = load.value
        index = ", ".join(scatter.name(x) for x in load.args)
        flag = scatter.flag(g)
        guard = "ds_mod != F(0)" + (f" && {flag}" if flag else "")
        adds.append(f"        {{\n            const int at[{max(len(load.args), 1)}] = {{{index or '0'}}};\n"
                    f"            if ({guard} && user_in_range(score_buffers.buf[{number}], at, {len(load.args)}))\n"
                    f"                sink.add({number}, user_offset(score_buffers.buf[{number}], at, {len(load.args)}), "
                    f"user_mul(ds_mod, {scatter.name(g)}));\n        }}")
    indent = " " * 8
    unused = "        (void)score; (void)score_buffers;\n"
    return (
        "    // The modified score: NaN when an index it reads is out of range.\n"
        f"    template <typename F>\n    CUPYFLASH_HD static F value@SUFFIX@(@PARAMS@) {{\n{value.body(indent)}\n"
        f"{unused}        return {result};\n    }}\n"
        "    // d(value) / d(score).\n"
        f"    template <typename F>\n    CUPYFLASH_HD static F dscore@SUFFIX@(@PARAMS@) {{\n{grad.body(indent)}\n"
        f"{unused}        return {grad.name(dscore)};\n    }}\n"
        "    // Adds ds_mod * d(value) / d(load) to the gradient of every floating-point buffer element the\n"
        "    // score reads (sink.add(buffer, offset, amount)); nothing where ds_mod is 0 (masked or\n"
        "    // zero-probability pairs), so an infinite or NaN derivative there does not reach the buffer.\n"
        f"    template <typename F, typename Sink>\n"
        f"    CUPYFLASH_HD static void scatter@SUFFIX@(@PARAMS@, F ds_mod, Sink& sink) {{\n"
        f"{scatter.body(indent)}\n" + "\n".join(adds) + ("\n" if adds else "") +
        f"{unused}        (void)ds_mod; (void)sink;\n    }}\n"
    )


def kernel_source(score, mask, fast=False):
    """The C++ a kernel built for score_mod ``score`` and mask_mod ``mask`` (traced functions, or None) is
    compiled after: common/user_mod.cuh, then their structs (cuda_source; ``fast`` for the score_mod)."""
    parts = ['#include "common/user_mod.cuh"\n#include "common/user_range.cuh"\n']
    parts += [cuda_source(t, fast) for t in (score, mask) if t is not None]
    return "".join(parts)
