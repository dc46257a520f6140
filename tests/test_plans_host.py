"""Plans built on the host, without a GPU: every family's forward and backward plan for problems with the
features the CUDA paths take (masks, score modifications, packed batches, seqused_k, sinks, dropout, the
maximum score, score functions, deterministic sums), on an H200 and an A100 as dispatch describes them.

The plans' kernels are not loaded (common.function returns the variant's key) and their tensor maps are
not encoded (sm90._encode records its fields), so what runs is everything a call does on the host before
its first launch: dispatch, the argument structs filled field by field or positionally, the tensor maps'
views and boxes, the workspaces. A struct that gains a field its filler misses, a plan slot of the wrong
kind, or a dtype without a TMA code fails here, in CI, instead of on the first GPU run."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from cupyflash import _params, _plan, _problem, mods
from cupyflash._families import common, general, sm80, sm90

H200 = common.Device(90, 227 * 1024, 132)
A100 = common.Device(80, 163 * 1024, 108)
FAMILIES = {"sm90": (sm90.FORWARD, sm90.BACKWARD), "sm80": (sm80.FORWARD, sm80.BACKWARD),
            "general": (general.FORWARD, general.BACKWARD)}


@pytest.fixture(autouse=True)
def _no_device(monkeypatch):
    """Kernels stay unloaded, tensor maps unencoded and the driver's occupancy unasked (clusters of the
    paired forward: as many as half of the H200's SMs)."""
    monkeypatch.setattr(common, "function", lambda variant, smem=0: variant.key)
    monkeypatch.setattr(sm90, "_encode", lambda ptr, **fields: bytes(128))
    monkeypatch.setattr(sm90, "max_active_clusters", lambda function, threads, smem, ctas, device: 66)


def _slots(p, operands):
    """Problem ``p`` (checked on NumPy arrays) as a plan sees it: its arrays plan slots, and the operands'."""
    index = iter(range(len(operands), 100))
    fields = {}
    for name in ("alibi_slopes", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "sinks"):
        x = getattr(p, name)
        if x is not None:
            fields[name] = _plan.Slot(next(index), x.shape, x.dtype)
    if p.user_buffers is not None:
        fields["user_buffers"] = tuple(_plan.Slot(next(index), x.shape, x.dtype) for x in p.user_buffers)
    slots = tuple(_plan.Slot(i, x.shape, x.dtype) for i, x in enumerate(operands))
    return dataclasses.replace(p, **fields), slots


def _table_bias(s, b, h, q_idx, kv_idx, table):
    return s + table[h, mods.clip(kv_idx - q_idx + 8, 0, 16)]


CASES = {
    "causal-gqa": dict(causal=True),
    "window-softcap": dict(window_size=(40, 3), softcap=20.0),
    "alibi": dict(alibi=True),
    "sinks": dict(sinks=True),
    "dropout": dict(dropout_p=0.25, dropout_seed=3, causal=True),
    "max-score": dict(max_score=True, causal=True),
    "score-mod": dict(score_mod=_table_bias, causal=True),
    "varlen-seqused": dict(varlen=True, causal=True),
}


def _problem_of(dtype, case, headdim=64):
    """A checked NumPy problem of ``case`` and its q, k, v (GQA 4/2, odd lengths)."""
    rng = np.random.default_rng(0)
    options = dict(CASES[case])
    q, k, v = (np.zeros(shape, dtype) for shape in ((2, 77, 4, headdim), (2, 101, 2, headdim), (2, 101, 2, headdim)))
    if options.pop("alibi", False):
        options["alibi_slopes"] = np.full(4, 0.5, np.float32)
    if options.pop("sinks", False):
        options["sinks"] = rng.standard_normal(4).astype(np.float32)
    max_score = options.pop("max_score", False)
    if options.get("score_mod") is not None:
        options["score_mod_buffers"] = (rng.standard_normal((4, 17)).astype(np.float32),)
    if options.pop("varlen", False):
        cu = np.array([0, 30, 30, 77], np.int32)
        cu_k = np.array([0, 50, 61, 101], np.int32)
        q, k, v = q[0], k[0], v[0]
        p = _problem.varlen_forward_problem(q, k, v, cu, cu_k, max_seqlen_q=47, max_seqlen_k=50,
                                            seqused_k=np.array([50, 0, 40], np.int32),
                                            **options)
    else:
        p = _problem.forward_problem(q, k, v, **options)
    if max_score:
        p = dataclasses.replace(p, max_score=True)
    return p, (q, k, v)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("family, device, dtype", [
    ("sm90", H200, ml_dtypes.bfloat16), ("sm90", H200, np.float32), ("sm80", A100, np.float16),
    ("sm80", A100, np.float32), ("sm80", A100, np.float64), ("general", A100, np.float32),
])
def test_forward_and_backward_plans_build_on_the_host(case, family, device, dtype):
    _check_plans(case, family, device, dtype)


