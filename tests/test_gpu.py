"""The CUDA kernels against the float64 oracle (GPU only; skipped cleanly without a GPU).

Run on a GPU machine with ``python -m pytest -m gpu tests``. Every case draws fresh random inputs and
applies the tolerance rule of helpers.assert_within_rule to out, lse, dq, dk and dv.
"""

import dataclasses

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
    random_qkv,
    seed_from,
    to_host,
    use_family,
    with_families,
)

import cupyflash
from cupyflash import _families
from cupyflash._families import sm80

pytestmark = pytest.mark.gpu

if gpu_available():
    import cupy
else:
    cupy = None


def _check(batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, dtype, causal, scale=1.0, backward=True,
           deterministic=False):
    """Run forward (and backward) on the GPU and apply the tolerance rule to every result."""
    dt = DTYPES[dtype]
    seed = seed_from(batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, dtype, causal, scale)
    q, k, v = random_qkv(cupy, batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, dt, seed, scale)
    dout = cupy.asarray(np.random.default_rng(seed + 1).standard_normal((batch, seqlen_q, heads, headdim_v)).astype(dt))
    out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    got = {"out": out, "lse": lse}
    if backward:
        grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=deterministic)
        got.update(zip(("dq", "dk", "dv"), grads))
    ref = oracle(q, k, v, causal, dout=dout if backward else None)
    base = plain(q, k, v, causal, dout=dout if backward else None)
    lse_dtype = np.float64 if dt.itemsize >= 4 else np.float32
    for name, value in got.items():
        assert isinstance(value, cupy.ndarray)
        assert value.dtype == (lse_dtype if name == "lse" else dt)
        factor = OUTPUT_FACTOR if name in ("out", "lse") else GRAD_FACTOR
        assert_within_rule(name, value, ref[name], base[name], factor)
    return got


# Odd sizes from the foundation issue, spread so that every head dim, every seqlen pair, every dtype and
# both causal settings appear, with MHA, GQA and MQA and headdim_v != headdim mixed in.
# (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v, dtype, causal)
SHAPE_CASES = [
    (2, 1, 1, 2, 2, 32, 32, "bfloat16", False),
    (1, 1, 147, 4, 2, 40, 40, "float16", True),
    (1, 113, 203, 3, 1, 59, 59, "float32", True),
    (2, 239, 1, 2, 2, 64, 64, "bfloat16", True),
    (1, 3, 799, 4, 4, 80, 80, "float16", False),
    (1, 1023, 1024, 2, 1, 96, 96, "bfloat16", True),
    (1, 113, 203, 6, 2, 111, 111, "float16", False),
    (1, 239, 1, 2, 1, 128, 128, "float32", False),
    (1, 1023, 1024, 1, 1, 128, 128, "float16", False),
    (2, 1, 147, 2, 2, 160, 160, "float32", False),
    (1, 3, 799, 2, 2, 192, 192, "bfloat16", True),
    (1, 113, 203, 2, 2, 224, 224, "bfloat16", False),
    (1, 203, 113, 2, 1, 256, 256, "float16", True),
    (1, 97, 131, 2, 2, 320, 320, "float32", True),
    (1, 65, 64, 2, 2, 512, 512, "bfloat16", False),
    (1, 29, 65, 3, 3, 1, 1, "float32", True),
    (2, 113, 203, 4, 2, 64, 40, "bfloat16", True),
    (1, 77, 77, 2, 1, 40, 200, "float16", False),
    (1, 65, 29, 4, 1, 96, 24, "float32", True),
    # float64: small enough for the long-double oracle on the host.
    (1, 13, 29, 2, 1, 32, 32, "float64", True),
    (2, 65, 64, 2, 2, 111, 64, "float64", False),
    (1, 29, 13, 4, 2, 320, 320, "float64", True),
]


def _case_id(case):
    b, sq, sk, h, hk, d, dv, dtype, causal = case
    return f"b{b}_q{sq}_k{sk}_h{h}_hk{hk}_d{d}_dv{dv}_{dtype}_causal{int(causal)}"


