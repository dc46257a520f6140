"""Dispatch without a GPU: which family and variant a problem gets on a described device, the
CUPYFLASH_FAMILY override, and which inputs a TMA can address."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from cupyflash import _families, _plan
from cupyflash import _problem as problems
from cupyflash._families import common, sm90

H200 = common.Device(90, 227 * 1024, 132)
A100 = common.Device(80, 163 * 1024, 108)


def _operands(p):
    """q, k and v of problem ``p`` as contiguous, aligned plan slots (what select sees of a call's arrays)."""
    shapes = ((p.batch, p.seqlen_q, p.heads, p.headdim), (p.batch, p.seqlen_k, p.heads_k, p.headdim),
              (p.batch, p.seqlen_k, p.heads_k, p.headdim_v))
    return tuple(_plan.Slot(i, shape, p.dtype) for i, shape in enumerate(shapes))


def _with_operands(p, device):
    return p, device, _operands(p)


def _problem(headdim=128, headdim_v=None, dtype=ml_dtypes.bfloat16, **options):
    q = np.zeros((1, 8, 2, headdim), dtype)
    v = np.zeros((1, 8, 2, headdim if headdim_v is None else headdim_v), dtype)
    return problems.forward_problem(q, q, v, **options)


@pytest.mark.parametrize("headdim, headdim_v, expected", [
    (32, 32, (64, 64)), (64, 64, (64, 64)), (80, 80, (96, 96)), (100, 64, (128, 128)), (128, 128, (128, 128)),
    (160, 128, (192, 128)), (192, 160, (192, 192)), (200, 40, (256, 256)), (256, 256, (256, 256)), (257, 8, None),
])
def test_sm90_buckets_cover_both_head_dims_at_least_cost(headdim, headdim_v, expected):
    assert sm90.bucket(headdim, headdim_v) == expected


def test_sm90_only_on_compute_capability_9_0():
    p = _problem()
    assert sm90.FORWARD.select(p, H200, _operands(p)).key == "sm90_fwd_bf16_d128_v128_q128_n128_s2_mod_0_drop_0_top_0"
    assert sm90.FORWARD.select(p, A100, _operands(p)) is None
    assert sm90.FORWARD.select(p, common.Device(100, 227 * 1024, 148), _operands(p)) is None
    assert sm90.FORWARD.select(*_with_operands(_problem(dtype=np.float64), H200)) is None
    assert sm90.FORWARD.select(*_with_operands(_problem(dtype=np.float32), A100)) is None


@pytest.mark.parametrize("headdim, headdim_v, expected", [
    (32, 32, "sm90_bwd_bf16_d64_v64_q128_s2_mod_0_drop_0"), (64, 64, "sm90_bwd_bf16_d64_v64_q128_s2_mod_0_drop_0"),
    (96, 96, "sm90_bwd_bf16_d96_v96_q64_s2_mod_0_drop_0"), (80, 80, "sm90_bwd_bf16_d96_v96_q64_s2_mod_0_drop_0"),
    (64, 128, "sm90_bwd_bf16_d128_v128_q64_s2_mod_0_drop_0"),
    (128, 128, "sm90_bwd_bf16_d128_v128_q64_s2_mod_0_drop_0"), (160, 160, "sm90_bwd_bf16_d192_v192_q64_s2_mod_0_drop_0"),
    (192, 192, "sm90_bwd_bf16_d192_v192_q64_s2_mod_0_drop_0"),
        (256, 256, "sm90_bwd_bf16_d256_v256_q64_s2_mod_0_drop_0"),
])
def test_sm90_backward_buckets(headdim, headdim_v, expected):
    variant = sm90.BACKWARD.select(*_with_operands(_problem(headdim, headdim_v), H200))
    assert (variant.key if variant is not None else None) == expected
    assert sm90.BACKWARD.select(*_with_operands(_problem(headdim, headdim_v), A100)) is None
    # float32 takes the planes kernel of the smallest bucket (64, 128) that holds both head dims.
    planes = sm90.BACKWARD.select(*_with_operands(_problem(headdim, headdim_v, dtype=np.float32), H200))
    bucket = next((d for d in (64, 128) if max(headdim, headdim_v) <= d), None)
    assert (planes.param("headdim") if planes is not None else None) == bucket
    assert sm90.BACKWARD.select(*_with_operands(_problem(headdim, headdim_v, dtype=np.float64), H200)) is None


def test_backward_score_mod_only_for_modifications():
    """The backward's exponent takes any scale: only softcap and ALiBi need the score_mod kernel."""
    assert not sm90.BACKWARD.select(*_with_operands(_problem(softmax_scale=-0.5), H200)).param("score_mod")
    assert sm90.BACKWARD.select(*_with_operands(_problem(softcap=5.0), H200)).param("score_mod")


def test_non_positive_scale_takes_the_score_mod_kernel():
    """The plain kernels fold the scale in after the row maximum, which needs softmax_scale > 0."""
    assert not sm90.FORWARD.select(*_with_operands(_problem(softmax_scale=0.5), H200)).param("score_mod")
    assert sm90.FORWARD.select(*_with_operands(_problem(softmax_scale=-0.5), H200)).param("score_mod")
    assert sm90.FORWARD.select(*_with_operands(_problem(softmax_scale=0.0), H200)).param("score_mod")
    assert sm90.FORWARD.select(*_with_operands(_problem(softcap=5.0), H200)).param("score_mod")


def test_family_variable_starts_dispatch_at_the_named_family(monkeypatch):
    p = _problem()
    assert _families.select(_families.FORWARD, p, H200, _operands(p))[0].name == "sm90"
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm80")
    assert _families.select(_families.FORWARD, p, H200, _operands(p))[0].name == "sm80"
    monkeypatch.setenv("CUPYFLASH_FAMILY", "general")
    assert _families.select(_families.FORWARD, p, H200, _operands(p))[0].name == "general"
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    assert _families.select(_families.BACKWARD, p, H200, _operands(p))[0].name == "sm90"
    # A family that does not support the problem hands it on: no TMA reads rows of 59 x 2 bytes.
    assert _families.select(_families.BACKWARD, *_with_operands(_problem(headdim=59), H200))[0].name == "sm80"
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm100")
    with pytest.raises(ValueError, match="CUPYFLASH_FAMILY='sm100': expected one of sm90, sm80, general"):
        _families.select(_families.FORWARD, p, H200, _operands(p))


class _DevicePointer:
    def __init__(self, ptr):
        self.ptr = ptr


class _Array:
    """The attributes tma_addressable reads, for an array that is not on a GPU."""

    def __init__(self, shape, strides, ptr=1 << 20):
        self.shape, self.strides, self.data = shape, strides, _DevicePointer(ptr)


@pytest.mark.parametrize("array, varlen, expected", [
    (_Array((2, 300, 4, 128), (300 * 4 * 256, 4 * 256, 256, 2)), False, True),
    (_Array((2, 300, 4, 59), (300 * 4 * 118, 4 * 118, 118, 2)), False, False),   # 118-byte heads
    (_Array((2, 300, 4, 128), (300 * 4 * 256, 4 * 256, 256, 2), ptr=(1 << 20) + 8), False, False),
    (_Array((1, 300, 4, 128), (7, 4 * 256, 256, 2)), False, True),               # one batch entry: its stride is unused
    (_Array((2, 300, 4, 128), (0, 4 * 256, 256, 2)), False, False),              # broadcast batch
    (_Array((900, 4, 64), (4 * 128, 128, 2)), True, True),
    (_Array((900, 4, 64), (4 * 130, 130, 2)), True, False),
])
def test_tma_addressable(array, varlen, expected):
    assert sm90.tma_addressable(array, varlen) is expected


@pytest.mark.parametrize("batch, seqlen, heads, heads_k, headdim, expected", [
    (16, 1024, 16, 16, 128, 43),   # 512 KiB of K and V per head, 50 fit in 25 MiB: 6 sections of 43 (the last 41)
    (16, 1024, 8, 8, 256, 22),     # 1 MiB per head, 25 fit: 6 sections of 22 (the last 18), not 5 x 25 + 3
    (1, 16384, 8, 8, 256, 8),      # 16 MiB per head: none fits; the minimum of 16, at most all 8
    (4, 4096, 16, 16, 128, 16),    # 2 MiB per head, 12 fit: the minimum, 4 sections of 16
    (5, 4096, 8, 8, 128, 14),      # 40 pairs, 12 fit: the minimum 16 evened out, 14 + 14 + 12 (not 16 + 16 + 8)
    (2, 4096, 64, 8, 128, 64),     # GQA 8: 256 KiB per query head, 100 fit: two sections of the 128 pairs
    (1, 512, 3, 1, 64, 3),         # fewer pairs than fit: one section
])
def test_l2_section_keeps_a_section_in_half_of_l2(batch, seqlen, heads, heads_k, headdim, expected):
    device = common.Device(90, 227 * 1024, 132, 50 * 2**20)
    q = np.zeros((batch, seqlen, heads, headdim), ml_dtypes.bfloat16)
    kv = np.zeros((batch, seqlen, heads_k, headdim), ml_dtypes.bfloat16)
    p = problems.forward_problem(q, kv, kv, causal=True)
    assert sm90.l2_section(p, device) == expected


@pytest.mark.parametrize("headdim, seqlen_q, seqlen_k, options, tile, threads", [
    (128, 8, 1, {}, "q128_n128_s2", 384), (128, 8, 16384, {}, "q128_n128_s2", 384),
    (128, 16384, 16384, {"causal": True}, "q128_n128_s2", 384),
    (128, 16384, 16384, {"window_size": (1024, 0)}, "q128_n128_s2", 384),
    (64, 8, 1, {}, "q192_n128_s4", 512), (64, 8, 0, {}, "q192_n128_s4", 512),
    (64, 1024, 1024, {"causal": True}, "q192_n128_s4", 512), (64, 8, 16384, {}, "q192_n128_s4", 512),
])
def test_sm90_forward_tile_is_the_same_for_every_walk(headdim, seqlen_q, seqlen_k, options, tile, threads):
    """Head dim 128 takes the 2-stage tile, whose O tile fits for the staged epilogue, and head dim 64
    three consumer warpgroups (192 rows), for short, long, causal and windowed walks alike."""
    q = np.zeros((1, seqlen_q, 2, headdim), ml_dtypes.bfloat16)
    kv = np.zeros((1, seqlen_k, 2, headdim), ml_dtypes.bfloat16)
    p = problems.forward_problem(q, kv, kv, **options)
    variant = sm90.FORWARD.select(p, H200, _operands(p))
    assert variant.key == f"sm90_fwd_bf16_d{headdim}_v{headdim}_{tile}_mod_0_drop_0_top_0"
    assert sm90.fwd_stores_o(variant)
    assert sm90.fwd_threads(variant) == threads


@pytest.mark.parametrize("block_q, tile", [(128, "q128_n128_s4"), (384, "q192_n128_s4")])
def test_sm90_forward_keeps_block_masks_whole(block_q, tile):
    """A block mask whose query blocks a 192-row tile would straddle keeps head dim 64's 128-row tile."""
    from cupyflash import BlockMask

    seqlen = 8 * 384
    q = np.zeros((1, seqlen, 2, 64), ml_dtypes.bfloat16)
    layout = np.ones((1, 2, seqlen // block_q, seqlen // 128), bool)
    p = problems.forward_problem(q, q, q, block_mask=BlockMask.from_dense(layout, (block_q, 128)))
    assert sm90.FORWARD.select(p, H200, _operands(p)).key == f"sm90_fwd_bf16_d64_v64_{tile}_mod_0_drop_0_top_0"


@pytest.mark.parametrize("headdim, forward, backward", [
    (64, "sm90_fwd_bf16_d64_v64_q128_n128_s4_mod_0_drop_1_top_0", "sm90_bwd_bf16_d64_v64_q128_s2_mod_0_drop_1"),
    (128, "sm90_fwd_bf16_d128_v128_q128_n128_s2_mod_0_drop_1_top_0", "sm90_bwd_bf16_d128_v128_q64_s2_mod_0_drop_1"),
    (256, "sm90_fwd_bf16_d256_v256_q128_n80_s2_mod_0_drop_1_top_0", None),
])
def test_dropout_takes_the_hopper_kernels_and_the_general_kernels_elsewhere(headdim, forward, backward):
    """bfloat16 dropout: the sm90 forward built with it (head dim 64 on its 128-row tile, whose consumers have
    the registers for the generator) and the sm90 backward up to head dim 128 (above, its split-column
    roles have no dropout: the general kernels); the sm80 family and float32 hand it on."""
    p = _problem(headdim, causal=True, dropout_p=0.1, dropout_seed=1)
    assert sm90.FORWARD.select(p, H200, _operands(p)).key == forward
    family, variant = _families.select(_families.BACKWARD, p, H200, _operands(p))
    assert (family.name, variant.key) == (("sm90", backward) if backward else ("general", "general_bwd_dq_bf16_drop_1"))
    family, variant = _families.select(_families.FORWARD, p, A100, _operands(p))
    assert (family.name, variant.key) == ("general", "general_fwd_bf16_drop_1")
    p32 = _problem(headdim, dtype=np.float32, dropout_p=0.1, dropout_seed=1)
    family, variant = _families.select(_families.FORWARD, p32, H200, _operands(p32))
    assert (family.name, variant.key) == ("general", "general_fwd_fp32_drop_1")
    with pytest.raises(ValueError, match="not built"):
        sm90.BWD.variant("bfloat16", (256, 256, 64, 2), dropout=True)


@pytest.mark.parametrize("precision, device, expected", [
    ("highest", H200, "sm90_fwd_planes_fp32_d64_n64_s2_mod_0_tf32_0_top_0"),
    ("tf32", H200, "sm90_fwd_planes_fp32_d64_n64_s2_mod_0_tf32_1_top_0"),
    ("highest", A100, "sm80_fwd_parts_fp32_d64_n32_m1_mod_0_tf32_0_top_0"),
    ("tf32", A100, "sm80_fwd_parts_fp32_d64_n32_m1_mod_0_tf32_1_top_0"),
])
def test_float32_forward_takes_its_precision(precision, device, expected):
    """float32's forward runs in bfloat16 parts, the Hopper kernel on compute capability 9.0 and the sm80
    family's on other sm_80+ GPUs, three parts for "highest", two for "tf32" (a call whose lse leaves it:
    test_tf32_precision_takes_the_tf32_kernel_where_it_can has the others)."""
    p = _problem(64, dtype=np.float32, precision=precision)
    family, variant = _families.select(_families.FORWARD, p, device, _operands(p))
    assert (family.name, variant.key) == (expected[:4], expected)


@pytest.mark.parametrize("headdim, headdim_v, options, expected", [
    (64, None, {}, "sm90_fwd_tf32_fp32_d64_v64_n128_s2_top_0"),
    (40, 24, {"causal": True, "window_size": (30, 0)}, "sm90_fwd_tf32_fp32_d64_v64_n128_s2_top_0"),
    (96, None, {"return_max_score": True}, "sm90_fwd_tf32_fp32_d128_v128_n64_s2_top_1"),
    (128, None, {"softcap": 5.0}, "sm90_fwd_planes_fp32_d128_n64_s1_mod_1_tf32_1_top_0"),
    (160, None, {}, None),
])
def test_tf32_precision_takes_the_tf32_kernel_where_it_can(headdim, headdim_v, options, expected):
    """precision="tf32" on compute capability 9.0, in a call that returns no lse, runs the tf32 wgmma kernel
    (kernels_cu/sm90/fwd_kmajor.cu) for what sm90.kmajor_missing allows; a softcap keeps the planes kernel,
    head dims above 128 the general family; a call whose lse leaves it (a backward may follow) the planes
    kernel."""
    import dataclasses

    max_score = options.pop("return_max_score", False)
    p = dataclasses.replace(_problem(headdim, headdim_v, dtype=np.float32, precision="tf32", **options),
                            lse_returned=False)
    if max_score:
        p = dataclasses.replace(p, max_score=True)
    variant = sm90.FORWARD.select(p, H200, _operands(p))
    assert (variant and variant.key) == expected
    variant = sm90.FORWARD.select(dataclasses.replace(p, lse_returned=True), H200, _operands(p))
    assert (variant and variant.kernel) is (sm90.FWD_PLANES if expected else None)


@pytest.mark.parametrize("headdim, device, expected", [
    (64, H200, "sm80_fwd_dmma_fp64_d64_n32_m1_mod_0_top_0"), (128, H200, "sm80_fwd_dmma_fp64_d128_n16_m1_mod_0_top_0"),
    (96, A100, "sm80_fwd_dmma_fp64_d96_n16_m1_mod_0_top_0"), (160, H200, None),
    (64, common.Device(86, 99 * 1024, 84), "sm80_fwd_dmma_fp64_d64_n16_m1_mod_0_top_0"),
    (96, common.Device(86, 99 * 1024, 84), None),
])
def test_float64_forward_on_the_float64_tensor_cores(headdim, device, expected):
    """float64's forward runs the sm80 family's float64 kernel up to head dim 128 (16-key tiles from head
    dim 96, and for 64 in the 99 KB of sm_86, where 96 and 128 fit no tile), the general one above."""
    p = _problem(headdim, dtype=np.float64)
    family, variant = _families.select(_families.FORWARD, p, device, _operands(p))
    assert (family.name, variant.key if family.name == "sm80" else None) == ("sm80" if expected else "general", expected)


@pytest.mark.parametrize("dtype, headdim, precision, device, expected", [
    (np.float32, 64, "highest", H200, "sm90_bwd_planes_fp32_d64_s2_mod_0_tf32_0"),
    (np.float32, 40, "tf32", A100, "sm80_bwd_parts_fp32_d64_n64_q64_s2_mod_0_tf32_1"),
    (np.float32, 96, "highest", H200, "sm90_bwd_planes_fp32_d128_s1_mod_0_tf32_0"),
    (np.float32, 128, "tf32", H200, "sm90_bwd_planes_fp32_d128_s1_mod_0_tf32_1"),
    (np.float32, 128, "highest", A100, None), (np.float32, 160, "highest", H200, None),
    (np.float64, 64, "highest", H200, "sm80_bwd_dmma_fp64_d64_n64_q32_s1_mod_0"),
    (np.float64, 128, "highest", A100, "sm80_bwd_dmma_fp64_d128_n32_q32_s1_mod_0"),
    (np.float64, 64, "highest", common.Device(86, 99 * 1024, 84), None),
])
def test_wide_backward_on_the_tensor_cores(dtype, headdim, precision, device, expected):
    """float32 gradients run the Hopper backward on compute capability 9.0 (buckets 64 and 128) and the
    sm80 family's elsewhere; float64's the sm80 family's (buckets 64 and 128, a tile each, where it fits
    the device's shared memory: float32 at 128 needs the H100/H200's); the general one the rest.
    float32's keeps the forward's precision (its scores must be the forward's)."""
    p = _problem(headdim, dtype=dtype, precision=precision)
    family, variant = _families.select(_families.BACKWARD, p, device, _operands(p))
    assert (family.name, variant.key if family.name != "general" else None) == (
        expected.split("_")[0] if expected else "general", expected)


def _names(p, device):
    return tuple((f.name, v.key) for f, v in (_families.select(d, p, device, _operands(p))
                                              for d in (_families.FORWARD, _families.BACKWARD)))


def test_score_and_mask_functions_take_the_families_that_compile_them():
    """16-bit score_mods and mask_mods take the Hopper kernels (the forward on its 128-row tile at head dim
    64 too), or on other GPUs the sm80 ones; the backward of a score_mod whose buffers take gradients is
    the Hopper kernel's for an additive bias on 16-bit inputs at head dims 96 and 128, the sm80 kernel's
    at the others and where the derivatives do not read the score, else the general kernels'. float32
    and float64 take their tensor-core kernels too. Variants name the functions' code."""
    from cupyflash import BlockMask, mods

    bias = lambda s, b, h, qi, ki: s - 0.5 * mods.abs(qi - ki)  # noqa: E731
    p = _problem(64, score_mod=bias)
    (fwd_family, fwd), (bwd_family, bwd) = _names(p, H200)
    assert (fwd_family, bwd_family) == ("sm90", "sm90")
    assert fwd.startswith("sm90_fwd_bf16_d64_v64_q128_n128_s4_mod_0_drop_0_top_0_fn")
    assert bwd.startswith("sm90_bwd_bf16_d64_v64_q128_s2_mod_0_drop_0_fn") and bwd[-12:] == fwd[-12:]
    table = np.ones((2, 9), np.float32)
    learned = _problem(128, score_mod=lambda s, b, h, qi, ki, t: s + t[h, qi], score_mod_buffers=(table,))
    gated = _problem(128, score_mod=lambda s, b, h, qi, ki, t: s * mods.sigmoid(t[h, qi]), score_mod_buffers=(table,))
    assert [f for f, _ in _names(learned, H200)] == ["sm90", "sm90"]
    scaled = _problem(128, score_mod=lambda s, b, h, qi, ki, t: 0.5 * s + t[h, qi], score_mod_buffers=(table,))
    assert [f for f, _ in _names(scaled, H200)] == ["sm90", "sm80"]
    learned64 = _problem(64, score_mod=lambda s, b, h, qi, ki, t: s + t[h, qi], score_mod_buffers=(table,))
    assert [f for f, _ in _names(learned64, H200)] == ["sm90", "sm80"]
    assert [f for f, _ in _names(gated, H200)] == ["sm90", "general"]
    assert [f for f, _ in _names(_problem(128, score_mod=bias), A100)] == ["sm80", "sm80"]
    assert [f for f, _ in _names(learned, A100)] == ["sm80", "sm80"]
    assert [f for f, _ in _names(_problem(128, dtype=np.float32, score_mod=bias), H200)] == ["sm90", "sm90"]
    assert [f for f, _ in _names(_problem(64, dtype=np.float64, score_mod=bias), H200)] == ["sm80", "sm80"]
    learned32 = _problem(64, dtype=np.float32, score_mod=lambda s, b, h, qi, ki, t: s + t[h, qi],
                         score_mod_buffers=(table,))
    assert [f for f, _ in _names(learned32, A100)] == ["sm80", "general"]
    mask = BlockMask.from_mask_mod(lambda b, h, qi, ki: ki <= qi, 1, 1, 8, 8, block_size=(4, 4))
    masked = _problem(128, block_mask=mask)
    assert [f for f, _ in _names(masked, H200)] == ["sm90", "sm90"]
    plain = _names(_problem(128), H200)
    assert all("_fn" not in key for _, key in plain)


@pytest.mark.parametrize("family", ["sm80", "general"])
def test_forced_family_past_sm90_refuses_fp8_by_name(family, monkeypatch):
    """FP8 inputs have only the sm90 kernel: with CUPYFLASH_FAMILY naming a later family, dispatch raises
    NotImplementedError naming the variable and the dtype (it was an internal AssertionError), and the
    same problem unforced takes the sm90 family."""
    from cupyflash import _problem

    e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)
    q, k = np.zeros((2, 50, 4, 128), e4m3), np.zeros((2, 77, 2, 128), e4m3)
    p = _problem.forward_problem(q, k, k)
    operands = tuple(_plan.Slot(i, x.shape, x.dtype) for i, x in enumerate((q, k, k)))
    assert _families.select(_families.FORWARD, p, H200, operands)[0].name == "sm90"
    monkeypatch.setenv("CUPYFLASH_FAMILY", family)
    with pytest.raises(NotImplementedError, match=f"CUPYFLASH_FAMILY='{family}'.*float8_e4m3fn inputs.*sm90"):
        _families.select(_families.FORWARD, p, H200, operands)


@pytest.mark.parametrize("dtype, headdim, headdim_v, seqlen_k", [("float8_e4m3fn", 128, 128, 77), ("float32", 40, 24, 77)])
def test_kmajor_plans_encode_their_tensor_maps(dtype, headdim, headdim_v, seqlen_k, monkeypatch):
    """The K-major forwards' plans (FP8, and tf32 with its rounded copies of q and k, for a call that returns
    no lse) build on the host: the pre-passes' launches, and tensor maps of q, k (or their copies) and V^T
    with the TMA dtype, extents and boxes of 128-byte atoms the kernels read (the encodings recorded instead
    of passed to the driver)."""
    import dataclasses

    from cupyflash import _problem

    encodings = []
    monkeypatch.setattr(sm90, "_encode", lambda ptr, **fields: encodings.append(fields) or bytes(128))
    launched = []
    monkeypatch.setattr(sm90.common, "function", lambda variant, smem=0: launched.append(variant.key) or variant.key)
    dt = np.dtype(ml_dtypes.float8_e4m3fn if dtype == "float8_e4m3fn" else np.float32)
    q = np.zeros((2, 50, 4, headdim), dt)
    k, v = np.zeros((2, seqlen_k, 2, headdim), dt), np.zeros((2, seqlen_k, 2, headdim_v), dt)
    p = dataclasses.replace(_problem.forward_problem(q, k, v, causal=True,
                                                     precision="tf32" if dtype == "float32" else "highest"),
                            lse_returned=False)
    operands = tuple(_plan.Slot(i, x.shape, x.dtype) for i, x in enumerate((q, k, v)))
    variant = sm90.FORWARD.select(p, H200, operands)
    b = _plan.PlanBuilder()
    out, lse = sm90.FORWARD.plan(b, variant, p, *operands, H200)
    for _, _, _, encode in b._maps:
        encode(0)
    by_box = [(f["dtype_code"], f["dims"], f["box"]) for f in encodings]
    if dtype == "float32":
        assert launched == ["tf32_transpose_values", "tf32_round_rows", "tf32_round_rows", variant.key]
        assert by_box == [(7, (40, 50, 4, 2), (32, 128, 1, 1)), (7, (40, seqlen_k, 2, 2), (32, 128, 1, 1)),
                          (7, (80, 24, 2, 2), (32, 64, 1, 1))]
        assert out.dtype == np.float32 and lse.dtype == np.float64
    else:
        assert launched == ["fp8_transpose_values", variant.key]
        assert by_box == [(0, (128, 50, 4, 2), (128, 128, 1, 1)), (0, (128, seqlen_k, 2, 2), (128, 128, 1, 1)),
                          (0, (96, 128, 2, 2), (128, 128, 1, 1))]
        assert out.dtype == ml_dtypes.bfloat16 and lse.dtype == np.float32


@pytest.mark.parametrize("page_size, headdim, box_rows", [
    (16, 128, 16), (64, 128, 64), (256, 128, 128), (8, 64, 8), (48, 128, 16), (64, 256, 16), (4, 128, None),
    (12, 128, None),
])
def test_paged_keys_take_the_hopper_forward_in_whole_swizzle_periods(page_size, headdim, box_rows):
    """A problem with a block table (a KV cache's prefill) runs the 16-bit Hopper forward when the TMA boxes
    (the largest divisor of the page size and the tile's keys: d256's tiles have 80) are multiples of 8
    rows, and no other family: float32 and the other families refuse paged keys."""
    from cupyflash import _problem

    max_pages = 1024 // page_size + 1
    q = np.zeros((2, 100, 4, headdim), ml_dtypes.bfloat16)
    pool = np.zeros((2 * max_pages, page_size, 2, headdim), ml_dtypes.bfloat16)
    p = _problem.Problem(xp=np, dtype=np.dtype(ml_dtypes.bfloat16), batch=2, seqlen_q=100, seqlen_k=max_pages * page_size,
                         heads=4, heads_k=2, headdim=headdim, headdim_v=headdim, softmax_scale=0.1, window_right=0,
                         seqused_k=np.array([30, 1000], np.int32),
                         block_table=np.arange(2 * max_pages, dtype=np.int32).reshape(2, max_pages), page_size=page_size)
    operands = tuple(_plan.Slot(i, x.shape, x.dtype) for i, x in enumerate((q, pool, pool)))
    variant = sm90.FORWARD.select(p, H200, operands)
    assert (variant is not None) == (box_rows is not None)
    if box_rows is not None:
        assert variant.kernel in (sm90.FWD, sm90.FWD_PAIRS)
        assert sm90.paged_box_rows(page_size, variant.param("block_n")) == box_rows
    if box_rows is None:
        with pytest.raises(AssertionError, match="the general family supports every problem"):
            _families.select(_families.FORWARD, p, H200, operands)
    p32 = dataclasses.replace(p, dtype=np.dtype(np.float32))
    assert sm90.FORWARD.select(p32, H200, operands) is None


@pytest.mark.parametrize("headdim, headdim_v, page_size, v_box_rows", [
    (128, 128, 64, 64), (128, 128, 16, 16), (192, 192, 32, 32), (256, 256, 64, 16), (96, 96, 64, 0), (128, 128, 24, 0),
    (64, 64, 16, 0), (256, 128, 16, 0), (192, 192, 24, 0),
])
def test_paged_plan_reads_the_pools_in_boxes_of_pages(headdim, headdim_v, page_size, v_box_rows, monkeypatch):
    """The plan of a paged problem: the block table, its row stride, the page size, the box rows and the
    rows a table row covers in Sm90FwdMaps, and k and v mapped as their pools (dim, page_size, heads_k,
    pages) with boxes of box_rows; v instead as (64, page_size, atoms, heads_k, pages), one box over every
    64-column atom (Sm90FwdMaps::v_box_rows), where its head dim is a multiple of 64 above 64 and the boxes
    a power of two of at least 16 rows (not at d96, at pages of 24's 8-row boxes, at d64's one atom, or for
    a v narrower than its bucket's tiles: d256's bucket has four atoms, a v of 128 columns two)."""
    from cupyflash import _problem

    encodings = []
    monkeypatch.setattr(sm90, "_encode", lambda ptr, **fields: encodings.append(fields) or bytes(128))
    monkeypatch.setattr(sm90.common, "function", lambda variant, smem=0: variant.key)
    monkeypatch.setattr(sm90, "max_active_clusters", lambda *args: 60)
    pages = 640 // page_size + 1
    table = _plan.Slot(9, (2, pages), np.dtype(np.int32))
    p = _problem.Problem(xp=np, dtype=np.dtype(ml_dtypes.bfloat16), batch=2, seqlen_q=100, seqlen_k=pages * page_size,
                         heads=4, heads_k=2, headdim=headdim, headdim_v=headdim_v, softmax_scale=0.1, window_right=0,
                         seqused_k=_plan.Slot(8, (2,), np.dtype(np.int32)), block_table=table, page_size=page_size)
    k_pool, v_pool = (2 * pages, page_size, 2, headdim), (2 * pages, page_size, 2, headdim_v)
    operands = (_plan.Slot(0, (2, 100, 4, headdim), p.dtype), _plan.Slot(1, k_pool, p.dtype),
                _plan.Slot(2, v_pool, p.dtype))
    b = _plan.PlanBuilder()
    variant = sm90.FORWARD.select(p, H200, operands)
    sm90.FORWARD.plan(b, variant, p, *operands, H200)
    box_rows = sm90.paged_box_rows(page_size, variant.param("block_n"))
    maps = next(s for s in b._structs if s.dtype == sm90.MAPS)
    assert (int(maps["block_table"][0]), int(maps["table_stride"][0]), int(maps["page_size"][0]),
            int(maps["box_rows"][0]), int(maps["capacity"][0]), int(maps["v_box_rows"][0])) == (
                table.data.ptr, pages, page_size, box_rows, pages * page_size, v_box_rows)
    for _, _, _, encode in b._maps:
        encode(0)
    def pool_map(dim):
        row_bytes = 2 * dim * 2
        return (dim, page_size, 2, 2 * pages), (row_bytes, dim * 2, page_size * row_bytes), (64, box_rows, 1, 1)

    keys, values = pool_map(headdim), pool_map(headdim_v)
    if v_box_rows:
        row_bytes = 2 * headdim_v * 2
        values = ((64, page_size, headdim_v // 64, 2, 2 * pages), (row_bytes, 128, headdim_v * 2, page_size * row_bytes),
                  (64, box_rows, headdim_v // 64, 1, 1))
    assert [(f["dims"], f["strides"], f["box"]) for f in encodings[1:3]] == [keys, values]
    assert [(f["dims"], f["box"]) for f in encodings[:1]] == [((headdim, 100, 4, 2), (64, variant.param("block_m"), 1, 1))]


@pytest.mark.parametrize("heads, heads_k, headdim, change, paired", [
    (4, 2, 128, {}, True), (8, 2, 128, {}, True), (6, 2, 128, {}, False), (4, 4, 128, {}, False),
    (4, 2, 64, {}, False), (4, 2, 128, {"softcap": 5.0}, False), (4, 2, 128, {"dropout_p": 0.1}, False),
    (4, 2, 128, {"block_table": None, "page_size": 0}, False), (4, 2, 128, {"page_size": 32}, True),
    (4, 2, 128, {"page_size": 64}, False),
])
def test_paged_prefill_pairs_query_heads_of_one_kv_head(heads, heads_k, headdim, change, paired, monkeypatch):
    """A paged prefill whose GQA groups are even (two query heads of one kv head per cluster) at a head dim
    FWD_PAIRS is built for runs sm90_fwd_pairs where its pages take boxes of at most
    FWD_PAIRS_MAX_BOX_ROWS rows (32: four boxes a 128-key tile; pages of 64 take two and stay unpaired),
    with neither score modification nor dropout (its kernel has neither), never without a block table. Its
    plan launches whole clusters, two CTAs each, as many as the occupancy query allows (fewer than the SMs'
    half where GPCs are odd) and no more than the pairs of work tiles; its longest-first sections count work
    tiles of two heads."""
    from cupyflash import _problem

    monkeypatch.setattr(sm90, "_encode", lambda ptr, **fields: bytes(128))
    monkeypatch.setattr(sm90.common, "function", lambda variant, smem=0: variant.key)
    monkeypatch.setattr(sm90, "max_active_clusters", lambda function, threads, smem, ctas, device: 60)
    page, pages = 16, 64
    dt = np.dtype(ml_dtypes.bfloat16)
    p = _problem.Problem(xp=np, dtype=dt, batch=2, seqlen_q=300, seqlen_k=pages * page, heads=heads, heads_k=heads_k,
                         headdim=headdim, headdim_v=headdim, softmax_scale=0.1, window_right=0,
                         seqused_k=_plan.Slot(8, (2,), np.dtype(np.int32)),
                         block_table=_plan.Slot(9, (2, pages), np.dtype(np.int32)), page_size=page)
    p = dataclasses.replace(p, **change)
    if p.block_table is None:
        operands = tuple(_plan.Slot(i, (2, n, h, headdim), dt) for i, (n, h) in
                         enumerate(((300, heads), (pages * page, heads_k), (pages * page, heads_k))))
    else:
        pool = (2 * pages, page, heads_k, headdim)
        operands = (_plan.Slot(0, (2, 300, heads, headdim), dt), _plan.Slot(1, pool, dt), _plan.Slot(2, pool, dt))
    variant = sm90.FORWARD.select(p, H200, operands)
    assert variant.kernel is (sm90.FWD_PAIRS if paired else sm90.FWD)
    b = _plan.PlanBuilder()
    sm90.FORWARD.plan(b, variant, p, *operands, H200)
    (function, grid, threads, smem, structs), = b._launches
    schedule = next(x for x in structs if x.dtype == sm90.SCHEDULE)
    tiles = -(-300 // variant.param("block_m")) * 2 * heads  # (2 batch entries)
    if paired:
        assert grid == (2 * min(tiles // 2, 60, H200.sm_count // 2), 1, 1)
        assert int(schedule["section"][0]) == max(1, sm90.l2_section(p, H200) // 2)
    else:
        assert grid == (min(tiles, H200.sm_count), 1, 1)


def test_packed_queries_read_page_pools_in_place(monkeypatch):
    """flash_attention_varlen's block_table on the Hopper forward (cupyflash/_cuda.py's paged_in_place):
    packed queries (their map the packed view), the pools' maps with boxes of box_rows (v's spanning both
    atoms), and the sequences' rows of the problem b * capacity apart (paged_counts_on_device's layout)."""
    from cupyflash import _problem

    encodings = []
    monkeypatch.setattr(sm90, "_encode", lambda ptr, **fields: encodings.append(fields) or bytes(128))
    monkeypatch.setattr(sm90.common, "function", lambda variant, smem=0: variant.key)
    monkeypatch.setattr(sm90, "max_active_clusters", lambda *args: 60)
    batch, capacity, page = 3, 256, 16
    dt = np.dtype(ml_dtypes.bfloat16)
    q = np.zeros((150, 8, 128), dt)
    placeholder = np.zeros((batch * capacity, 2, 128), dt)
    cu_q = np.array([0, 70, 70, 150], np.int32)
    cu_k = (np.arange(batch + 1) * capacity).astype(np.int32)
    p = _problem.varlen_forward_problem(q, placeholder, placeholder, cu_q, cu_k, max_seqlen_q=80, max_seqlen_k=capacity,
                                        causal=True, seqused_k=np.array([200, 0, 77], np.int32))
    table = _plan.Slot(9, (batch, capacity // page), np.dtype(np.int32))
    p = dataclasses.replace(p, block_table=table, page_size=page, cu_seqlens_q=_plan.Slot(6, (4,), np.dtype(np.int32)),
                            cu_seqlens_k=_plan.Slot(7, (4,), np.dtype(np.int32)),
                            seqused_k=_plan.Slot(8, (3,), np.dtype(np.int32)))
    pool = _plan.Slot(1, (40, page, 2, 128), dt)
    operands = (_plan.Slot(0, q.shape, dt), pool, _plan.Slot(2, pool.shape, dt))
    variant = sm90.FORWARD.select(p, H200, operands)
    assert variant is not None and variant.kernel is sm90.FWD_PAIRS  # (query heads 8 over kv heads 2)
    b = _plan.PlanBuilder()
    sm90.FORWARD.plan(b, variant, p, *operands, H200)
    for _, _, _, encode in b._maps:
        encode(0)
    assert [(f["dims"], f["box"]) for f in encodings[:3]] == [((128, 150, 8, 1), (64, 128, 1, 1)),
                                                              ((128, page, 2, 40), (64, page, 1, 1)),
                                                              ((64, page, 2, 2, 40), (64, page, 2, 1, 1))]
