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

import re
import zlib

import ml_dtypes
import numpy as np
import pytest

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
    """Return a deterministic 32-bit seed derived from test parameters. Objects whose repr holds their
    address (functions: a score_mod, a mask_mod) count by the rest of it (their names), so a test's
    inputs are the same in every run (with the address they changed per process, and a failure of one
    run could not be reproduced)."""
    return zlib.crc32(re.sub(r" at 0x[0-9a-fA-F]+", "", repr(params)).encode())


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


def _host_options(options):
    """Mask and score options with any device array (ALiBi slopes, sinks, seqused_k) copied to the host."""
    options = dict(options)
    for name in ("alibi_slopes", "sinks", "seqused_k"):
        if options.get(name) is not None:
            options[name] = to_host(options[name])
    if options.get("score_mod_buffers") is not None:
        options["score_mod_buffers"] = tuple(to_host(b) for b in options["score_mod_buffers"])
    return options


def _reference_dropout(options, q, cu):
    """Turns the API's dropout_seed and dropout_offset in ``options`` into the reference's keep masks,
    drawn by cupyflash.dropout_mask (whose definition tests/test_training.py checks on its own)."""
    import cupyflash

    seed = options.pop("dropout_seed", None)
    offset = options.pop("dropout_offset", 0)
    if not options.get("dropout_p"):
        return options
    p = options["dropout_p"]
    if cu is None:
        batch, seqlen_q, heads = q.shape[:3]
        options["dropout_mask"] = cupyflash.dropout_mask(seed, (batch, heads, seqlen_q, options.pop("seqlen_k")), p,
                                                         offset)
    else:
        cu_q, cu_k = cu
        lengths = list(zip(np.diff(cu_q), np.diff(cu_k)))
        longest = (max([a for a, _ in lengths], default=0), max([b for _, b in lengths], default=0))
        full = cupyflash.dropout_mask(seed, (len(lengths), q.shape[1]) + longest, p, offset)
        options["dropout_masks"] = [full[b, :, :a, :c] for b, (a, c) in enumerate(lengths)]
    return options


def _reference_results(q, k, v, causal, softmax_scale, dout, compute_dtype, options):
    """Run the reference on the host; return a dict of its results (with ``max_score`` always, and
    ``dsinks`` with sinks)."""
    q, k, v = (to_host(x) for x in (q, k, v))
    options = _host_options(options)
    cu = options.pop("cu_seqlens", None)
    if cu is not None:
        cu_q, cu_k = (to_host(c) for c in cu)
        options = _reference_dropout(options, q, (cu_q, cu_k))
        out, lse, top = reference.attention_varlen(q, k, v, cu_q, cu_k, causal, softmax_scale,
                                                   compute_dtype=compute_dtype, return_max_score=True, **options)
    else:
        options = _reference_dropout(dict(options, seqlen_k=k.shape[1]), q, None)
        options.pop("seqlen_k", None)
        out, lse, top = reference.attention(q, k, v, causal, softmax_scale, compute_dtype=compute_dtype,
                                            return_max_score=True, **options)
    results = {"out": out, "lse": lse, "max_score": top}
    if dout is not None:
        if cu is not None:
            grads = reference.attention_varlen_backward(to_host(dout), q, k, v, cu_q, cu_k, causal, softmax_scale,
                                                        compute_dtype=compute_dtype, **options)
        else:
            grads = reference.attention_backward(to_host(dout), q, k, v, causal, softmax_scale,
                                                 compute_dtype=compute_dtype, **options)
        results.update(grad_names(grads, options))
        if options.get("sinks") is not None:
            results["dsinks_floor"] = _sink_floor(to_host(dout), out, lse, options["sinks"], cu is not None, q.dtype)
    return results