@pytest.mark.parametrize("case, family", with_families(SHAPE_CASES, lambda c: c[7], [_case_id(c) for c in SHAPE_CASES]))
def test_matches_oracle(case, family, monkeypatch):
    use_family(monkeypatch, family)
    _check(*case)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal", [False, True])
def test_every_dtype_gqa(dtype, causal):
    _check(2, 67, 45, 6, 2, 64, 64, dtype, causal)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_large_logits_stay_finite(dtype):
    """Inputs scaled by 30: scores in the thousands must not overflow the exponentials."""
    got = _check(1, 97, 131, 2, 1, 64, 64, dtype, True, scale=30.0)
    for name, value in got.items():
        finite = cupy.isfinite(value) | (cupy.isneginf(value) if name == "lse" else False)
        assert bool(finite.all()), name


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("causal", [False, True])
def test_wide_forward_over_many_keys(dtype, causal):
    """float32 O summed over 4096 keys by the sm80 family's forward on the bfloat16 tensor cores, whose
    products round toward zero: a running sum of them drifts with the number of keys (5x the rule's
    allowance in emulation), the kernel's per-tile sums must not (kernels_cu/sm80/operands.cuh); float64
    likewise on the float64 tensor cores."""
    _check(1, 64, 4096, 2, 1, 128, 128, dtype, causal, backward=False)


def _tf32(x):
    """x (float32, host) rounded to TF32's 10 mantissa bits, to nearest even."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    bits = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


@pytest.mark.parametrize("causal", [False, True])
def test_float32_tf32_precision_within_its_rule(causal):
    """precision="tf32" (two bfloat16 parts per value, three products): the rule against a plain float32
    implementation whose products take TF32-rounded inputs; it is a kernel of its own (its results differ
    from "highest"'s, and the plan of one precision does not serve the other)."""
    q, k, v = random_qkv(cupy, 1, 113, 203, 3, 1, 64, 64, np.dtype(np.float32), seed=11)
    out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True, precision="tf32")
    ref = oracle(q, k, v, causal)
    base = plain(*(_tf32(to_host(x)) for x in (q, k, v)), causal)
    assert_within_rule("out", out, ref["out"], base["out"], OUTPUT_FACTOR)
    assert_within_rule("lse", lse, ref["lse"], base["lse"], OUTPUT_FACTOR)
    highest, _ = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)  # a key that differs in precision only
    assert not bool(cupy.array_equal(out, highest))


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_float32_tf32_precision_gradients(scale):
    """The backward of a precision="tf32" forward (the tensor-core backward's tf32 variant recomputes the
    scores from the same two parts): the rule for gradients against a plain float32 implementation on
    TF32-rounded inputs, at ordinary scores and at scores in the thousands."""
    q, k, v = random_qkv(cupy, 1, 97, 131, 2, 1, 64, 64, np.dtype(np.float32), seed=12, scale=scale)
    dout = cupy.asarray(np.random.default_rng(13).standard_normal((1, 97, 2, 64)).astype(np.float32))
    out, vjp = cupyflash.flash_attention_vjp(q, k, v, causal=True, precision="tf32")
    got = dict(zip(("dq", "dk", "dv"), vjp(dout)))
    ref = oracle(q, k, v, True, dout=dout)
    base = plain(*(_tf32(to_host(x)) for x in (q, k, v)), True, dout=to_host(dout))
    assert_within_rule("out", out, ref["out"], base["out"], OUTPUT_FACTOR)
    for name, value in got.items():
        assert_within_rule(name, value, ref[name], base[name], GRAD_FACTOR)