def test_hopper_backward_plan_with_buffer_gradients_builds_on_the_host():
    """The Hopper 16-bit backward that adds an additive score_mod's buffer gradients itself (head dims
    BWD_SCATTER_DIMS; at 64 the sm80 or general kernels add them): its plans build."""
    assert _check_plans("score-mod", "sm90", H200, ml_dtypes.bfloat16, headdim=128)


#: The (family, dtype, case) forwards that decline their problem: dropout runs on the 16-bit Hopper
#: forward and the general kernels only (sm80 has no dropout; float32 on sm90 goes to the general ones).
FORWARD_DECLINES = {("sm90", "float32", "dropout"), ("sm80", "float16", "dropout"), ("sm80", "float32", "dropout"),
                    ("sm80", "float64", "dropout")}


def _check_plans(case, family, device, dtype, headdim=64):
    """Builds the forward plan of ``case`` on ``family`` (or checks that it declines one of
    FORWARD_DECLINES) and, where the family's backward takes the problem (every case but a score_mod whose
    buffers take gradients may decline), the backward plans; returns whether a backward plan was built."""
    forward, backward = FAMILIES[family]
    p, arrays = _problem_of(np.dtype(dtype), case, headdim)
    ps, operands = _slots(p, arrays)
    if p.max_score is not None:
        ps = dataclasses.replace(ps, max_score=_plan.Slot(90, (p.batch, p.heads), np.dtype(np.uint32)))
    user = p.user_score is not None or p.user_mask is not None
    assert not user or getattr(forward, "user_functions", False), f"{family}'s forward compiles no score functions"
    variant = forward.select(ps, device, operands)
    declines = (family, np.dtype(dtype).name, case) in FORWARD_DECLINES
    assert (variant is None) == declines, f"the {family} forward {'takes' if declines else 'declines'} {case}"
    if variant is None:
        return False
    b = _plan.PlanBuilder()
    out, lse = forward.plan(b, variant, ps, *operands, device)
    assert tuple(out.shape) == p.out_shape and tuple(lse.shape) == p.lse_shape
    assert b._launches and all(isinstance(f, str) for f, *_ in b._launches)
    if p.max_score is not None or p.sinks is not None:
        return False  # (their backward is the plain one's, with the sinks' terms: tested below without them)
    bp = dataclasses.replace(ps, max_score=None)
    dout = _plan.Slot(91, out.shape, out.dtype)
    grads = dataclasses.replace(bp, user_grads=tuple(_plan.Slot(92 + n, x.shape, np.dtype(np.float32))
                                                     for n, x in enumerate(p.user_buffers or ())) or None)
    variant = backward.select(grads, device, (dout, *operands))
    if variant is None:
        assert case == "score-mod", f"the {family} backward declines {case}"
        return False
    for deterministic in (False, True):
        b = _plan.PlanBuilder()
        backward.plan(b, variant, grads, dout, *operands, _plan.Slot(93, out.shape, out.dtype), lse, deterministic,
                      device)
        assert b._launches
    return True


class _DeviceArray:
    """A stand-in for a C-contiguous CuPy array: what plans read of one (shape, dtype, strides, address)."""

    def __init__(self, shape, dtype, address):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.strides = np.empty(0, self.dtype).itemsize * np.array(
            [int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape))], np.int64)
        self.strides = tuple(int(s) for s in self.strides)
        self.flags = type("Flags", (), {"c_contiguous": True})()
        self.data = type("Data", (), {"ptr": address})()
        self.ndim, self.itemsize, self.size = len(self.shape), self.dtype.itemsize, int(np.prod(self.shape))


@pytest.mark.parametrize("options", [{}, {"paged": True}, {"leftpad": True}, {"rotary": True, "new": 2},
                                     {"new": 1, "max_score": True, "splits": 3}])
