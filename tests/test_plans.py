"""Plans (cupyflash/_plan.py): a call of a layout already seen runs its plan, and a plan never goes stale.
A new address, stride, shape, dtype, stream or device must give the right answer; the cache is
bounded. The CPU tests check the builder and the cache; the GPU tests check every family's plans
against the float64 oracle with the tolerance rule."""

import ml_dtypes
import numpy as np
import pytest
from helpers import (
    DTYPES,
    GRAD_FACTOR,
    OUTPUT_FACTOR,
    assert_within_rule,
    gpu_available,
    oracle,
    plain,
    random_normal,
    random_qkv,
    use_family,
)

import cupyflash
from cupyflash import _api, _keys, _plan

if gpu_available():
    import cupy
else:
    cupy = None


class _Fake:
    """What PlanBuilder.input reads of an array, for the CPU tests."""

    class _Data:
        def __init__(self, ptr):
            self.ptr = ptr

    def __init__(self, shape, ptr, dtype=np.float32):
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.strides = _plan.Slot(0, shape, dtype).strides
        self.data = self._Data(ptr)


def test_sentinels_tell_apart_arrays_that_share_an_address():
    """Regression guard: q, k and v of one call may be one array (flash_attention(x, x, x)); the plan must
    still write each of the next call's arrays where that argument goes."""
    b = _plan.PlanBuilder()
    x = _Fake((2, 8), 4096)
    slots = [b.input(x) for _ in range(3)]
    assert b.input(None) is None
    out = b.output((2, 8), np.float32)
    fields = [("a", np.uint64), ("n", np.int32), ("b", np.uint64), ("c", np.uint64), ("o", np.uint64)]
    struct = b.struct(np.dtype(fields, align=True))
    struct[0] = (slots[2].data.ptr, 7, slots[0].data.ptr, slots[1].data.ptr, out.data.ptr)
    plan = b.build((out,))
    words = [inp[0] for inp in plan._inputs]
    assert words[:3] == [(2,), (3,), (0,)]   # q in field b, k in c, v in a (8-byte words of the buffer)
    assert words[3] == ()                   # the absent input
    assert len(plan._buffers) == 1 and plan._buffers[0][0] == (4,)
    assert plan._buffer.view(np.int32)[2] == 7  # other fields are kept as written


def test_zeroed_workspaces_are_zeroed_on_both_paths():
    """A zeroed workspace and counters the kernels leave zero are zeroed in the call's allocation where the
    kernels are launched, and live in the graph's memory otherwise: the workspace first, in the span of
    the graph's memset node, the counters after it (zeroed once). The first run is interpreted; the
    generated run of a plan with no graph makes one outside a capture."""
    b = _plan.PlanBuilder()
    kept = b.counters(3)
    counter = b.workspace((1,), np.int32, zeroed=True)
    struct = b.struct(np.dtype([("kept", np.uint64), ("counter", np.uint64)]))
    struct["kept"], struct["counter"] = kept.data.ptr, counter.data.ptr
    b.launch(1234, (1, 1, 1), 32, (struct,))
    plan = b.build(())
    assert plan._buffers == ()
    assert plan._zeroed == (((1,), (), 256, 0, 4), ((0,), (), 0, 256, 12))  # (words, maps, offset, graph offset, bytes)
    assert (plan._memset_nbytes, plan._zeroed_nbytes) == (256, 512)
    assert plan.run == plan._first_run and plan.source is None
    plan._compile()
    assert "memset(p, 0, 4, stream)" in plan.source and "memset(p, 0, 12, stream)" in plan.source
    assert "if not capturing(stream): return" in plan.source  # no graph yet


def test_plan_cache_is_bounded_and_drops_the_oldest():
    cache = _plan.PlanCache(limit=3)
    for key in range(5):
        cache.put(key, object())
    assert len(cache) == 3
    assert cache.get(0) is None and cache.get(1) is None and cache.get(4) is not None
    cache.put(4, object())  # an existing key takes no room
    assert len(cache) == 3 and cache.get(2) is not None


def test_numpy_calls_have_no_key():
    q = np.zeros((1, 4, 1, 8), np.float32)
    assert _keys.forward(q, q, q, False, None, (-1, -1), 0.0, None, None, False, "highest") is None


