"""Score functions written in Python (issue 24): the tracer (cupyflash/_trace.py) against the functions
run eagerly on NumPy arrays, its gradients against central differences, its CUDA (built as host C++)
against its NumPy evaluation, and score_mod through the public API against the reference."""

import math
import subprocess

import ml_dtypes
import numpy as np
import pytest
from helpers import central_differences, check_dense, check_varlen
from test_training import _host_build

import cupyflash
from cupyflash import _trace, mods, reference

F32 = np.float32


def _grid(batch=2, heads=3, rows=5, cols=7, seed=0, scale=3.0, dtype=F32):
    rng = np.random.default_rng(seed)
    env = {
        "score": (rng.standard_normal((batch, heads, rows, cols)) * scale).astype(dtype),
        "b": np.arange(batch, dtype=np.int32)[:, None, None, None],
        "h": np.arange(heads, dtype=np.int32)[None, :, None, None],
        "q_idx": np.arange(rows, dtype=np.int32)[:, None],
        "kv_idx": np.arange(cols, dtype=np.int32)[None, :],
    }
    return env


def _table(shape=(3, 21), seed=1, dtype=F32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def rel_bias(score, b, h, q_idx, kv_idx, table):
    return score + table[h, mods.clip(kv_idx - q_idx + 10, 0, 20)]


def gated(score, b, h, q_idx, kv_idx, table):
    gate = mods.sigmoid(table[h, mods.minimum(kv_idx, 20)])
    return mods.where(q_idx >= kv_idx, score * gate, score - 2.5) + mods.tanh(score / 7.0) * (b + 1)


def mixed(score, b, h, q_idx, kv_idx, table):
    bucket = (mods.log(mods.abs(q_idx - kv_idx) + 1.0) * 4).astype(np.int32)  # T5-style log buckets
    parity = ((q_idx + 2 * kv_idx) % 3 == 1) | (h == 2)
    return mods.where(parity, score ** 2 / 10, mods.exp2(score / 4)) - table[h, mods.clip(bucket, 0, 20)] \
        + mods.maximum(score, -1.0) * 0.5 - (q_idx // 2 - kv_idx // 3) / 8


FUNCTIONS = [rel_bias, gated, mixed]


def _trace_of(fn, buffers):
    return _trace.trace(fn, "score", [(b.dtype, b.ndim) for b in buffers])


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_evaluation_is_the_function_run_on_arrays(fn):
    """The traced expression, evaluated, equals the function run eagerly on NumPy arrays (mods on arrays)."""
    env, table = _grid(), _table()
    traced = _trace_of(fn, [table])
    (got, ok), = _trace.evaluate([traced.root], env, [table], F32)
    direct = fn(env["score"], env["b"], env["h"], env["q_idx"], env["kv_idx"], table)
    assert ok is None or ok.all()
    np.testing.assert_allclose(np.broadcast_to(got, env["score"].shape), direct, rtol=2e-6, atol=1e-6)


def test_integer_and_conversion_semantics():
    """Python's // and % (toward minus infinity), 0 for a division by 0, int32 wrap-around, truncating
    astype with NaN -> 0 and saturation, and NaN-propagating minimum."""
    a = np.array([7, -7, 7, -7, 5, -(2**31), 2**31 - 1], np.int32)[:, None]
    b = np.array([2, 2, -2, -2, 0, -1, 1], np.int32)[:, None]
    x = np.array([np.nan, np.inf, -np.inf, 2.9, -2.9, 3e9], F32)[None, :]

    def fn(score, b_, h, q_idx, kv_idx):
        return (q_idx // kv_idx) * 1000 + q_idx % kv_idx

    traced = _trace.trace(fn, "score", [])
    (value, _), = _trace.evaluate([traced.root], {"score": F32(0), "b": 0, "h": 0, "q_idx": a, "kv_idx": b},
                                  [], F32)

    def wrap(x):
        return (x + 2**31) % 2**32 - 2**31

    expect = [wrap(wrap((0 if y == 0 else wrap(x // y)) * 1000) + (0 if y == 0 else x % y))
              for x, y in zip(a.ravel().tolist(), b.ravel().tolist())]
    np.testing.assert_array_equal(value.ravel(), np.array(expect, np.int64).astype(F32))
    traced = _trace.trace(lambda s, b_, h, q, k: mods.minimum(s, 0.0), "score", [])
    (value, _), = _trace.evaluate([traced.root], {"score": x, "b": 0, "h": 0, "q_idx": 0, "kv_idx": 0}, [], F32)
    np.testing.assert_array_equal(value.ravel(), np.array([np.nan, 0, -np.inf, 0, -2.9, 0], F32))
    traced = _trace.trace(lambda s, b_, h, q, k: s.astype(np.int32), "score", [])
    (value, _), = _trace.evaluate([traced.root], {"score": x, "b": 0, "h": 0, "q_idx": 0, "kv_idx": 0}, [], F32)
    np.testing.assert_array_equal(value.ravel(), np.array([0, 2**31 - 1, -(2**31), 2, -2, 2**31 - 1], np.int64).astype(F32))


def test_out_of_range_loads_are_nan_unless_the_branch_is_not_taken():
    table = _table((3, 5))
    env = _grid(rows=4, cols=9)
    plain = _trace_of(lambda s, b, h, q, k, t: s + t[h, k], [table])
    guarded = _trace_of(lambda s, b, h, q, k, t: mods.where(k < 5, s + t[h, mods.minimum(k, 9)], s), [table])
    (value, ok), = _trace.evaluate([plain.root], env, [table], F32)
    assert (ok == (env["kv_idx"] < 5)).all() and ok.shape[-1] == 9
    (value, ok), = _trace.evaluate([guarded.root], env, [table], F32)
    assert ok.all()


@pytest.mark.parametrize("bad, message", [
    (lambda s, b, h, q, k: s if q > k else 0.0, "no truth value"),
    (lambda s, b, h, q, k: math.exp(s), "cannot become a Python float"),
    (lambda s, b, h, q, k: np.exp(s), "math and NumPy functions cannot be traced; use the functions of cupyflash.mods"),
    (lambda s, b, h, q, k: q < k, "returned a bool"),
    (lambda s, b, h, q, k: s + np.ones(3), "Python number"),
    (lambda s, b, h, q, k: s.shape, "no attribute 'shape'"),
    (lambda s, b, h, q, k: 2.0 ** s, "exponent"),
    (lambda s, b, h, q, k: s & 1, "bools or ints"),
    (lambda s, b, h, q, k: mods.where(q, s, 0.0), "condition"),
])
def test_what_cannot_be_traced_is_a_type_error_naming_it(bad, message):
    with pytest.raises(TypeError, match=message):
        _trace.trace(bad, "score", [])


@pytest.mark.parametrize("bad, message", [
    (lambda s, b, h, q, k, t: s + t[h], "takes exactly 2 indices"),
    (lambda s, b, h, q, k, t: s + t[h, s], "is a float"),
    (lambda s, b, h, q, k, t: s + t[h, 1:3], "slices"),
    (lambda s, b, h, q, k, t: s + t.shape[0], "shape is not part of the trace"),
])
def test_buffer_misuse_is_a_type_error(bad, message):
    with pytest.raises(TypeError, match=message):
        _trace.trace(bad, "score", [(np.dtype(F32), 2)])


def test_key_names_the_expression_not_the_function():
    """A new closure with the same expression has the key; a changed constant, buffer dtype or rank does
    not; buffer shapes and values never enter it."""
    def make(c):
        return lambda s, b, h, q, k, t: s * c + t[h, k]

    key = _trace_of(make(2.0), [_table()]).key
    assert _trace_of(make(2.0), [_table((9, 9))]).key == key
    assert _trace_of(make(3.0), [_table()]).key != key
    assert _trace_of(make(2), [_table()]).key == key  # 2 * a float is 2.0 * it: the same expression
    assert _trace_of(make(2.0), [_table(dtype=np.float64)]).key != key
    assert _trace.trace(lambda s, b, h, q, k: s + q - q, "score", []).key != \
        _trace.trace(lambda s, b, h, q, k: s + 0, "score", []).key


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_gradients_against_central_differences(fn):
    """d/dscore and d/dload, in float64, against central differences of the evaluated function."""
    env, table = _grid(batch=1, heads=3, rows=4, cols=6, dtype=np.float64, scale=1.5), _table(dtype=np.float64)
    env["score"] = env["score"] + 0.01  # away from where's and maximum's switching points at 0 and -1
    traced = _trace_of(fn, [table])
    dscore, loads = traced.gradients()

    def total(score, tbl):
        (v, _), = _trace.evaluate([traced.root], dict(env, score=score), [tbl], np.float64)
        return np.broadcast_to(v, env["score"].shape)

    step = 1e-6
    numeric = (total(env["score"] + step, table) - total(env["score"] - step, table)) / (2 * step)
    (analytic, _), = _trace.evaluate([dscore], env, [table], np.float64)
    np.testing.assert_allclose(np.broadcast_to(analytic, numeric.shape), numeric, rtol=1e-6, atol=1e-7)
    # Buffer gradient of sum(weights * f): scatter weights * d f / d load at each load's index.
    weights = np.random.default_rng(3).standard_normal(env["score"].shape)
    grad = np.zeros_like(table)
    for load, g in loads:
        results = _trace.evaluate([g] + list(load.args), env, [table], np.float64)
        shape = env["score"].shape
        index = tuple(np.broadcast_to(r[0], shape) for r in results[1:])
        np.add.at(grad, index, weights * np.broadcast_to(results[0][0], shape))
    numeric = central_differences(lambda: float((weights * total(env["score"], table)).sum()), table, 1e-6)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7)


_HOST_DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "common/user_mod.cuh"
#include "common/user_range.cuh"
%s
struct Sink {
    double* grad;
    void add(int, long long offset, %s amount) { grad[offset] += amount; }
};
int main(int argc, char** argv) {
    const int heads = 3, rows = 5, cols = 30, tsize = 21;
    static %s table[heads * tsize];
    static double grad[heads * tsize];
    for (int i = 0; i < heads * tsize; ++i) table[i] = static_cast<%s>(strtod(argv[1 + i], nullptr));
    cupyflash::ModBuffers m{};
    m.buf[0].data = table;
    m.buf[0].size[0] = heads;
    m.buf[0].size[1] = tsize;
    Sink sink{grad};
    for (int h = 0; h < heads; ++h)
        for (int i = 0; i < rows; ++i)
            for (int j = 0; j < cols; ++j) {
                const %s s = static_cast<%s>(strtod(argv[1 + heads * tsize + (h * rows + i) * cols + j], nullptr));
                printf("%%a %%a\n", static_cast<double>(cupyflash::UserScore::value(s, 1, h, i, j, m)),
                       static_cast<double>(cupyflash::UserScore::dscore(s, 1, h, i, j, m)));
                cupyflash::UserScore::scatter(s, 1, h, i, j, m, static_cast<%s>(1), sink);
            }
    for (int i = 0; i < heads * tsize; ++i) printf("%%a\n", grad[i]);
    return 0;
}
"""


@pytest.mark.parametrize("dtype, fast", [(np.float32, False), (np.float64, False), (np.float32, True)],
                         ids=["float32", "float64", "float32-fast"])  # (fast forms: 16-bit inputs, float code)
@pytest.mark.parametrize("fn", FUNCTIONS + [lambda s, b, h, q, k, t: s + t[h, k],
                                             lambda s, b, h, q, k, t: s / 3.0 + t[h, mods.floor(k / 1.7).astype(np.int32)]],
                         ids=["rel_bias", "gated", "mixed", "out_of_range", "bucket"])
def test_cuda_source_is_the_numpy_evaluation(tmp_path, fn, dtype, fast):
    """The generated CUDA, built as host C++: value, dscore and the scattered buffer gradient against the
    NumPy evaluation (+ - * / bitwise, int ops exactly; the math library's functions within a few ulps);
    the out-of-range case (keys past the table) gives NaN scores and scatters nothing there. The fast
    forms (the 16-bit tensor-core kernels': plain operators, reciprocal products; the host build keeps
    the accurate functions, the device's approximations are the GPU tests') within 64 ulps, but for
    values that pick a bucket, which stay exact (k / 1.7 at k = 17: a reciprocal product is low)."""
    table = _table(dtype=dtype)
    traced = _trace_of(fn, [table])
    ctype = "float" if dtype == np.float32 else "double"
    binary = _host_build(tmp_path, "mod", _HOST_DRIVER % ((_trace.cuda_source(traced, fast),) + (ctype,) * 6))
    env = _grid(batch=1, rows=5, cols=30, dtype=dtype)
    env["b"] = np.int32(1)
    env["h"] = np.arange(3, dtype=np.int32)[:, None, None]
    env["score"] = env["score"][0]
    args = [repr(float(x)) for x in table.ravel()] + [repr(float(x)) for x in env["score"].ravel()]
    run = subprocess.run([binary, *args], check=True, capture_output=True, text=True)
    lines = run.stdout.split()
    pairs = np.array([float.fromhex(x) for x in lines[:2 * env["score"].size]]).reshape(env["score"].shape + (2,))
    grad = np.array([float.fromhex(x) for x in lines[2 * env["score"].size:]]).reshape(table.shape)
    dscore, loads = traced.gradients()
    (value, ok), (deriv, _) = _trace.evaluate([traced.root, dscore], env, [table], dtype)
    value = np.where(ok, value, np.nan) if ok is not None else value
    ulps = (64 if fast else 4) * np.nanmax(np.spacing(np.maximum(np.abs(np.broadcast_to(value, pairs.shape[:-1])),
                                                                  1.0).astype(dtype)))
    if ok is not None:
        assert np.isnan(pairs[..., 0][~np.broadcast_to(ok, pairs.shape[:-1])]).all()
    np.testing.assert_allclose(pairs[..., 0], np.broadcast_to(value, pairs.shape[:-1]), rtol=0, atol=ulps)
    np.testing.assert_allclose(pairs[..., 1], np.broadcast_to(deriv, pairs.shape[:-1]), rtol=0, atol=ulps)
    expect = np.zeros(table.shape)
    shape = env["score"].shape
    for load, g in loads:
        results = _trace.evaluate([g] + list(load.args), env, [table], dtype)
        index = [np.broadcast_to(r[0], shape) for r in results[1:]]
        inside = np.ones(shape, bool)
        for x, size in zip(index, table.shape):
            inside &= (x >= 0) & (x < size)
        np.add.at(expect, tuple(x[inside] for x in index), np.broadcast_to(results[0][0], shape)[inside])
    np.testing.assert_allclose(grad, expect, rtol=1e-5, atol=1e-5)


_UNIFORM_DRIVER = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "common/user_mod.cuh"
#include "common/user_range.cuh"
%s
using F = %s;
struct Sink {
    std::vector<double> terms;  // (offset, amount) pairs
    void add(int, long long offset, F amount) { terms.push_back(double(offset)); terms.push_back(double(amount)); }
};
static bool same(F a, F b) { return std::memcmp(&a, &b, sizeof(F)) == 0 || (a != a && b != b); }
int main(int argc, char** argv) {
    static F table[3 * 21];
    for (int i = 0; i < 3 * 21; ++i) table[i] = static_cast<F>(strtod(argv[1 + i], nullptr));
    cupyflash::ModBuffers m{};
    m.buf[0].data = table;
    m.buf[0].size[0] = 3;
    m.buf[0].size[1] = 21;
    const int boxes = atoi(argv[1 + 3 * 21]);
    int uniform = 0, wrong = 0;
    for (int n = 0; n < boxes; ++n) {
        int box[5];
        for (int c = 0; c < 5; ++c) box[c] = atoi(argv[2 + 3 * 21 + 5 * n + c]);
        const int h = box[0], q0 = box[1], q1 = box[2], k0 = box[3], k1 = box[4];
        using U = cupyflash::UserScore;
        const bool all = U::uniform<F>(1, h, q0, q1, k0, k1, m);
        uniform += all;
        const U::Frozen<F> fz = U::freeze<F>(1, h, q0, k0, m);
        // Every pair of a uniform box, else its first pair alone.
        for (int i = q0; i <= (all ? q1 : q0); ++i)
            for (int j = k0; j <= (all ? k1 : k0); ++j)
                for (F s : {F(-2.5), F(0.75), F(3.0), F(0.99999994)}) {
                    Sink at, first;
                    U::scatter(s, 1, h, i, j, m, F(1.5), at);
                    U::scatter_frozen(s, fz, m, F(1.5), first);
                    if (!same(U::value(s, 1, h, i, j, m), U::value_frozen(s, fz, m)) ||
                        !same(U::dscore(s, 1, h, i, j, m), U::dscore_frozen(s, fz, m)) || at.terms != first.terms) {
                        if (wrong++ < 5)
                            printf("box h=%%d q=[%%d, %%d] k=[%%d, %%d] differs at (%%d, %%d)\n", h, q0, q1, k0, k1, i, j);
                    }
                }
    }
    printf("%%d %%d\n", uniform, wrong);
    return 0;
}
"""


def t5_buckets(score, b, h, q_idx, kv_idx, table):
    rel = kv_idx - q_idx
    distance = mods.abs(rel)
    large = mods.minimum(4 + (mods.log(distance / 4.0) / math.log(8.0) * 6).astype(np.int32), 9)
    return score + table[h, mods.where(distance < 4, distance, large) + mods.where(rel > 0, 10, 0)]


def alibi_by_formula(score, b, h, q_idx, kv_idx, table):
    return score - table[h, 0] * mods.abs(q_idx - kv_idx)


def causal_as_score_mod(score, b, h, q_idx, kv_idx, table):
    return mods.where(q_idx >= kv_idx, score, -math.inf)


def float_window(score, b, h, q_idx, kv_idx, table):
    return mods.where(mods.abs((q_idx - kv_idx) * 0.37) < 5.5, score, score * table[h, 3] - 3.0)


def blocks_of_seven(score, b, h, q_idx, kv_idx, table):
    return score * table[h, (kv_idx // 7 - q_idx // 7) % 5 + 2] + (q_idx % 7 == 3)


def load_validity(score, b, h, q_idx, kv_idx, table):
    # (A load past the table's 21 columns makes the score NaN, though the bool it feeds is always False.)
    return score + ((table[h, kv_idx] > 0.0) & (q_idx < 0))


def signed_zero(score, b, h, q_idx, kv_idx, table):
    return score + 1.0 / ((q_idx - kv_idx) * 0.0)  # -inf where q < kv, +inf elsewhere


def clamped_ratio(score, b, h, q_idx, kv_idx, table):
    # (Fast code divides by a constant as a product with its reciprocal: 41 * (1 / 41) is below 1.)
    return score + (mods.minimum(q_idx / 41.0, 1.0) - 1.0) * 1e30


def threshold_on_score(score, b, h, q_idx, kv_idx, table):
    return mods.where(score >= mods.minimum(q_idx, 41) / 41.0, score, -1e4)


_UNIFORM_CASES = [(fn, some, np.float32, True) for fn, some in (
    (rel_bias, True), (gated, True), (mixed, False), (alibi_by_formula, False), (t5_buckets, True),
    (causal_as_score_mod, True), (float_window, True), (blocks_of_seven, True), (load_validity, False),
    (signed_zero, False), (clamped_ratio, True), (threshold_on_score, True))]
# The accurate forms (float32 and float64 inputs) where floats reach the ranges.
_UNIFORM_CASES += [(t5_buckets, True, np.float32, False), (t5_buckets, True, np.float64, False),
                   (float_window, True, np.float64, False)]


@pytest.mark.parametrize("fn, some, dtype, fast", _UNIFORM_CASES,
                         ids=[f"{c[0].__name__}-{np.dtype(c[2]).name}{'-fast' * c[3]}" for c in _UNIFORM_CASES])
def test_uniform_tiles_hold_the_function_of_their_first_pair(tmp_path, fn, some, dtype, fast):
    """The generated UserScore::uniform (the ranges of common/user_range.cuh) and frozen forms, built as
    host C++, over boxes of queries and keys near and far from the diagonal: wherever uniform says a box
    is, every pair's value, dscore and scattered gradient terms are bitwise the frozen forms' from its
    first pair (and at that pair in every box); and it finds such boxes where the function has them (past
    a clip, beside a diagonal, inside one block of 7)."""
    table = _table(dtype=dtype)
    traced = _trace_of(fn, [table])
    ctype = "float" if dtype == np.float32 else "double"
    binary = _host_build(tmp_path, "uniform", _UNIFORM_DRIVER % (_trace.cuda_source(traced, fast), ctype))
    rng = np.random.default_rng(5)
    boxes = []
    for _ in range(300):
        h, q0, k0 = int(rng.integers(0, 3)), int(rng.integers(-3, 400)), int(rng.integers(0, 400))
        # (At least 3 queries and 4 keys: the function of one pair is that pair's, and mixed's q // 2 and
        # kv // 3 hold one value over fewer.)
        boxes += [h, q0, q0 + int(rng.choice([3, 5, 7, 16])) - 1, k0, k0 + int(rng.choice([4, 7, 16])) - 1]
    args = [repr(float(x)) for x in table.ravel()] + [str(len(boxes) // 5)] + [str(x) for x in boxes]
    run = subprocess.run([binary, *args], check=True, capture_output=True, text=True)
    *errors, counts = run.stdout.strip().split("\n")
    uniform, wrong = map(int, counts.split())
    assert wrong == 0, errors
    assert (uniform > 0) == some, uniform


@pytest.mark.parametrize("fn, some", [(c[0], c[1]) for c in _UNIFORM_CASES[:12]],
                         ids=[c[0].__name__ for c in _UNIFORM_CASES[:12]])
def test_frozen_branch_only_for_functions_that_can_hold_one_value(fn, some):
    """UserScore::kFreezable, which builds the kernels' frozen branch: set for every function whose tiles
    can be uniform (those the test above finds uniform boxes for), and clear where the positions reach the
    score through no clip, rounding, selection, load or saturating function (ALiBi's slope times |q - kv|,
    whose tiles never hold one value: the branch only cost it time; bench/NOTES.md, session 34)."""
    source = _trace.cuda_source(_trace_of(fn, [_table()]), True)
    freezable = "kFreezable = true;" in source
    assert freezable or "kFreezable = false;" in source
    assert freezable or not some
    assert freezable == (fn not in (alibi_by_formula, signed_zero)), fn.__name__


# -------------------------------------------------------------------------------- through the API

def _softcap_mod(cap):
    return lambda s, b, h, q, k: cap * mods.tanh(s / cap)


def _alibi_mod(seqlen_q, seqlen_k):
    return lambda s, b, h, q, k, slopes: s - slopes[h] * mods.abs(q + (seqlen_k - seqlen_q) - k)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, ml_dtypes.bfloat16, np.float16],
                         ids=["float64", "float32", "bfloat16", "float16"])
def test_score_mod_against_the_oracle(dtype):
    """T5 relative bias with a learned table (its gradient checked too), GQA, causal, odd sizes."""
    table = _table((4, 21), seed=5) * F32(0.5)
    check_dense(np, (2, 37, 45, 4, 2, 24, 16), dtype, causal=True, score_mod=rel_bias, score_mod_buffers=(table,))


def test_score_mod_varlen_against_the_oracle():
    """Packed sequences: b is the sequence index (the function reads it)."""
    table = _table((3, 21), seed=6)
    check_varlen(np, [5, 0, 17, 33], [9, 4, 17, 20], 3, 1, 16, 16, np.float32, causal=True, score_mod=gated,
                 score_mod_buffers=(table,))


def test_builtins_written_as_score_mods_are_the_builtins():
    """softcap and ALiBi written as score_mods give the built-ins' results (float64)."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, n, 4, 16)) for n in (19, 23, 23))
    dout = rng.standard_normal((2, 19, 4, 16))
    slopes = rng.uniform(0.1, 1.0, 4).astype(F32)
    for builtin, mod in (({"softcap": 3.0}, {"score_mod": _softcap_mod(3.0)}),
                         ({"alibi_slopes": slopes}, {"score_mod": _alibi_mod(19, 23), "score_mod_buffers": (slopes,)})):
        out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, **builtin)
        out_m, lse_m = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, **mod)
        np.testing.assert_allclose(out_m, out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse_m, lse, rtol=1e-12, atol=1e-12)
        grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, **builtin)
        grads_m = cupyflash.flash_attention_backward(dout, q, k, v, out_m, lse_m, causal=True, **mod)
        for a, b in zip(grads_m[:3], grads):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_buffer_gradients_against_central_differences():
    """d(loss)/d(table) of the reference's float64 attention, by central differences, against the
    NumPy twin's backward; int buffers get None."""
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, n, 2, 8)) for n in (6, 9, 9))
    dout = rng.standard_normal((1, 6, 2, 8))
    table = rng.standard_normal((2, 21))
    shift = np.array([3], np.int32)

    def fn(s, b, h, qi, ki, t, sh):
        return s * mods.sigmoid(t[h, mods.clip(ki - qi + sh[0], 0, 20)])

    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, score_mod=fn, score_mod_buffers=(table, shift))
    *_, (dtable, dshift) = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, score_mod=fn,
                                                              score_mod_buffers=(table, shift))
    assert dshift is None and dtable.dtype == np.float64

    def loss():
        return float((reference.attention(q, k, v, score_mod=fn, score_mod_buffers=(table, shift))[0] * dout).sum())

    np.testing.assert_allclose(dtable, central_differences(loss, table, 1e-6), rtol=1e-6, atol=1e-8)


def test_out_of_range_index_makes_the_rows_nan():
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((1, n, 1, 8)) for n in (4, 6, 6))
    table = np.zeros(5)
    out = cupyflash.flash_attention(q, k, v, score_mod=lambda s, b, h, qi, ki, t: s + t[ki],
                                    score_mod_buffers=(table,))
    assert np.isnan(out).all()  # every row sees key 5, past the table
    out = cupyflash.flash_attention(q, k, v, score_mod=lambda s, b, h, qi, ki, t: s + t[mods.minimum(ki, 4)],
                                    score_mod_buffers=(table,))
    np.testing.assert_allclose(out, cupyflash.flash_attention(q, k, v))


def test_score_mod_arguments_are_checked():
    rng = np.random.default_rng(10)
    q = k = v = rng.standard_normal((1, 4, 2, 8))
    with pytest.raises(ValueError, match="softcap or alibi_slopes"):
        cupyflash.flash_attention(q, k, v, softcap=2.0, score_mod=_softcap_mod(2.0))
    with pytest.raises(ValueError, match="without a score_mod"):
        cupyflash.flash_attention(q, k, v, score_mod_buffers=(np.zeros(3),))
    with pytest.raises(TypeError, match="dtype int64"):
        cupyflash.flash_attention(q, k, v, score_mod=lambda s, b, h, qi, ki, t: s, score_mod_buffers=(np.zeros(3, np.int64),))
    with pytest.raises(TypeError, match="must be a function"):
        cupyflash.flash_attention(q, k, v, score_mod=3.0)
    with pytest.raises(TypeError, match="tuple of arrays"):
        cupyflash.flash_attention(q, k, v, score_mod=lambda s, b, h, qi, ki, t: s, score_mod_buffers=np.zeros(3))
    with pytest.raises(TypeError, match="cannot be traced"):
        cupyflash.flash_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s if qi > ki else s)
    # The vjp carries the score_mod and returns the buffers' gradients last.
    table = np.ones((2, 1))
    out, vjp = cupyflash.flash_attention_vjp(q, k, v, score_mod=lambda s, b, h, qi, ki, t: s * t[h, 0],
                                             score_mod_buffers=(table,))
    grads = vjp(np.ones_like(out))
    assert len(grads) == 4 and grads[3][0].shape == (2, 1)


# -------------------------------------------------------------------------------- mask functions

def same_document(b, h, q_idx, kv_idx, doc):
    return doc[b, q_idx] == doc[b, kv_idx]


def _documents(batch, seqlen, count, seed):
    rng = np.random.default_rng(seed)
    return np.sort(rng.integers(0, count, (batch, seqlen)), axis=1).astype(np.int32)


def test_from_mask_mod_classifies_blocks():
    """Set blocks are those where the function holds for some pair, full ones where it holds for all
    (odd sizes: the last blocks are cut by the sequence ends); heads broadcast."""
    doc = _documents(2, 77, 4, 11)
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 2, 1, 77, 77, block_size=(16, 32), buffers=(doc,))
    pairs = doc[:, :, None] == doc[:, None, :]
    padded = np.zeros((2, 80, 96), bool)
    padded[:, :77, :77] = pairs
    some = padded.reshape(2, 5, 16, 3, 32).any(axis=(2, 4))
    filled = np.ones((2, 80, 96), bool)
    filled[:, :77, :77] = pairs
    every = filled.reshape(2, 5, 16, 3, 32).all(axis=(2, 4))
    np.testing.assert_array_equal(mask.layout[:, 0], some)
    np.testing.assert_array_equal(mask.mask_mod[2][:, 0], every & some)


@pytest.mark.parametrize("block", [32, 64])
def test_mask_mod_lists_mark_tiles_over_blocks_that_are_not_full(block):
    """The tile lists the kernels read mark partial every tile that covers a block where the function does
    not hold for every pair (the causal diagonal), at the mask's own block size too, where a plain layout's
    tiles are never partial."""
    mask = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki: ki <= qi, 1, 1, 256, 256, block_size=(block, block))
    pairs = np.tri(256, dtype=bool)
    for tile in (32, 64, 128):
        lists = mask.tile_lists(np, tile, tile)
        for t in range(256 // tile):
            entries = lists.kv_index[0, 0, t, :lists.kv_count[0, 0, t]]
            rows = pairs[t * tile:(t + 1) * tile]
            seen = {c for c in range(256 // tile) if rows[:, c * tile:(c + 1) * tile].any()}
            assert seen <= set(entries >> 1)  # every tile with a visible pair is visited
            for entry in entries:  # a tile run without the mask holds no hidden pair
                assert entry & 1 or rows[:, (entry >> 1) * tile:((entry >> 1) + 1) * tile].all()
            assert (entries & 1)[list(entries >> 1).index(t)] == 1  # the diagonal tile


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
def test_document_mask_against_the_oracle(dtype):
    doc = _documents(2, 150, 5, 12)
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 2, 1, 150, 150, block_size=(64, 64), buffers=(doc,))
    check_dense(np, (2, 150, 150, 4, 2, 16, 16), dtype, causal=True, block_mask=mask)


def test_mask_mods_equal_their_built_in_forms():
    """A sliding window and causal written as a mask_mod give window_size's results; a prefix-LM mask
    (bidirectional prefix, causal after it) matches its dense boolean form."""
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal((1, 90, 2, 16)) for _ in range(3))
    window = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki: (ki <= qi) & (qi - ki <= 20), 1, 1, 90, 90,
                                               block_size=(32, 32))
    np.testing.assert_allclose(cupyflash.flash_attention(q, k, v, block_mask=window),
                               cupyflash.flash_attention(q, k, v, window_size=(20, 0)), rtol=1e-12, atol=1e-12)
    prefix = np.array([30], np.int32)
    lm = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki, n: (ki < n[0]) | (ki <= qi), 1, 1, 90, 90,
                                           block_size=(16, 16), buffers=(prefix,))
    out = cupyflash.flash_attention(q, k, v, block_mask=lm)
    allowed = (np.arange(90)[None, :] < 30) | (np.arange(90)[None, :] <= np.arange(90)[:, None])
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
    s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v), atol=1e-12)