def grad_names(grads, options):
    """The backward's results by name: dq, dk, dv, dsinks with sinks, and dbuffer<n> for each
    floating-point score_mod buffer (their tuple comes last)."""
    named = dict(zip(("dq", "dk", "dv"), grads))
    rest = list(grads[3:])
    if options.get("sinks") is not None:
        named["dsinks"] = rest.pop(0)
    if options.get("score_mod_buffers") is not None:
        for n, g in enumerate(rest.pop(0)):
            if g is not None:
                named[f"dbuffer{n}"] = g
    assert not rest, f"unexpected results after the gradients: {len(rest)}"
    return named


def _sink_floor(dout, out, lse, sinks, packed, dtype):
    """The least error a plain implementation's dsinks has, per the tolerance rule's use in _outputs:
    dsinks[h] = -sum over the head's rows of w_i delta_i, w_i = exp(sink - lse_i), delta_i = sum_d dout out,
    terms of both signs that cancel. The larger of float32's rounding of the terms (eps times the sum of
    their magnitudes) and twice the standard deviation that rounding out to the inputs' dtype puts into
    the sum (each element's rounding uniform over its ulp): the rounding noise of delta, which a plain
    implementation's out carries as ours does (float64, from the oracle's out and lse)."""
    out = out.astype(np.float64)
    dout = dout.astype(np.float64)
    delta = (dout * out).sum(axis=-1)
    ulp = np.spacing(np.abs(out).astype(dtype)).astype(np.float64)
    noise = ((dout * ulp) ** 2 / 12).sum(axis=-1)  # the variance of delta_i from out's rounding
    delta, noise = (x.T if packed else x.transpose(0, 2, 1) for x in (delta, noise))
    sink = sinks.astype(np.float64)[:, None] if packed else sinks.astype(np.float64)[None, :, None]
    lse = lse.astype(np.float64)
    unseen = np.isneginf(lse)
    weight = np.where(unseen, 0.0, np.exp(sink - np.where(unseen, 0.0, lse)))
    axes = -1 if packed else (0, 2)
    magnitude = np.abs(weight * delta).sum(axis=axes)
    sigma = np.sqrt((weight ** 2 * noise).sum(axis=axes))
    return float(max(np.finfo(np.float32).eps * magnitude.max(initial=0.0), 2 * sigma.max(initial=0.0)))