@pytest.mark.parametrize("sizes, options", [
    ((1, 113, 203, 3, 1, 64, 64), {"causal": True}),
    ((2, 200, 150, 4, 2, 40, 24), {}),
    ((1, 300, 777, 2, 2, 128, 128), {"window_size": (100, 20)}),
    ((2, 257, 129, 4, 1, 96, 96), {"causal": True, "block_mask": True}),
])
def test_tf32_kernel_within_its_rule(sizes, options):
    """The tf32 wgmma forward (kernels_cu/sm90/fwd_kmajor.cu with Tf32Operands), its pre-passes included (q
    and k rounded into copies whose head dims are padded, V^T permuted per 8-key step): odd shapes, GQA,
    causal, windows, block masks, head dims that are not the bucket's, the maximum score, under the "tf32"
    rule. It runs for calls that return no lse; a call that returns lse, and the vjp, take the planes kernel,
    whose scores the backward recomputes: their out, lse and gradients under the same rule."""
    import dataclasses

    from cupyflash import _problem

    if _families.common.current_device().capability != 90:
        pytest.skip("the tf32 kernel runs on compute capability 9.0")
    b, sq, sk, h, hk, d, dv = sizes
    q, k, v = random_qkv(cupy, b, sq, sk, h, hk, d, dv, np.dtype(np.float32), seed=sum(sizes))
    dout = cupy.asarray(np.random.default_rng(sq).standard_normal((b, sq, h, dv)).astype(np.float32))
    options = dict(options)
    if options.pop("block_mask", False):
        layout = np.random.default_rng(sk).random((b, h, -(-sq // 128), -(-sk // 128))) < 0.7
        options["block_mask"] = cupyflash.BlockMask.from_dense(layout, (128, 128))
    p = _problem.forward_problem(q, k, v, precision="tf32", **options)
    device = _families.common.current_device()
    kernels = [_families.select(_families.FORWARD, dataclasses.replace(p, lse_returned=returned), device,
                                (q, k, v))[1].kernel.name for returned in (False, True)]
    assert kernels == ["sm90_fwd_tf32", "sm90_fwd_planes"]
    out, top = cupyflash.flash_attention(q, k, v, precision="tf32", return_max_score=True, **options)
    planes_out, lse = cupyflash.flash_attention(q, k, v, precision="tf32", return_lse=True, **options)
    _, vjp = cupyflash.flash_attention_vjp(q, k, v, precision="tf32", **options)
    got = dict(zip(("dq", "dk", "dv"), vjp(dout)))
    ref = oracle(q, k, v, dout=dout, **options)
    base = plain(*(_tf32(to_host(x)) for x in (q, k, v)), dout=to_host(dout), **options)
    assert_within_rule("out", out, ref["out"], base["out"], OUTPUT_FACTOR)
    assert_within_rule("out", planes_out, ref["out"], base["out"], OUTPUT_FACTOR)
    assert_within_rule("lse", lse, ref["lse"], base["lse"], OUTPUT_FACTOR)
    assert_within_rule("max_score", top, ref["max_score"], base["max_score"], OUTPUT_FACTOR)
    for name, value in got.items():
        assert_within_rule(name, value, ref[name], base[name], GRAD_FACTOR)


H200 = _families.common.Device(90, 227 * 1024, 132)
A100 = _families.common.Device(80, 163 * 1024, 108)


def _selected(families, dtype, headdim, headdim_v, device=H200, causal=True):
    """Key of the variant dispatch picks for a small problem on ``device``, or the family name."""
    from cupyflash import _problem

    q, k, v = random_qkv(cupy, 1, 3, 3, 1, 1, headdim, headdim_v, DTYPES[dtype], seed=3)
    family, variant = _families.select(families, _problem.forward_problem(q, k, v, causal=causal), device, (q, k, v))
    return variant.key if family.name != "general" else None


@pytest.mark.parametrize(
    "dtype, headdim, headdim_v, device, expected",
    [("bfloat16", 128, 128, A100, "sm80_fwd_bf16_d128_n32_m2_mod_0_top_0"),
     ("float16", 40, 200, A100, "sm80_fwd_fp16_d224_n32_m1_mod_0_top_0"),
     ("bfloat16", 128, 128, H200, "sm90_fwd_bf16_d128_v128_q128_n128_s2_mod_0_drop_0_top_0"),
     ("float16", 40, 200, H200, "sm90_fwd_fp16_d256_v256_q128_n80_s2_mod_0_drop_0_top_0"),
     ("float16", 257, 64, H200, None), ("float32", 64, 64, H200, "sm90_fwd_planes_fp32_d64_n64_s2_mod_0_tf32_0_top_0"),
     ("float32", 96, 80, H200, "sm90_fwd_planes_fp32_d128_n64_s1_mod_0_tf32_0_top_0"),
     ("float32", 96, 80, A100, "sm80_fwd_parts_fp32_d96_n32_m1_mod_0_tf32_0_top_0"),
     ("float32", 160, 160, H200, None), ("float64", 64, 64, H200, "sm80_fwd_dmma_fp64_d64_n32_m1_mod_0_top_0"),
     ("float64", 111, 64, H200, "sm80_fwd_dmma_fp64_d128_n16_m1_mod_0_top_0"),
     ("float64", 128, 128, A100, "sm80_fwd_dmma_fp64_d128_n16_m1_mod_0_top_0"), ("float64", 160, 160, H200, None)],
)
def test_forward_dispatch(dtype, headdim, headdim_v, device, expected):
    """fp16/bf16 with head dims <= 256 take the Hopper forward on compute capability 9.0, the tensor-core
    forward on other sm_80+ GPUs; float32 with head dims <= 128 the Hopper float32 forward on 9.0 (buckets
    64 and 128), the sm80 family's elsewhere; float64 with head dims <= 128 the sm80 family's float64
    forward (16-key tiles where shared memory is 163 KB); the rest the general path."""
    assert _selected(_families.FORWARD, dtype, headdim, headdim_v, device) == expected


@pytest.mark.parametrize(
    "dtype, headdim, headdim_v, device, expected",
    [("bfloat16", 128, 128, A100, "sm80_bwd_bf16_d128_n128_q64_s1_mod_0"),
     ("bfloat16", 128, 128, H200, "sm90_bwd_bf16_d128_v128_q64_s2_mod_0_drop_0"),
     ("float16", 40, 104, H200, "sm90_bwd_fp16_d128_v128_q64_s2_mod_0_drop_0"),
     # v rows of 200 bytes: no TMA can read them, so dispatch gives the call to the sm80 kernels.
     ("float16", 40, 100, H200, "sm80_bwd_fp16_d128_n128_q64_s2_mod_0"),
     ("float16", 160, 64, H200, "sm90_bwd_fp16_d192_v192_q64_s2_mod_0_drop_0"),
     ("bfloat16", 256, 256, H200, "sm90_bwd_bf16_d256_v256_q64_s2_mod_0_drop_0"),
     ("float16", 257, 64, H200, None), ("float64", 64, 64, H200, "sm80_bwd_dmma_fp64_d64_n64_q32_s1_mod_0"),
     ("float32", 100, 100, H200, "sm90_bwd_planes_fp32_d128_s1_mod_0_tf32_0"), ("float64", 160, 160, H200, None)],
)
def test_backward_dispatch(dtype, headdim, headdim_v, device, expected):
    """fp16/bf16 with head dims up to 256 take the Hopper backward on compute capability 9.0 where a TMA
    can read the inputs, else the tensor-core backward (on any sm_80+); float32 up to 128 the Hopper one
    from bfloat16 planes (any layout); float64 up to 128 the tensor-core backward of its own; the rest
    the general path."""
    assert _selected(_families.BACKWARD, dtype, headdim, headdim_v, device) == expected


def test_old_gpus_take_the_general_path():
    assert _selected(_families.FORWARD, "bfloat16", 64, 64, _families.common.Device(75, 64 * 1024)) is None


# Every fallback tile of the tensor-core backward, forced on this GPU by lowering the shared-memory
# limit dispatch sees to that of sm_80 (163 KB) or sm_86/sm_89 (99 KB): (head dim, limit in bytes).
SM80, SM86 = 163 * 1024, 99 * 1024
FALLBACK_TILES = [(32, SM86), (64, SM80), (64, SM86), (96, SM86), (128, SM80), (128, SM86), (192, SM80), (224, SM80), (256, SM80)]


@pytest.mark.parametrize("headdim, limit", FALLBACK_TILES)
def test_backward_fallback_tiles(headdim, limit, monkeypatch, request):
    from cupyflash._families import common

    device = common.Device(common.current_device().capability, limit)
    monkeypatch.setattr(common, "current_device", lambda: device)
    # Plans are keyed by the device, not by what dispatch sees of it: none made before may serve.
    cupyflash._api.PLANS.clear()
    request.addfinalizer(cupyflash._api.PLANS.clear)
    key = _selected(_families.BACKWARD, "bfloat16", headdim, headdim, device, causal=False)
    first = sm80.BWD.variant("bfloat16", (headdim, *sm80.BWD_TILES[headdim][0]))
    variant = next(v for v in sm80.BWD.variants() if v.key == key)
    assert variant != first and sm80.bwd_smem_bytes(variant) <= limit
    # The sm_80 tiles run the ordered sum, the sm_86 ones the default mode.
    _check(1, 203, 145, 2, 1, headdim, headdim, "bfloat16", headdim % 64 == 0, deterministic=limit == SM80)


@pytest.mark.parametrize("causal", [True, False])
def test_hopper_forward_l2_sections(causal, monkeypatch, request):
    """The longest-first order of the Hopper forward (masked and packed calls) in sections of heads
    whose K and V fit L2: an L2 small enough for 3 of the 10 (batch entry, head) pairs, with no
    minimum, leaves a short last section (3, 3, 3, 1), and every tile of every section must still be
    computed once."""
    from cupyflash import _problem
    from cupyflash._families import common, sm90

    real = common.current_device()
    batch, seqlen, heads, headdim = 2, 300, 5, 64
    kv_bytes = seqlen * 2 * headdim * 2
    device = dataclasses.replace(real, l2_bytes=int(3.5 * kv_bytes / sm90.L2_SECTION_SHARE))
    monkeypatch.setattr(common, "current_device", lambda: device)
    monkeypatch.setattr(sm90, "L2_SECTION_MIN_PAIRS", 1)
    cupyflash._api.PLANS.clear()
    request.addfinalizer(cupyflash._api.PLANS.clear)
    q, k, v = random_qkv(cupy, batch, seqlen, seqlen, heads, heads, headdim, headdim, DTYPES["bfloat16"], seed=11)
    problem = _problem.forward_problem(q, k, v, causal=causal)
    assert sm90.l2_section(problem, device) == 3
    if real.capability != sm90.CAPABILITY:
        pytest.skip("the Hopper forward runs on compute capability 9.0 only")
    # Non-causal calls take the static order; a window of the whole sequence takes the sections.
    window = (-1, 0) if causal else (seqlen, seqlen)
    out = cupyflash.flash_attention(q, k, v, window_size=window)
    ref = oracle(q, k, v, causal)
    assert_within_rule("out", out, ref["out"], plain(q, k, v, causal)["out"], OUTPUT_FACTOR)


def test_transposed_views_are_used_without_copy():
    """A (batch, heads, seqlen, headdim) array passed as x.transpose(0, 2, 1, 3) is read in place."""
    from cupyflash._families import common

    rng = np.random.default_rng(7)
    shape_bhsd = (2, 3, 57, 48)
    q, k, v = (cupy.asarray(rng.standard_normal(shape_bhsd).astype(np.float16)).transpose(0, 2, 1, 3) for _ in range(3))
    assert not q.flags.c_contiguous and common.readable(q) == (q, None)
    out = cupyflash.flash_attention(q, k, v, causal=True)
    ref = oracle(q, k, v, True)
    assert_within_rule("out", out, ref["out"], plain(q, k, v, True)["out"], OUTPUT_FACTOR)


def test_non_contiguous_last_axis_is_copied_and_correct():
    rng = np.random.default_rng(8)
    wide = cupy.asarray(rng.standard_normal((1, 41, 2, 64)).astype(np.float32))
    q = wide[..., ::2]  # last-axis stride 2: copied once
    k = cupy.asarray(rng.standard_normal((1, 53, 2, 32)).astype(np.float32))
    v = cupy.asarray(rng.standard_normal((1, 53, 2, 16)).astype(np.float32))
    out = cupyflash.flash_attention(q, k, v)
    assert_within_rule("out", out, oracle(q, k, v)["out"], plain(q, k, v)["out"], OUTPUT_FACTOR)


def test_rows_without_keys_give_zero_and_neg_inf():
    """Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see nothing."""
    q, k, v = random_qkv(cupy, 1, 40, 7, 2, 2, 32, 32, np.float16, seed=11)
    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
    dout = cupy.ones_like(out)
    dq, dk, dv = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    empty_rows = slice(0, 40 - 7)
    assert bool((out[:, empty_rows] == 0).all())
    assert bool(cupy.isneginf(lse[:, :, empty_rows]).all())
    assert bool(cupy.isfinite(lse[:, :, 40 - 7 :]).all())
    assert bool((dq[:, empty_rows] == 0).all())
    for g in (out, dq, dk, dv):
        assert not bool(cupy.isnan(g).any())


def test_empty_inputs_do_not_launch():
    for shape_q, shape_k in [((0, 5, 2, 8), (0, 6, 2, 8)), ((1, 0, 2, 8), (1, 6, 2, 8)), ((1, 5, 2, 8), (1, 0, 2, 8))]:
        q = cupy.ones(shape_q, cupy.float32)
        k = cupy.ones(shape_k, cupy.float32)
        v = cupy.ones(shape_k[:3] + (3,), cupy.float32)
        out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
        assert out.shape == shape_q[:3] + (3,) and lse.shape == (shape_q[0], 2, shape_q[1])
        assert bool((out == 0).all()) and bool(cupy.isneginf(lse).all())
        dq, dk, dv = cupyflash.flash_attention_backward(cupy.ones_like(out), q, k, v, out, lse)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        assert not bool(dq.any()) and not bool(dk.any()) and not bool(dv.any())


def _grads(dtype, causal, deterministic, runs, headdim=64):
    """``runs`` backward passes on the same GQA inputs (several key blocks add into each dq block)."""
    dt = DTYPES[dtype]
    q, k, v = random_qkv(cupy, 2, 700, 650, 4, 2, headdim, headdim, dt, seed=5)
    out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    dout = cupy.asarray(np.random.default_rng(6).standard_normal(out.shape).astype(dt))
    return [
        [g.get() for g in cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                             deterministic=deterministic)]
        for _ in range(runs)
    ]


# general path; tensor-core path with dQ in one pass (headdim 64) and in column passes (headdim 128)
@pytest.mark.parametrize("dtype, headdim", [("float32", 64), ("bfloat16", 64), ("float16", 64), ("bfloat16", 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_backward_is_bitwise_reproducible(dtype, headdim, causal):
    """deterministic=True: 20 backward runs on the same inputs are bitwise equal."""
    runs = _grads(dtype, causal, True, 20, headdim)
    for again in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], again):
            assert np.array_equal(a, b), name


# The ordered sum against the oracle: dQ in column passes (headdim 128, 256; 192's unequal shares on
# two buffers of rotated walks), seqlen_q > seqlen_k and seqlen_q < seqlen_k under the causal mask, GQA.
DETERMINISTIC_CASES = [
    (1, 203, 113, 4, 2, 128, 128, "bfloat16", True),
    (1, 113, 203, 2, 1, 256, 256, "float16", True),
    (1, 330, 203, 2, 1, 192, 192, "bfloat16", False),
    (2, 300, 300, 4, 1, 64, 64, "bfloat16", False),
    (1, 333, 777, 2, 2, 96, 96, "float16", False),
]


@pytest.mark.parametrize("case", DETERMINISTIC_CASES, ids=[_case_id(c) for c in DETERMINISTIC_CASES])
def test_deterministic_matches_oracle(case):
    _check(*case, deterministic=True)


def test_default_backward_differs_from_deterministic_only_in_rounding():
    """The default mode sums dq in any order: every run stays within float32 reordering of the
    deterministic result. dk and dv are bitwise identical from run to run (one CTA writes each
    element); the deterministic mode may walk the query tiles in another order (the Hopper kernel's
    rotated walks), so across the modes they too agree to within reordering."""
    (ordered,) = _grads("bfloat16", False, True, 1)
    runs = _grads("bfloat16", False, False, 3)
    for grads in runs:
        for got, want in zip(grads, ordered):
            got, want = got.astype(np.float64), want.astype(np.float64)
            # Reordering float32 sums moves a result by far less than one bfloat16 ulp (2^-8 relative).
            assert np.abs(got - want).max() <= 2.0 ** -7 * np.abs(want).max()
        assert np.array_equal(grads[1], runs[0][1]) and np.array_equal(grads[2], runs[0][2])


def test_vjp_matches_explicit_backward():
    q, k, v = random_qkv(cupy, 1, 50, 70, 2, 1, 24, 16, np.float32, seed=9)
    out, vjp = cupyflash.flash_attention_vjp(q, k, v, causal=True)
    dout = cupy.asarray(np.random.default_rng(10).standard_normal(out.shape).astype(np.float32))
    out2, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
    for a, b in zip(vjp(dout), cupyflash.flash_attention_backward(dout, q, k, v, out2, lse, causal=True)):
        assert np.array_equal(a.get(), b.get())


def test_runs_on_current_stream():
    q, k, v = random_qkv(cupy, 1, 33, 33, 2, 2, 16, 16, np.float32, seed=12)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        out = cupyflash.flash_attention(q, k, v)
    stream.synchronize()
    assert_within_rule("out", out, oracle(q, k, v)["out"], plain(q, k, v)["out"], OUTPUT_FACTOR)


def test_long_sequence_memory_is_linear():
    """seqlen 65536, one head: extra device memory of forward + backward is O(seqlen), not O(seqlen^2).

    The pool's total_bytes after the calls is the most it held at once (freed blocks are reused). The
    score matrix alone would be 65536^2 * 4 bytes = 16 GiB; the workspace is delta and the float32 dq
    buffer, both linear in seqlen.
    """
    seqlen, headdim = 65536, 64
    q, k, v = random_qkv(cupy, 1, seqlen, seqlen, 1, 1, headdim, headdim, np.float16, seed=13)
    dout = cupy.asarray(np.random.default_rng(14).standard_normal(q.shape).astype(np.float16))
    cupy.cuda.Device().synchronize()
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
        grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
        cupy.cuda.Device().synchronize()
        extra = pool.total_bytes()
    returned = out.nbytes + lse.nbytes + sum(g.nbytes for g in grads)
    workspace = extra - returned
    print(f"seqlen {seqlen}: returned arrays {returned} B, workspace {workspace} B")
    # delta (4 B per row), the float32 dq buffer (4 B per row and column) and allocator rounding.
    assert workspace <= 4 * seqlen + 4 * seqlen * headdim + (1 << 20)
    # Spot-check 16 rows of the output against the oracle computed for those rows only.
    rows = np.sort(np.random.default_rng(15).choice(seqlen, 16, replace=False))
    qh, kh, vh = (to_host(x).astype(np.float64) for x in (q, k, v))
    s = np.einsum("bqhd,bkhd->bhqk", qh[:, rows], kh) / np.sqrt(headdim)
    s = np.where(np.arange(seqlen)[None, None, None, :] <= rows[None, None, :, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), vh)
    assert np.abs(to_host(out)[:, rows].astype(np.float64) - ref).max() < 2e-3
    assert all(bool(cupy.isfinite(g).all()) for g in grads)
