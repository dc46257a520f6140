"""Shared test utilities: dtypes, random inputs, the oracle and the tolerance rule.

The tolerance rule judges an implementation ``got`` against a
higher-precision ``oracle`` relative to a "plain" same-precision
implementation (:mod:`cupyflash.reference` with ``compute_dtype`` set to the
input dtype)::

    max|got - oracle| <= factor * max|plain - oracle| + ulp(max|oracle|)

with the ulp taken in ``got``'s dtype.  ``factor`` is :data:`OUTPUT_FACTOR`
for forward outputs (``out``, ``lse``) and :data:`GRAD_FACTOR` for
gradients.
"""

import zlib

import ml_dtypes
import numpy as np

from cupyflash import reference

#: Supported input dtypes by name.
DTYPES = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}

#: Tolerance factor of the rule for forward results.
OUTPUT_FACTOR = 2
#: Tolerance factor of the rule for gradients.
GRAD_FACTOR = 3


def seed_from(*params):
    """Return a deterministic 32-bit seed derived from test parameters."""
    return zlib.crc32(repr(params).encode())


def to_host(x):
    """Return ``x`` as a NumPy array (copying CuPy arrays to the host)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "get"):
        return x.get()
    return np.asarray(x)


def random_normal(xp, shape, dtype, rng, scale=1.0):
    """Draw standard-normal values in float64, times ``scale``, cast to ``dtype``, on ``xp``."""
    return xp.asarray((rng.standard_normal(shape) * scale).astype(dtype))


def random_qkv(xp, batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, dtype, seed, scale=1.0):
    """Return fresh random ``(q, k, v)`` with the package's layout.

    Parameters
    ----------
    xp : module
        NumPy or CuPy; the arrays are moved there with ``xp.asarray``.
    batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v : int
        Problem sizes; see :func:`cupyflash.reference.attention`.
    dtype : dtype-like
    seed : int
    scale : float, optional
        Standard deviation of the entries.

    Returns
    -------
    q, k, v : arrays
        Standard-normal entries drawn in float64 and cast to ``dtype``.
    """
    rng = np.random.default_rng(seed)
    q = random_normal(xp, (batch, seqlen_q, heads, headdim), dtype, rng, scale)
    k = random_normal(xp, (batch, seqlen_k, heads_k, headdim), dtype, rng, scale)
    v = random_normal(xp, (batch, seqlen_k, heads_k, headdim_v), dtype, rng, scale)
    return q, k, v


def _reference_results(q, k, v, causal, softmax_scale, dout, compute_dtype):
    """Run the reference on the host; return a dict of its results."""
    q, k, v = (to_host(x) for x in (q, k, v))
    out, lse = reference.attention(q, k, v, causal, softmax_scale, compute_dtype=compute_dtype)
    results = {"out": out, "lse": lse}
    if dout is not None:
        grads = reference.attention_backward(
            to_host(dout), q, k, v, causal, softmax_scale, compute_dtype=compute_dtype
        )
        results.update(zip(("dq", "dk", "dv"), grads))
    return results


def oracle(q, k, v, causal=False, softmax_scale=None, dout=None):
    """Compute the oracle on the host.

    The oracle runs in float64 for 16- and 32-bit inputs and in
    ``np.longdouble`` for float64 inputs (a float64 oracle cannot judge
    float64 results).

    Parameters
    ----------
    q, k, v : arrays
        NumPy or CuPy inputs.
    causal : bool, optional
    softmax_scale : float, optional
    dout : array, optional
        When given, the gradients are computed too.

    Returns
    -------
    dict
        ``out`` and ``lse``, plus ``dq``, ``dk`` and ``dv`` when ``dout`` is
        given, as NumPy arrays.
    """
    compute_dtype = np.longdouble if q.dtype == np.float64 else np.float64
    return _reference_results(q, k, v, causal, softmax_scale, dout, compute_dtype)


def plain(q, k, v, causal=False, softmax_scale=None, dout=None):
    """Compute the plain same-precision baseline on the host.

    Same parameters and return value as :func:`oracle`; the reference runs
    with ``compute_dtype`` equal to the input dtype.
    """
    return _reference_results(q, k, v, causal, softmax_scale, dout, q.dtype)


def _ulp(value, dtype):
    """Return the spacing of ``dtype`` numbers at ``value`` (>= 0), as a float."""
    return float(np.spacing(np.asarray(float(value), dtype=dtype)))


def assert_within_rule(name, got, oracle, plain, factor):
    """Assert the tolerance rule for one result.

    Parameters
    ----------
    name : str
        Label used in the failure message.
    got : array
        Result under test (NumPy or CuPy).
    oracle : array
        Higher-precision result; its non-finite entries (``lse = -inf`` for
        rows seeing no key) must be matched exactly by ``got``.
    plain : array
        Plain same-precision result.
    factor : float
        :data:`OUTPUT_FACTOR` or :data:`GRAD_FACTOR`.

    Raises
    ------
    AssertionError
        On a shape mismatch, a non-finite mismatch, or when
        ``max|got - oracle| > factor * max|plain - oracle| + ulp(max|oracle|)``.
    """
    got_dtype = got.dtype
    got, oracle, plain = (to_host(x) for x in (got, oracle, plain))
    assert got.shape == oracle.shape == plain.shape, (
        f"{name}: shapes got {got.shape}, oracle {oracle.shape}, plain {plain.shape}"
    )
    if got.size == 0:
        return
    # Compare in the oracle's (wider) dtype so the difference is exact enough.
    got = got.astype(oracle.dtype)
    plain = plain.astype(oracle.dtype)
    nonfinite = ~np.isfinite(got) | ~np.isfinite(oracle)
    # NaN never equals anything, so any NaN in got fails here.
    assert np.array_equal(got[nonfinite], oracle[nonfinite]), (
        f"{name}: non-finite mismatch at {np.argwhere(nonfinite)[:5].tolist()}: "
        f"got {got[nonfinite][:5]}, oracle {oracle[nonfinite][:5]}"
    )
    finite = ~nonfinite
    if not finite.any():
        return
    err_got = float(np.max(np.abs(got[finite] - oracle[finite])))
    err_plain = float(np.max(np.abs(plain[finite] - oracle[finite])))
    ulp = _ulp(np.max(np.abs(oracle[finite])), got_dtype)
    bound = factor * err_plain + ulp
    assert err_got <= bound, (
        f"{name}: max|got - oracle| = {err_got:.3e} > {factor} * max|plain - oracle| "
        f"({err_plain:.3e}) + ulp(max|oracle|) ({ulp:.3e}) = {bound:.3e}"
    )