def test_mask_mod_index_out_of_range_makes_its_rows_nan():
    """A mask_mod load past its buffer leaves the pair visible with a NaN score (README): with keys 10 and
    11 past a 10-entry buffer, the causal rows that see them (6 and 7: bottom-right, 8 queries, 12 keys)
    come out NaN, out and lse, the others finite and equal to the oracle's."""
    rng = np.random.default_rng(29)
    q, k, v = (rng.standard_normal((1, n, 2, 16)) for n in (8, 12, 12))
    mask = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki, d: d[ki] == 0, 1, 1, 8, 12, block_size=(4, 4),
                                             buffers=(np.zeros(10, np.int32),))
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, block_mask=mask, return_lse=True)
    rows = np.arange(8) >= 6
    assert (np.isnan(out).all(axis=(0, 2, 3)) == rows).all() and (np.isnan(lse).all(axis=(0, 1)) == rows).all()
    assert np.isfinite(out[:, ~rows]).all()
    want = reference.attention(q, k, v, causal=True, block_mask=mask)
    np.testing.assert_allclose(out[:, ~rows], want[0][:, ~rows], atol=1e-12)
    np.testing.assert_allclose(lse[..., ~rows], want[1][..., ~rows], atol=1e-12)


def test_mask_keeps_its_own_buffers():
    """A BlockMask copies its buffers: writing the caller's array afterwards changes neither its blocks nor
    the function the calls evaluate."""
    doc = _documents(1, 64, 3, 15)
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, 64, 64, block_size=(16, 16), buffers=(doc,))
    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal((1, 64, 2, 8)) for _ in range(3))
    before = cupyflash.flash_attention(q, k, v, block_mask=mask)
    doc[:] = 0
    np.testing.assert_array_equal(cupyflash.flash_attention(q, k, v, block_mask=mask), before)