_gpu = pytest.mark.gpu


def _judge(got, q, k, v, dout, **options):
    """The tolerance rule for a forward and backward's results ``got`` (out, lse, dq, dk, dv)."""
    ref = oracle(q, k, v, dout=dout, **options)
    base = plain(q, k, v, dout=dout, **options)
    for name, value in zip(("out", "lse", "dq", "dk", "dv"), got):
        assert_within_rule(name, value, ref[name], base[name], OUTPUT_FACTOR if name in ("out", "lse") else GRAD_FACTOR)


def _inputs(shape, dtype, seed, heads_k=None):
    batch, seqlen, heads, headdim = shape
    q, k, v = random_qkv(cupy, batch, seqlen, seqlen, heads, heads_k or heads, headdim, headdim, DTYPES[dtype], seed)
    dout = random_normal(cupy, q.shape, DTYPES[dtype], np.random.default_rng(seed + 1))
    return q, k, v, dout


def _run(q, k, v, dout, **options):
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
    return (out, lse, *cupyflash.flash_attention_backward(dout, q, k, v, out, lse, **options))


@_gpu
@pytest.mark.parametrize("family, dtype", [("sm90", "bfloat16"), ("sm80", "float16"), ("general", "float32")])
@pytest.mark.parametrize("options", [{"causal": True}, {"window_size": (37, 5), "softcap": 4.0}],
                         ids=["causal", "window-softcap"])
def test_a_plan_serves_new_arrays_of_its_layout(family, dtype, options, monkeypatch):
    """The second and third calls of a layout run its plan with other arrays (other addresses, so the
    Hopper kernels' tensor maps move), the third with q, k and v one array."""
    use_family(monkeypatch, family)
    _api.PLANS.clear()
    shape = (2, 203, 4, 64)
    first = _inputs(shape, dtype, 1)
    _judge(_run(*first, **options), *first, **options)
    plans = len(_api.PLANS)
    second = _inputs(shape, dtype, 2)
    _judge(_run(*second, **options), *second, **options)
    assert len(_api.PLANS) == plans, "a call of a planned layout made a new plan"
    same = second[0]
    _judge(_run(same, same, same, second[3], **options), same, same, same, second[3], **options)
    # And back to distinct arrays: the one-array call must not have taught the plan that q is k.
    _judge(_run(*first, **options), *first, **options)


@_gpu
@pytest.mark.parametrize("family, dtype", [("sm90", "bfloat16"), ("general", "float32")])
def test_sinks_and_the_maximum_score_have_plans(family, dtype, monkeypatch):
    """The kernels join the sinks and keep the maximum score, so such calls have plans of their own: a second
    call with other sinks of the same layout runs the plan, with its sinks; forward (out, lse, max_score) and
    backward (dq, dk, dv, dsinks from bwd_delta's terms) against the oracle."""
    use_family(monkeypatch, family)
    _api.PLANS.clear()
    q, k, v, dout = _inputs((2, 150, 4, 64), dtype, 3, heads_k=2)
    names = ("out", "lse", "max_score", "dq", "dk", "dv", "dsinks")
    plans = None
    for seed in (4, 5, 6):
        sinks = cupy.asarray(np.random.default_rng(seed).standard_normal(4).astype(np.float32))
        if seed == 6:  # strided sinks: no plan (a run passes the address it is given), the checked path
            wide = cupy.zeros(8, np.float32)
            wide[::2] = sinks
            sinks = wide[::2]
        out, lse, top = cupyflash.flash_attention(q, k, v, causal=True, sinks=sinks, return_lse=True,
                                                  return_max_score=True)
        got = (out, lse, top, *cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, sinks=sinks))
        ref = oracle(q, k, v, dout=dout, causal=True, sinks=sinks)
        base = plain(q, k, v, dout=dout, causal=True, sinks=sinks)
        for name, value in zip(names, got):
            factor = OUTPUT_FACTOR if name in ("out", "lse", "max_score") else GRAD_FACTOR
            assert_within_rule(name, value, ref[name], base[name], factor, ref["dsinks_floor"] if name == "dsinks" else 0)
        if plans is None:
            plans = len(_api.PLANS)
            assert plans == 2, "a forward and a backward plan"
        else:
            assert len(_api.PLANS) == plans, "a call of a planned layout made a new plan"