def oracle(q, k, v, causal=False, softmax_scale=None, dout=None, **options):
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
    **options
        ``window_size``, ``softcap``, ``alibi_slopes``, ``block_mask`` of
        :func:`cupyflash.reference.attention`, and ``cu_seqlens=(cu_q, cu_k)``
        for packed (varlen) inputs.

    Returns
    -------
    dict
        ``out`` and ``lse``, plus ``dq``, ``dk`` and ``dv`` when ``dout`` is
        given, as NumPy arrays.
    """
    compute_dtype = np.longdouble if q.dtype == np.float64 else np.float64
    return _reference_results(q, k, v, causal, softmax_scale, dout, compute_dtype, options)


def plain(q, k, v, causal=False, softmax_scale=None, dout=None, **options):
    """Compute the plain same-precision baseline on the host.

    Same parameters and return value as :func:`oracle`; the reference runs
    with ``compute_dtype`` equal to the input dtype.
    """
    return _reference_results(q, k, v, causal, softmax_scale, dout, q.dtype, options)


def _ulp(value, dtype):
    """Return the spacing of ``dtype`` numbers at ``value`` (>= 0), as a float."""
    return float(np.spacing(np.asarray(float(value), dtype=dtype)))


def assert_within_rule(name, got, oracle, plain, factor, floor=0.0):
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
    floor : float, optional
        A least value for the plain result's error (see :func:`_outputs`: dsinks).

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
    err_plain = max(float(np.max(np.abs(plain[finite] - oracle[finite]))), floor)
    ulp = _ulp(np.max(np.abs(oracle[finite])), got_dtype)
    bound = factor * err_plain + ulp
    assert err_got <= bound, (
        f"{name}: max|got - oracle| = {err_got:.3e} > {factor} * max|plain - oracle| "
        f"({err_plain:.3e}) + ulp(max|oracle|) ({ulp:.3e}) = {bound:.3e}"
    )


def _outputs(got, ref, base, dtype):
    """Apply the rule to every result of ``got`` (name -> array) and check dtypes.

    dsinks[h] sums -p_sink * delta over every row of head h, terms of both signs that cancel (by a factor
    of 10-100 in the tests), and has one value per head: the plain baseline's max error over so few
    values is sometimes far below its typical size (a hundredth of an ulp of the result, where the
    errors of its terms happen to cancel). Its error is taken as at least the oracle's ``dsinks_floor``
    (:func:`_sink_floor`: float32's rounding of the terms, or the noise of out's rounding in them)."""
    lse_dtype = np.float64 if np.dtype(dtype).itemsize >= 4 else np.float32
    dtypes = {"lse": lse_dtype, "max_score": np.float32, "dsinks": np.float32}
    for name, value in got.items():
        expected = ref[name].dtype if name.startswith("dbuffer") else dtypes.get(name, dtype)  # the buffer's
        assert value.dtype == expected, name
        factor = OUTPUT_FACTOR if name in ("out", "lse") else GRAD_FACTOR
        floor = ref["dsinks_floor"] if name == "dsinks" else 0.0
        assert_within_rule(name, value, ref[name], base[name], factor, floor)


def check_dense(xp, sizes, dtype, *, causal=False, backward=True, deterministic=False, scale=1.0, seed=None,
                **options):
    """Run cupyflash's dense API on fresh random inputs with ``options`` (window_size, softcap,
    alibi_slopes, block_mask) and apply the tolerance rule to out, lse and the gradients.

    ``sizes`` is (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v). Returns the results.
    """
    import cupyflash

    dt = np.dtype(dtype)
    seed = seed_from(sizes, dt.name, causal, sorted(map(str, options.items()))) if seed is None else seed
    batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v = sizes
    q, k, v = random_qkv(xp, batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, dt, seed, scale)
    dout = random_normal(xp, (batch, seqlen_q, heads, headdim_v), dt, np.random.default_rng(seed + 1))
    # The maximum score is checked wherever it is computed (NumPy arrays in this version).
    extra = {"return_max_score": True} if xp is np else {}
    out, lse, *top = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True, **extra, **options)
    got = {"out": out, "lse": lse, **dict(zip(("max_score",), top))}
    if backward:
        grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=deterministic,
                                                   **options)
        got.update(grad_names(grads, options))
    dout_ref = dout if backward else None
    _outputs(got, oracle(q, k, v, causal, dout=dout_ref, **options), plain(q, k, v, causal, dout=dout_ref, **options), dt)
    return got


def packed_offsets(lengths):
    """int32 cu_seqlens of a list of sequence lengths."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def check_varlen(xp, lengths_q, lengths_k, heads, heads_k, headdim, headdim_v, dtype, *, causal=False, backward=True,
                 deterministic=False, max_seqlen=None, seed=None, **options):
    """Run cupyflash's varlen API on packed random sequences and apply the tolerance rule.

    ``max_seqlen`` is None (cu_seqlens checked on the host) or a pair passed as max_seqlen_q/_k.
    """
    import cupyflash

    dt = np.dtype(dtype)
    seed = seed_from(lengths_q, lengths_k, heads, headdim, dt.name, causal, sorted(map(str, options.items()))) \
        if seed is None else seed
    cu_q, cu_k = packed_offsets(lengths_q), packed_offsets(lengths_k)
    rng = np.random.default_rng(seed)
    q = random_normal(xp, (int(cu_q[-1]), heads, headdim), dt, rng)
    k = random_normal(xp, (int(cu_k[-1]), heads_k, headdim), dt, rng)
    v = random_normal(xp, (int(cu_k[-1]), heads_k, headdim_v), dt, rng)
    dout = random_normal(xp, (int(cu_q[-1]), heads, headdim_v), dt, rng)
    cu = (xp.asarray(cu_q), xp.asarray(cu_k))
    sizes = {} if max_seqlen is None else {"max_seqlen_q": max_seqlen[0], "max_seqlen_k": max_seqlen[1]}
    extra = {"return_max_score": True} if xp is np else {}
    out, lse, *top = cupyflash.flash_attention_varlen(q, k, v, *cu, causal=causal, return_lse=True, **sizes, **extra,
                                                      **options)
    got = {"out": out, "lse": lse, **dict(zip(("max_score",), top))}
    if backward:
        grads = cupyflash.flash_attention_varlen_backward(dout, q, k, v, out, lse, *cu, causal=causal,
                                                          deterministic=deterministic, **sizes, **options)
        got.update(grad_names(grads, options))
    dout_ref = dout if backward else None
    ref = oracle(q, k, v, causal, dout=dout_ref, cu_seqlens=cu, **options)
    base = plain(q, k, v, causal, dout=dout_ref, cu_seqlens=cu, **options)
    _outputs(got, ref, base, dt)
    return got