def test_mask_mod_arguments_are_checked():
    with pytest.raises(TypeError, match="must return a bool"):
        cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki: qi - ki, 1, 1, 8, 8, block_size=(4, 4))
    mask = cupyflash.BlockMask.from_mask_mod(lambda b, h, qi, ki: ki <= qi, 1, 1, 8, 8, block_size=(4, 4))
    q = np.ones((1, 6, 1, 8))
    with pytest.raises(ValueError, match="built by from_mask_mod"):
        cupyflash.flash_attention(q, q, q, block_mask=mask)


def test_kvcache_score_mod_is_the_builtin_alibi():
    """flash_attention_with_kvcache with ALiBi written as a score_mod (the keys per entry from a buffer: kv_idx
    counts from the start of the entry's cache, q_idx from the first new query) gives the built-in
    alibi_slopes' result, with new keys appended and a paged cache."""
    rng = np.random.default_rng(24)
    batch, seqlen_q, heads, heads_k, d, page = 3, 2, 4, 2, 16, 8
    q = rng.standard_normal((batch, seqlen_q, heads, d)).astype(F32)
    k_new, v_new = (rng.standard_normal((batch, seqlen_q, heads_k, d)).astype(F32) for _ in range(2))
    cache_seqlens = np.array([3, 17, 30], np.int32)
    slopes = rng.uniform(0.1, 1.0, heads).astype(F32)
    keys = cache_seqlens + seqlen_q

    def alibi(s, b, h, qi, ki, sl, n):
        return s - sl[h] * mods.abs(qi + n[b] - seqlen_q - ki)

    caches = [rng.standard_normal((12, page, heads_k, d)).astype(F32) for _ in range(2)]
    table = rng.permutation(12).astype(np.int32).reshape(batch, 4)
    results = []
    for options in ({"alibi_slopes": slopes}, {"score_mod": alibi, "score_mod_buffers": (slopes, keys)}):
        k_cache, v_cache = (x.copy() for x in caches)  # each call appends the new keys into its own copy
        results.append(cupyflash.flash_attention_with_kvcache(
            q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=cache_seqlens, block_table=table, causal=True,
            return_lse=True, **options))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-5, atol=1e-6)
    # The float64 reference takes the same function, with the same b, q_idx and kv_idx.
    want = reference.attention_with_kvcache(q, *caches, k=k_new, v=v_new, cache_seqlens=cache_seqlens, block_table=table,
                                            causal=True, score_mod=alibi, score_mod_buffers=(slopes, keys))
    np.testing.assert_allclose(results[1][0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(results[1][1], want[1], rtol=1e-5, atol=1e-5)


_EXACT_SUM_DRIVER = r"""
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>
#include "common/exact_sum.cuh"
struct Words {
    long long* w;
    void add(int k, long long v) { w[k] += v; }
    void set(int k, long long bits) { w[k] |= bits; }
};
template <typename F>
F sum(const std::vector<F>& xs, int order) {
    std::vector<long long> words(cupyflash::exact_sum_slots<F>(), 0);
    Words sink{words.data()};
    // Every element once: as given (order 0), reversed (1), or the odd positions first, then the even
    // ones (2): three different orders of any three or more elements.
    std::vector<size_t> at(xs.size());
    std::iota(at.begin(), at.end(), 0);
    if (order == 1) std::reverse(at.begin(), at.end());
    if (order == 2) std::stable_partition(at.begin(), at.end(), [](size_t i) { return i % 2 == 1; });
    for (size_t i : at) cupyflash::exact_sum_add(xs[i], sink);
    return cupyflash::exact_sum_finish<F>(words.data());
}
int main(int argc, char** argv) {
    const bool single = argv[1][0] == 'f';
    std::vector<float> f;
    std::vector<double> d;
    for (int i = 2; i < argc; ++i) {
        const double x = strtod(argv[i], nullptr);
        f.push_back(static_cast<float>(x));
        d.push_back(x);
    }
    for (int order : {0, 1, 2}) {
        if (single) printf("%a\n", static_cast<double>(sum(f, order)));
        else printf("%a\n", sum(d, order));
    }
    return 0;
}
"""


def _correctly_rounded(exact, dtype):
    """The Fraction ``exact`` rounded to ``dtype`` to nearest, ties to even (inf past the largest)."""
    import fractions

    if dtype == np.float64:
        try:
            return float(exact)  # int / int division, correctly rounded
        except OverflowError:
            return (math.inf if exact > 0 else -math.inf)
    x = np.float32(float(exact)) if abs(exact) < 2**129 else np.float32((math.inf if exact > 0 else -math.inf))
    if not np.isfinite(x):
        return float(x)
    with np.errstate(over="ignore"):  # the neighbour of the largest finite value
        candidates = [np.nextafter(x, np.float32(-np.inf)), x, np.nextafter(x, np.float32(np.inf))]
    finite = [c for c in candidates if np.isfinite(c)]
    best = min(finite, key=lambda c: (abs(fractions.Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1))
    top = np.finfo(np.float32).max
    if abs(exact) >= fractions.Fraction(float(top)) + fractions.Fraction(2.0**103):  # past max + half an ulp
        return (math.inf if exact > 0 else -math.inf)
    return float(best)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_exact_sums_are_correctly_rounded(tmp_path, dtype):
    """kernels_cu/common/exact_sum.cuh (the deterministic backward's buffer gradients) built as host C++:
    sums whose order cannot matter (integer digits) come out as the exact sum correctly rounded: values
    of both signs over 60 binades, subnormals alone and deciding a rounding, a result that borrows through
    the low digits, the largest finite values cancelling and overflowing past the last word; infinities
    and NaN as float sums give them."""
    import fractions

    info = np.finfo(dtype)
    tiny, big, eps = info.smallest_subnormal, info.max, info.eps
    rng = np.random.default_rng(29)
    cases = [
        list((rng.standard_normal(96) * np.exp2(rng.integers(-30, 30, 96))).astype(dtype)),
        [tiny * 3, tiny * 5, -tiny],
        [dtype(1), eps / 2, tiny],                       # the subnormal breaks the tie: rounds up
        [dtype(1), eps / 2],                             # a tie: to even (1)
        [dtype(-1), tiny],                               # borrows through every digit below
        [dtype(-1), eps / 4, -tiny],
        [big] * 3 + [-big] * 2 + [dtype(1.5)],           # the largest values cancelling
        [big] * 2048,                                    # past the last word: overflows to inf
        [-big] * 2048,
    ]
    binary = _host_build(tmp_path, "exact", _EXACT_SUM_DRIVER)
    kind = "f" if dtype == np.float32 else "d"
    for values in cases:
        run = subprocess.run([binary, kind, *[repr(float(x)) for x in values]], check=True, capture_output=True,
                             text=True)
        results = [float.fromhex(x) for x in run.stdout.split()]
        assert len(set(results)) == 1, values[:4]  # every order, the same bits
        want = _correctly_rounded(sum(fractions.Fraction(float(x)) for x in values), dtype)
        assert results[0] == want, (values[:4], results[0], want)
    for extra, expect in (([np.inf], np.inf), ([-np.inf], -np.inf), ([np.inf, -np.inf], np.nan), ([np.nan], np.nan)):
        run = subprocess.run([binary, kind, "1.0", *map(repr, extra)], check=True, capture_output=True, text=True)
        got = float.fromhex(run.stdout.split()[0])
        assert (np.isnan(got) and np.isnan(expect)) or got == expect, (extra, got)