@_gpu
def test_shapes_strides_and_dtypes_get_their_own_plans():
    _api.PLANS.clear()
    q, k, v, dout = _inputs((1, 130, 2, 64), "bfloat16", 3)
    _judge(_run(q, k, v, dout, causal=True), q, k, v, dout, causal=True)
    # A (batch, heads, seqlen, headdim) array's transposed view: other strides, read in place.
    qt, kt, vt = (cupy.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (q, k, v))
    _judge(_run(qt, kt, vt, dout, causal=True), qt, kt, vt, dout, causal=True)
    # A last axis with stride 2 is copied on every run of its plan.
    wide = [cupy.repeat(x, 2, axis=3) for x in (q, k, v)]
    strided = [x[..., ::2] for x in wide]
    _judge(_run(*strided, dout, causal=True), *strided, dout, causal=True)
    for x in wide:
        x[...] = cupy.asarray(np.random.default_rng(9).standard_normal(x.shape).astype(x.dtype))
    _judge(_run(*strided, dout, causal=True), *strided, dout, causal=True)
    shorter = _inputs((1, 77, 2, 64), "bfloat16", 4)
    _judge(_run(*shorter, causal=True), *shorter, causal=True)
    half = _inputs((1, 130, 2, 64), "float16", 5)
    _judge(_run(*half, causal=True), *half, causal=True)
    assert len(_api.PLANS) == 2 * 5


@_gpu
def test_a_plan_runs_on_the_current_stream():
    q, k, v, dout = _inputs((1, 256, 2, 128), "bfloat16", 6)
    _run(q, k, v, dout)  # the plan
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        # Inputs made on the stream: a call on another stream would read them unfinished.
        q2, k2, v2 = (x * 2 for x in (q, k, v))
        got = _run(q2, k2, v2, dout)
    stream.synchronize()
    _judge(got, q2, k2, v2, dout)


@_gpu
def test_a_planned_call_can_be_captured_in_a_graph():
    q, k, v, _ = _inputs((1, 256, 4, 64), "bfloat16", 7)
    cupyflash.flash_attention(q, k, v, causal=True)  # compiles and plans outside the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = cupyflash.flash_attention(q, k, v, causal=True)
        graph = stream.end_capture()
    for seed in (8, 9):
        with stream:  # (a non-blocking stream does not wait for the default stream's work)
            fresh = random_qkv(cupy, 1, 256, 256, 4, 4, 64, 64, DTYPES["bfloat16"], seed)
            for dst, src in zip((q, k, v), fresh):
                dst[...] = src
        graph.launch(stream)
        stream.synchronize()
        assert_within_rule("out", out, oracle(q, k, v, True)["out"], plain(q, k, v, True)["out"], OUTPUT_FACTOR)


@_gpu
def test_a_plan_made_in_a_capture_launches_its_graph_afterwards():
    """A plan first made and run again while the stream is captured launches kernels there (a graph launch
    is not captured); its first call outside a capture makes its graph, which the calls after that launch."""
    q, k, v, _ = _inputs((1, 192, 2, 64), "bfloat16", 11)
    cupyflash.flash_attention(q, k, v, causal=True)  # compiles outside the capture
    _api.PLANS.clear()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        # The plan's first run (interpreted) and its second (generated, with no graph) are captured.
        captured = [cupyflash.flash_attention(q, k, v, causal=True) for _ in range(2)]
        graph = stream.end_capture()
        (plan,) = _api.PLANS._plans.values()
        assert plan._graph is None and plan.source is not None
        graph.launch(stream)
        eager = [cupyflash.flash_attention(q, k, v, causal=True) for _ in range(2)]
        assert plan._graph is not None
    stream.synchronize()
    reference = oracle(q, k, v, True)["out"], plain(q, k, v, True)["out"]
    for out in (*captured, *eager):
        assert_within_rule("out", out, *reference, OUTPUT_FACTOR)