def random_layout(shape, density, seed):
    """A random bool block layout with every query-block row holding at least one set block."""
    rng = np.random.default_rng(seed)
    layout = rng.random(shape) < density
    rows, cols = shape[-2:]
    layout[..., np.arange(rows), np.minimum(np.arange(rows), cols - 1)] = True
    return layout


def alibi(xp, batch, heads, per_batch=False):
    """ALiBi slopes 2^(-8 (h + 1) / heads), shape (heads,) or (batch, heads) with a different row per entry."""
    slopes = 2.0 ** (-8.0 * (np.arange(heads) + 1) / heads)
    if per_batch:
        slopes = slopes[None, :] * (1 + np.arange(batch)[:, None])
    return xp.asarray(slopes.astype(np.float32))


def gpu_available():
    """True when CuPy sees a CUDA GPU (no driver, no device or no CuPy all mean no GPU)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


#: The kernel families a float16/bfloat16 case runs on (CUPYFLASH_FAMILY): the Hopper kernels where the
#: GPU has them (elsewhere "sm90" falls through to sm80) and the mma.sync kernels; float32 cases run the
#: Hopper forward (its backward is sm80's), the sm80 family (head dims up to 128, forward and backward)
#: and the general kernels; float64 cases the sm80 family and the general kernels.
HALF_FAMILIES = ("sm90", "sm80")
FLOAT32_FAMILIES = ("sm90", "sm80", "general")
FLOAT64_FAMILIES = ("sm80", "general")


def with_families(cases, dtype_of, ids):
    """pytest params (case, family) for every case: each 16-bit case once per HALF_FAMILIES, each float32
    case once per FLOAT32_FAMILIES, each float64 case once per FLOAT64_FAMILIES."""
    params = []
    for case, case_id in zip(cases, ids):
        itemsize = np.dtype(DTYPES[dtype_of(case)]).itemsize
        families = {2: HALF_FAMILIES, 4: FLOAT32_FAMILIES, 8: FLOAT64_FAMILIES}[itemsize]
        params += [pytest.param(case, f, id=f"{case_id}-{f}" if f else case_id) for f in families]
    return params


def use_family(monkeypatch, family):
    """Dispatch from ``family`` on (see cupyflash._families.forced); "" leaves dispatch alone."""
    if family:
        monkeypatch.setenv("CUPYFLASH_FAMILY", family)


def central_differences(loss, x, step):
    """d loss / d x by central differences, perturbing the array ``x`` in place (restored after)."""
    numeric = np.empty_like(x)
    for index in np.ndindex(x.shape):
        saved = x[index]
        x[index] = saved + step
        plus = loss()
        x[index] = saved - step
        minus = loss()
        x[index] = saved
        numeric[index] = (plus - minus) / (2 * step)
    return numeric