def test_decode_plans_build_on_the_host(options):
    """The decode kernel's plan (cupyflash/_kvcache/device.py's DecodePlan) for dense and paged caches, left
    padding, appended and rotated tokens, splits and the maximum score: its argument structs filled and its
    launches made, from stand-ins for CuPy arrays."""
    from cupyflash._kvcache import call, device

    batch, heads, heads_k, d, capacity, new = 3, 8, 2, 128, 256, options.get("new", 0)
    addresses = iter(range(1 << 20, 1 << 30, 1 << 16))

    def array(shape, dtype):
        return _DeviceArray(shape, dtype, next(addresses))

    page = 16 if options.get("paged") else 0
    k_cache = array((batch * capacity // page, page, heads_k, d) if page else (batch, capacity, heads_k, d),
                    ml_dtypes.bfloat16)
    fields = dict(k=array((batch, new, heads_k, d), ml_dtypes.bfloat16) if new else None,
                  v=array((batch, new, heads_k, d), ml_dtypes.bfloat16) if new else None,
                  cache_seqlens=array((batch,), np.int32),
                  block_table=array((batch, capacity // page), np.int32) if page else None,
                  cache_leftpad=array((batch,), np.int32) if options.get("leftpad") else None)
    if options.get("rotary"):
        fields["rotary_cos"] = array((capacity, 32), ml_dtypes.bfloat16)
        fields["rotary_sin"] = array((capacity, 32), ml_dtypes.bfloat16)
    q = array((batch, 1, heads, d), ml_dtypes.bfloat16)
    host = call.check(np.zeros(q.shape, q.dtype), np.zeros(k_cache.shape, k_cache.dtype), np.zeros(k_cache.shape,
                      k_cache.dtype), k=None if not new else np.zeros(fields["k"].shape, q.dtype),
                      v=None if not new else np.zeros(fields["k"].shape, q.dtype),
                      cache_seqlens=np.zeros(batch, np.int32),
                      cache_batch_idx=None, block_table=np.zeros((batch, capacity // page), np.int32) if page else None,
                      rotary_cos=np.zeros((capacity, 32), q.dtype) if options.get("rotary") else None,
                      rotary_sin=np.zeros((capacity, 32), q.dtype) if options.get("rotary") else None,
                      rotary_interleaved=False, causal=True, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                      softmax_scale=None, num_splits=options.get("splits", 0), max_splits=128, precision="highest",
                      cache_leftpad=np.zeros(batch, np.int32) if options.get("leftpad") else None)
    c = dataclasses.replace(host, xp=None, q=q, k_cache=k_cache, v_cache=k_cache, k_new=fields["k"], v_new=fields["v"],
                            **{n: fields.get(n) for n in ("cache_seqlens", "block_table", "cache_leftpad", "rotary_cos",
                                                          "rotary_sin")})
    variant = device.decode_variant(c, H200, options.get("max_score", False))
    assert variant is not None
    plan = device.DecodePlan(c, variant, H200, None, True, False, options.get("max_score", False))
    assert plan.plan is not None


@pytest.mark.parametrize("heads, seqlen_q, page, kernel", [
    (128, 1, 64, "kvc_mla_sm90"), (32, 2, 0, "kvc_mla_sm90"), (64, 1, 128, "kvc_mla_sm90"), (16, 1, 64, "kvc_mla_sm90"),
    (128, 1, 16, "kvc_mla_"), (15, 1, 0, "kvc_mla_"), (8, 1, 64, "kvc_mla_")])
def test_mla_plans_build_on_the_host(heads, seqlen_q, page, kernel, monkeypatch):
    """An MLA call's plan on an H200 (a latent cache of 576 columns, v_cache the view of its first 512):
    16 or more (query, head) rows a batch entry (MLA_SM90_MIN_ROWS) over a dense cache or pages of a multiple of 64 rows take
    the Hopper kernel (kvc_mla_sm90: 64-row CTAs of 256 threads, the cache's tensor map as its second
    argument), the others the mma.sync one (16-row CTAs of 128 threads)."""
    from cupyflash._kvcache import call, device

    batch, capacity = 3, 512
    addresses = iter(range(1 << 20, 1 << 34, 1 << 24))
    cache_shape = (batch * capacity // page, page, 1, 576) if page else (batch, capacity, 1, 576)
    table = np.zeros((batch, capacity // page), np.int32) if page else None
    host = call.check(np.zeros((batch, seqlen_q, heads, 576), ml_dtypes.bfloat16), np.zeros(cache_shape, ml_dtypes.bfloat16),
                      np.zeros(cache_shape, ml_dtypes.bfloat16)[..., :512], k=None, v=None,
                      cache_seqlens=np.zeros(batch, np.int32), cache_batch_idx=None, block_table=table, rotary_cos=None,
                      rotary_sin=None, rotary_interleaved=False, causal=True, window_size=(-1, -1), softcap=0.0,
                      alibi_slopes=None, softmax_scale=None, num_splits=0, max_splits=128, precision="highest")
    cache = _DeviceArray(cache_shape, ml_dtypes.bfloat16, next(addresses))
    values = _DeviceArray(cache_shape[:3] + (512,), ml_dtypes.bfloat16, cache.data.ptr)
    values.strides = cache.strides  # the view k_cache[..., :512]
    c = dataclasses.replace(host, xp=None, q=_DeviceArray((batch, seqlen_q, heads, 576), ml_dtypes.bfloat16,
                                                          next(addresses)),
                            k_cache=cache, v_cache=values, cache_seqlens=_DeviceArray((batch,), np.int32, next(addresses)),
                            block_table=None if table is None else _DeviceArray(table.shape, np.int32, next(addresses)))
    variant = device.decode_variant(c, H200)
    assert variant.key.startswith(kernel)
    launches = []
    monkeypatch.setattr(common, "function", lambda variant, smem=0: variant.key)
    launch = _plan.PlanBuilder.launch
    monkeypatch.setattr(_plan.PlanBuilder, "launch", lambda self, *args: launches.append(args) or launch(self, *args))
    device.DecodePlan(c, variant, H200, None, True, False)
    (function, grid, threads, structs, smem), = [x for x in launches if x[0].startswith("kvc_mla")]
    rows = device.rows_per_cta(variant)
    assert grid[0] % -(-seqlen_q * heads // rows) == 0 and grid[1:] == (1, batch)
    if kernel == "kvc_mla_sm90":
        assert (rows, threads, smem, len(structs)) == (64, 256, device.MLA_SM90_SMEM, 2)
        assert structs[1].dtype == device.MLA_SM90_MAP
    else:
        assert (rows, threads, len(structs)) == (16, 128, 1)


@pytest.mark.parametrize("options", [{"int_seqlens": True}, {"rotary": True, "new": 3}, {"paged": True},
                                     {"dtype": np.float32, "new": 2}])
def test_general_plans_build_on_the_host(options, monkeypatch):
    """The general path's plan (cupyflash/_kvcache/device.py's GeneralPlan) of a prefill chunk: a dense cache
    with more entries than the batch (its first entries as a view of the same address), cache_seqlens as an
    int or an array, new tokens appended and rotated first, float32 on the planes kernel, a paged cache read
    in place by the Hopper forward; its launches in order, from stand-ins for CuPy arrays."""
    from cupyflash._kvcache import call, device

    batch, seqlen_q, heads, heads_k, d, capacity = 3, 128, 32, 8, 128, 512
    new, page, dtype = options.get("new", 0), 64 if options.get("paged") else 0, options.get("dtype", ml_dtypes.bfloat16)
    addresses = iter(range(1 << 20, 1 << 30, 1 << 16))
    entries = batch * capacity // page if page else batch + 2

    def both(shape, dtype):
        """A NumPy array of zeros for the checks and a stand-in of the same layout for the plan."""
        return np.zeros(shape, dtype), _DeviceArray(shape, dtype, next(addresses))

    arrays = {"q": both((batch, seqlen_q, heads, d), dtype),
              "k_cache": both((entries, page or capacity, heads_k, d), dtype),
              "cache_seqlens": None if options.get("int_seqlens") else both((batch,), np.int32),
              "k": both((batch, new, heads_k, d), dtype) if new else None,
              "block_table": both((batch, capacity // page), np.int32) if page else None,
              "rotary_cos": both((capacity + seqlen_q, 32), dtype) if options.get("rotary") else None}
    host = {n: None if x is None else x[0] for n, x in arrays.items()}
    checked = call.check(host["q"], host["k_cache"], host["k_cache"], k=host["k"], v=host["k"],
                         cache_seqlens=100 if options.get("int_seqlens") else host["cache_seqlens"],
                         cache_batch_idx=None, block_table=host["block_table"], rotary_cos=host["rotary_cos"],
                         rotary_sin=host["rotary_cos"], rotary_interleaved=False, causal=True, window_size=(-1, -1),
                         softcap=0.0, alibi_slopes=None, softmax_scale=None, num_splits=0, max_splits=128,
                         precision="highest")
    stand_ins = {n: None if x is None else x[1] for n, x in arrays.items()}
    c = dataclasses.replace(checked, xp=None, q=stand_ins["q"], k_cache=stand_ins["k_cache"],
                            v_cache=stand_ins["k_cache"], k_new=stand_ins["k"], v_new=stand_ins["k"],
                            cache_seqlens=stand_ins["cache_seqlens"], block_table=stand_ins["block_table"],
                            rotary_cos=stand_ins["rotary_cos"], rotary_sin=stand_ins["rotary_cos"])
    assert device.decode_variant(c, H200) is None and device.general_plannable(c, H200, False)
    launched = []
    monkeypatch.setattr(common, "function", lambda variant, smem=0: launched.append(variant.key) or variant.key)
    plan = device.GeneralPlan(c, H200, None, True, bool(options.get("int_seqlens")))
    appends = ["kvc_append"] if new or options.get("rotary") else []
    poisons = ["kvc_poison"] * 2 if not options.get("int_seqlens") else []
    families = [key.split("_")[0] for key in launched]
    forward = launched[len(appends) + 1:len(launched) - len(poisons)]
    assert [key[:10] for key in launched[:len(appends) + 1]] == appends + ["kvc_length"]
    assert [key[:10] for key in launched[len(launched) - len(poisons):]] == poisons
    assert families[len(appends) + 1:len(launched) - len(poisons)][-1] == "sm90", forward
    assert plan.scalars == (1 + bool(appends)) and (plan.capacity is None) != bool(options.get("int_seqlens"))


@pytest.mark.parametrize("case", ["sinks", "max-score", "varlen-seqused", "score-mod"])
def test_cuda_layer_plans_build_on_the_host(case, monkeypatch):
    """cupyflash/_cuda.py's forward and backward plans (the checked path's, and the cached plans of calls
    with sinks or the maximum score): the problem's arrays as plan inputs, the maximum score's workspace
    and decoding, the sinks' per-row terms, the score functions' gradient accumulators; on an H200."""
    from cupyflash import _cuda

    monkeypatch.setattr(common, "current_device", lambda: H200)
    addresses = iter(range(1 << 20, 1 << 30, 1 << 16))

    def device_array(x):
        return None if x is None else _DeviceArray(x.shape, x.dtype, next(addresses))

    p, arrays = _problem_of(np.dtype(ml_dtypes.bfloat16), case)
    p = dataclasses.replace(p, max_score=None)
    fields = {name: device_array(getattr(p, name)) for name in ("alibi_slopes", "cu_seqlens_q", "cu_seqlens_k",
                                                               "seqused_k", "sinks")}
    buffers = tuple(device_array(x) for x in p.user_buffers or ())
    p = dataclasses.replace(p, user_buffers=buffers or None, **fields)
    q, k, v = (device_array(x) for x in arrays)
    plan = _cuda.forward_plan(p, q, k, v, p.alibi_slopes, p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k,
                              max_score=case == "max-score", user_buffers=buffers)
    assert plan is not None
    out = _DeviceArray(p.out_shape, p.dtype, next(addresses))
    lse = _DeviceArray(p.lse_shape, np.float32, next(addresses))
    grads = tuple(_DeviceArray(x.shape, np.float32, next(addresses)) for x in buffers)
    plan = _cuda.backward_plan(p, out, q, k, v, out, lse, False, p.alibi_slopes, p.cu_seqlens_q, p.cu_seqlens_k,
                               buffers, grads)
    assert plan is not None


@pytest.mark.parametrize("batch, seqlen_q, heads, paged, kernel", [
    (64, 1, 32, False, "decode"),      # decode: one token per request
    (1, 64, 32, False, "forward"),     # a shared prefix's queries (cascade): 256 rows per kv head
    (1, 512, 32, False, "forward"),    # chunked prefill
    (2, 300, 8, False, "forward"),     # a small model's chunk
    (1, 512, 32, True, "forward"),     # a paged chunk the Hopper forward reads in place: 128 tiles
    (1, 64, 32, True, "decode"),       # a paged shared prefix: 64 queries
])
def test_kvcache_routing(batch, seqlen_q, heads, paged, kernel):
    """Which kernel a 16-bit KV-cache call runs (cupyflash/_kvcache/device.py's decode_variant): a dense
    cache takes the decode kernel up to DECODE_MAX_ROWS query rows per kv head and the forward families
    past that; a paged one takes the Hopper forward only for a chunk of more than DECODE_MAX_ROWS queries
    whose work tiles (one per 128 queries of each query head and batch entry) fill at least half the
    device (paged_prefill), the decode kernel otherwise. On an H200 stand-in, GQA 4. (Session 30 sent
    dense chunks of too few tiles to the decode kernel too: the cascade's shared prefix, 64 queries of
    32 heads, then ran 0.63 ms against the forward's 0.45, so dense chunks stay on the forward.)"""
    from cupyflash._kvcache import call, device

    heads_k, d, capacity, page = heads // 4, 128, 8192, 64 if paged else 0
    addresses = iter(range(1 << 20, 1 << 34, 1 << 24))
    q_shape = (batch, seqlen_q, heads, d)
    cache_shape = (batch * capacity // page, page, heads_k, d) if paged else (batch, capacity, heads_k, d)
    table = np.zeros((batch, capacity // page), np.int32) if paged else None
    host = call.check(np.zeros(q_shape, ml_dtypes.bfloat16), np.zeros(cache_shape, ml_dtypes.bfloat16),
                      np.zeros(cache_shape, ml_dtypes.bfloat16), k=None, v=None, cache_seqlens=np.zeros(batch, np.int32),
                      cache_batch_idx=None, block_table=table, rotary_cos=None, rotary_sin=None,
                      rotary_interleaved=False, causal=True, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                      softmax_scale=None, num_splits=0, max_splits=128, precision="highest")
    cache = _DeviceArray(cache_shape, ml_dtypes.bfloat16, next(addresses))
    c = dataclasses.replace(host, xp=None, q=_DeviceArray(q_shape, ml_dtypes.bfloat16, next(addresses)), k_cache=cache,
                            v_cache=cache, cache_seqlens=_DeviceArray((batch,), np.int32, next(addresses)),
                            block_table=None if table is None else _DeviceArray(table.shape, np.int32, next(addresses)))
    decode = device.decode_variant(c, H200)
    assert (decode is not None) == (kernel == "decode")
    if kernel == "forward":  # a planned general path, the pages read in place where paged
        assert device.general_plannable(c, H200, False) and device.paged_prefill(c, H200) == paged


@pytest.mark.parametrize("given", [(), ("q_descale",), ("q_descale", "k_descale", "v_descale")])
def test_fp8_plans_take_the_descales_last(given, monkeypatch):
    """An FP8 call's plan (cupyflash/_cuda.py's forward_plan on an H200) takes the three descales after
    the problem's other arrays (_cuda.tail_inputs: None where not given), so that a call of its layout
    runs it with its own descales; its launches are the V^T pre-pass and the FP8 kernel."""
    from cupyflash import _cuda, _fp8

    monkeypatch.setattr(common, "current_device", lambda: H200)
    launched = []
    monkeypatch.setattr(common, "function", lambda variant, smem=0: launched.append(variant.key) or variant.key)
    addresses = iter(range(1 << 20, 1 << 30, 1 << 16))
    q, k, v = (np.zeros(shape, _fp8.E4M3) for shape in ((2, 77, 4, 128), (2, 101, 2, 128), (2, 101, 2, 128)))
    descales = {name: np.ones((2, 2), np.float32) if name in given else None for name in _fp8.DESCALES}
    p = _problem.forward_problem(q, k, v, causal=True, **descales)
    stand_ins = {name: None if x is None else _DeviceArray(x.shape, x.dtype, next(addresses)) for name, x in descales.items()}
    p = dataclasses.replace(p, **stand_ins)
    operands = tuple(_DeviceArray(x.shape, x.dtype, next(addresses)) for x in (q, k, v))
    assert _cuda.tail_inputs(p) == tuple(stand_ins.values())
    plan = _cuda.forward_plan(p, *operands)
    assert len(plan._inputs) == 7 + 3
    assert [bool(words or maps) for words, maps, *_ in plan._inputs[7:]] == [name in given for name in _fp8.DESCALES]
    assert launched[0] == "fp8_transpose_values" and launched[-1].startswith("sm90_fwd_fp8")


@pytest.mark.parametrize("family, device, dtype", [("sm90", H200, ml_dtypes.bfloat16), ("general", A100, np.float32)])
@pytest.mark.parametrize("seed, offset", [(3, 7), (2**64 - 1, 2**32 - 1), (2**63 + 5, 2**31)])
def test_dropout_plans_take_the_seed_and_offset_per_run(family, device, dtype, seed, offset):
    """A dropout plan is built with the seed _plan.DROPOUT_SEED: each DropoutArg of its structs (forward
    and backward) holds, once a run's scalars are written, that run's seed and offset, int32 halves and
    sign included."""
    forward, backward = FAMILIES[family]
    p, arrays = _problem_of(np.dtype(dtype), "dropout")
    p = dataclasses.replace(p, dropout_seed=_plan.DROPOUT_SEED)
    ps, operands = _slots(p, arrays)
    b = _plan.PlanBuilder()
    out, lse = forward.plan(b, forward.select(ps, device, operands), ps, *operands, device)
    dout = _plan.Slot(91, out.shape, out.dtype)
    bb = _plan.PlanBuilder()
    backward.plan(bb, backward.select(ps, device, (dout, *operands)), ps, dout, *operands,
                  _plan.Slot(93, out.shape, out.dtype), lse, False, device)
    for builder in (b, bb):
        plan = builder.build((out,) if builder is b else ())
        scalars = plan.dropout_scalars(seed, offset)
        assert scalars and len(scalars) == len(plan._scalars)
        for index, value in zip(plan._scalars, scalars):
            plan._ints[index] = value
        words = plan._buffer.view(np.uint64)
        seeds = np.flatnonzero(words == np.uint64(seed))
        assert len(seeds) == len(scalars) // 3 and not np.any(words == np.uint64(_plan.DROPOUT_SEED))
        assert all(int(words[w + 1]) & 0xFFFFFFFF == offset for w in seeds)


class _Strided(_DeviceArray):
    """A stand-in for a CuPy array of any strides (bytes)."""

    def __init__(self, shape, dtype, strides, address):
        super().__init__(shape, dtype, address)
        self.strides = tuple(strides)


class _Memory:
    """What a generated run reads of CuPy's allocation: its address, and + for its buffers."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __add__(self, offset):
        return self.ptr + offset


def _run_generated(plan, *inputs):
    """Runs plan's generated run (Plan._compile's source) on the host: as in a capture (kernels launched
    one by one, here recorded), with an allocation at 1 << 40; returns the launches."""
    plan._compile()
    launches = []
    namespace = dict(plan.namespace, get_stream=lambda: _Memory(7), capturing=lambda stream: True,
                     alloc=lambda nbytes: _Memory(1 << 40), launch=lambda *args: launches.append(args),
                     memset=lambda *args: None, ndarray=lambda shape, dtype, memory: (shape, dtype, memory))
    exec(compile(plan.source, "<generated run>", "exec"), namespace)  # noqa: S102 (the plan's own source)
    namespace["run"](*inputs)
    return launches


def _merge_structs(plan):
    """The MergeArgs of each of a plan's launches, as its argument buffer holds them."""
    base = plan._buffer.ctypes.data
    return [np.frombuffer(plan._buffer, _params.MERGE_ARGS, count=1, offset=int(step.params[0]) - base)[0]
            for step in plan._launches]


@pytest.mark.parametrize("parts, packed", [(3, False), (20, False), (5, True)])
def test_stacked_merge_plans_read_each_part_where_it_lies(parts, packed, monkeypatch):
    """merge_attention_states_stacked's plan (common.merge_stacked_plan) reads part i of out and lse at the
    stacked arrays' addresses plus i times their first stride, whichever addresses a run (its generated
    code, run on the host) is given, out with a padded last axis; past MERGE_PARTS parts a second launch
    takes the first's result as its part 0."""
    launched = []  # the variants; a launch names its function by its number in this list
    monkeypatch.setattr(common, "function", lambda variant, smem=0: launched.append(variant.key) or len(launched))
    rows = (7, 3) if packed else (2, 7, 3)
    out_shape = (parts, *rows, 40)
    out_strides = tuple(2 * int(np.prod((*out_shape[i + 1:-1], 48))) for i in range(len(out_shape) - 1)) + (2,)
    out = _Strided(out_shape, ml_dtypes.bfloat16, out_strides, 1 << 20)  # (.., 48) padded to 40 columns
    lse_shape = (parts, 3, 7) if packed else (parts, 2, 3, 7)
    lse = _DeviceArray(lse_shape, np.float32, 1 << 28)
    plan = common.merge_stacked_plan(out, lse, parts, packed)
    assert len(plan._launches) == (1 if parts <= _params.MERGE_PARTS else 2)
    assert all(key.startswith("merge_states_bf16") for key in launched)
    moved = {"out": 5 << 24, "lse": 9 << 24}  # a later run's arrays
    launches = _run_generated(plan, _Strided(out_shape, ml_dtypes.bfloat16, out_strides, moved["out"]),
                              _DeviceArray(lse_shape, np.float32, moved["lse"]))
    assert [args[0] for args in launches] == list(range(1, len(launched) + 1))
    first = _merge_structs(plan)[0]
    count = min(parts, _params.MERGE_PARTS)
    assert first["num_parts"] == count and first["headdim"] == 40
    for i in range(count):
        part = first["parts"][i]
        assert part["ptr"] == moved["out"] + i * out.strides[0]
        assert (part["row_stride"], part["head_stride"]) == (out.strides[-3] // 2, out.strides[-2] // 2)
        assert first["lses"][i]["ptr"] == moved["lse"] + i * lse.strides[0]
        assert first["lses"][i]["head_stride"] == lse.strides[-2] // 4
    if parts > _params.MERGE_PARTS:
        second = _merge_structs(plan)[1]
        assert second["num_parts"] == parts - _params.MERGE_PARTS + 1
        assert second["parts"][0]["ptr"] == first["out"]["ptr"] == second["out"]["ptr"] == 1 << 40
        assert second["lses"][0]["ptr"] == first["lse"]["ptr"]
        for k in range(1, parts - _params.MERGE_PARTS + 1):
            assert second["parts"][k]["ptr"] == moved["out"] + (_params.MERGE_PARTS - 1 + k) * out.strides[0]


def test_merge_plans_convert_what_the_kernel_cannot_read(monkeypatch):
    """A two-part merge plan (common.merge_plan) converts on each run an out whose last axis is strided and
    a float64 lse of 16-bit parts (to float32, the kernel's), and reads the others as they are."""
    monkeypatch.setattr(common, "function", lambda variant, smem=0: variant.key)
    out_a = _DeviceArray((2, 7, 3, 40), ml_dtypes.bfloat16, 1 << 20)
    out_b = _Strided((2, 7, 3, 40), ml_dtypes.bfloat16, (2 * 7 * 3 * 80, 2 * 3 * 80, 2 * 80, 4), 1 << 22)
    lse_a = _DeviceArray((2, 3, 7), np.float32, 1 << 24)
    lse_b = _DeviceArray((2, 3, 7), np.float64, 1 << 26)
    plan = common.merge_plan([out_a, out_b], [lse_a, lse_b], False)
    assert [convert is not None for _, _, convert, _ in plan._inputs] == [False, False, True, True]


def test_merge_plans_write_the_lse_of_rows_without_columns(monkeypatch):
    """Rows with head dim 0 still have an lse to merge: the plan launches the merge (which writes it)
    rather than returning its outputs unwritten; a merge without rows launches nothing."""
    monkeypatch.setattr(common, "function", lambda variant, smem=0: variant.key)
    parts = [(_DeviceArray((2, 5, 3, 0), ml_dtypes.bfloat16, 1 << 20), _DeviceArray((2, 3, 5), np.float32, 1 << 24)),
             (_DeviceArray((2, 5, 3, 0), ml_dtypes.bfloat16, 1 << 21), _DeviceArray((2, 3, 5), np.float32, 1 << 25))]
    plan = common.merge_plan([o for o, _ in parts], [x for _, x in parts], False)
    assert len(plan._launches) == 1
    empty = [(_DeviceArray((2, 0, 3, 8), ml_dtypes.bfloat16, 1 << 20), _DeviceArray((2, 3, 0), np.float32, 1 << 24))] * 2
    assert not common.merge_plan([o for o, _ in empty], [x for _, x in empty], False)._launches