@_gpu
def test_the_plan_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(_api.PLANS, "limit", 4)
    _api.PLANS.clear()
    for seqlen in range(40, 50):
        q, k, v, _ = _inputs((1, seqlen, 1, 32), "float16", seqlen)
        out = cupyflash.flash_attention(q, k, v)
        assert_within_rule("out", out, oracle(q, k, v)["out"], plain(q, k, v)["out"], OUTPUT_FACTOR)
        assert len(_api.PLANS) <= 4


@_gpu
def test_varlen_plans_check_cu_seqlens_on_the_device():
    """A planned packed call with max_seqlen given still checks every cu_seqlens it is given."""
    lengths = [5, 40, 17]
    cu = cupy.asarray(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    q, k, v = (random_normal(cupy, (62, 2, 64), DTYPES["bfloat16"], np.random.default_rng(s)) for s in range(3))
    options = dict(max_seqlen_q=40, max_seqlen_k=40, causal=True, return_lse=True)
    good = cupyflash.flash_attention_varlen(q, k, v, cu, cu, **options)
    assert bool(cupy.isfinite(good[0]).all())
    bad = cu.copy()
    bad[1] = 50  # a sequence longer than max_seqlen, then a negative one
    out, lse = cupyflash.flash_attention_varlen(q, k, v, bad, bad, **options)
    assert bool(cupy.isnan(out).all()) and bool(cupy.isnan(lse).all())
    again = cupyflash.flash_attention_varlen(q, k, v, cu, cu, **options)
    cupy.testing.assert_array_equal(again[0], good[0])


@_gpu
def test_decode_plans_check_an_int_cache_seqlens():
    dtype = np.dtype(ml_dtypes.bfloat16)
    q = cupy.asarray(np.random.default_rng(1).standard_normal((1, 1, 8, 64)).astype(dtype))
    cache = cupy.asarray(np.random.default_rng(2).standard_normal((1, 256, 2, 64)).astype(dtype))
    cupyflash.flash_attention_with_kvcache(q, cache, cache, cache_seqlens=100)
    with pytest.raises(ValueError, match=r"cache_seqlens must be in \[0, 256\], got 300"):
        cupyflash.flash_attention_with_kvcache(q, cache, cache, cache_seqlens=300)


@_gpu
@pytest.mark.skipif(cupy is None or cupy.cuda.runtime.getDeviceCount() < 2, reason="needs two GPUs")
def test_a_plan_belongs_to_its_device():
    for device in (0, 1, 0):
        with cupy.cuda.Device(device):
            q, k, v, dout = _inputs((1, 128, 2, 64), "bfloat16", 10 + device)
            _judge(_run(q, k, v, dout), q, k, v, dout)


@_gpu
@pytest.mark.parametrize("family, dtype", [("sm90", "bfloat16"), ("general", "float32")])
def test_dropout_calls_have_plans_that_take_each_seed(family, dtype, monkeypatch):
    """A dropout call's plan takes the seed and offset per run: calls with other seeds and offsets reuse it,
    and each gives the bits of a call of that seed and offset on the checked path (no plan), forward
    and backward; the seeds differ where a plan that kept its first seed would not."""
    use_family(monkeypatch, family)
    q, k, v, dout = _inputs((2, 150, 4, 64), dtype, 3, heads_k=2)

    def run(seed, offset):
        options = dict(causal=True, dropout_p=0.25, dropout_seed=seed, dropout_offset=offset)
        out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
        return [x.get() for x in (out, lse, *cupyflash.flash_attention_backward(dout, q, k, v, out, lse, **options))]

    _api.PLANS.clear()
    planned = [run(seed, offset) for seed, offset in ((4, 0), (2**63 + 9, 2**31 + 1), (4, 1))]
    assert len(_api.PLANS) == 2, "one forward and one backward plan for every seed and offset"
    for (seed, offset), got in zip(((4, 0), (2**63 + 9, 2**31 + 1), (4, 1)), planned):
        _api.PLANS.clear()
        monkeypatch.setattr(_api, "_planned_dropout", lambda *args: None)  # the checked path, the seed built in
        expected = run(seed, offset)
        monkeypatch.undo()
        use_family(monkeypatch, family)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, expected):
            assert np.array_equal(a, b, equal_nan=True), f"{name} of seed {seed}, offset {offset}"
    assert not np.array_equal(planned[0][0], planned[2][0]), "another offset drops other probabilities"
