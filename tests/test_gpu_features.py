"""Windows, softcap, ALiBi, block masks and packed batches on the GPU kernels (tensor-core kernels for
float16/bfloat16; the sm80 family's forward and the general kernels for float32/float64) against the float64 oracle, forward and
backward; the device-side check of packed batches; NaN propagation. GPU only."""

import numpy as np
import pytest
from cases import DENSE, VARLEN, build, dense_ids, varlen_ids
from helpers import (
    DTYPES,
    OUTPUT_FACTOR,
    assert_within_rule,
    check_dense,
    check_varlen,
    gpu_available,
    packed_offsets,
    random_layout,
    random_qkv,
    to_host,
    use_family,
    with_families,
)

import cupyflash
from cupyflash import _families, reference

pytestmark = pytest.mark.gpu

if gpu_available():
    import cupy
else:
    cupy = None


@pytest.mark.parametrize("case, family", with_families(DENSE, lambda c: c[2], dense_ids()))
def test_dense_features(case, family, monkeypatch):
    use_family(monkeypatch, family)
    _, sizes, dtype, causal, options = case
    batch, seqlen_q, seqlen_k, heads = sizes[:4]
    check_dense(cupy, sizes, dtype, causal=causal, **build(cupy, batch, heads, seqlen_q, seqlen_k, options))


@pytest.mark.parametrize("headdim", [36, 100, 30])
@pytest.mark.parametrize("deterministic", [False, True])
def test_hopper_float32_backward_dq_in_place(headdim, deterministic, monkeypatch):
    """The Hopper float32 backward adds dQ straight into dq (BwdArgs::dq_in_place: head dims that are
    multiples of 4, not deterministic; the others take the float32 buffers and the conversion): head dims
    below their bucket, GQA, a dense causal batch whose last 64-row tile crosses the sequence's end, and
    packed sequences (one empty, tiles across sequence boundaries), against the oracle; the plans (built
    afresh) map dq itself exactly where they should."""
    from cupyflash import _api, _families
    from cupyflash._families import sm90

    if _families.common.current_device().capability != 90:
        pytest.skip("the Hopper float32 backward")
    _api.PLANS.clear()
    maps = []
    dq_map = sm90.dq_map
    monkeypatch.setattr(sm90, "dq_map", lambda *args, **kwargs: maps.append(args[2]) or dq_map(*args, **kwargs))
    dt = DTYPES["float32"]
    check_dense(cupy, (2, 150, 130, 4, 2, headdim, headdim), dt, causal=True, deterministic=deterministic)
    check_varlen(cupy, [70, 0, 129, 33], [90, 5, 129, 200], 4, 2, headdim, headdim, dt, causal=True,
                 deterministic=deterministic)
    assert len(maps) == (2 if headdim % 4 == 0 and not deterministic else 0)


@pytest.mark.parametrize("case, family", with_families(VARLEN, lambda c: c[7], varlen_ids()))
@pytest.mark.parametrize("checked_on", ["host", "device"])
def test_varlen_features(case, family, checked_on, monkeypatch):
    use_family(monkeypatch, family)
    _, lengths_q, lengths_k, heads, heads_k, headdim, headdim_v, dtype, causal, options = case
    max_seqlen = None if checked_on == "host" else (max(lengths_q), max(lengths_k))
    check_varlen(cupy, lengths_q, lengths_k, heads, heads_k, headdim, headdim_v, dtype, causal=causal,
                 max_seqlen=max_seqlen, **build(cupy, len(lengths_q), heads, 0, 0, options))


@pytest.mark.parametrize("family", ["", "sm80", "general"])
@pytest.mark.parametrize("checked_on", ["host", "device"])
def test_varlen_seqused_k(family, checked_on, monkeypatch):
    """flash_attention_varlen's seqused_k on every family (common/sequence.cuh clamps each packed sequence's
    keys to it): a sequence using none, one using all, partial tiles; on the device path (both max_seqlen
    given) the plan's own seqused_k slot, a second call with other counts running the plan."""
    use_family(monkeypatch, family)
    max_seqlen = None if checked_on == "host" else (300, 700)
    for used in ([200, 0, 519], [37, 700, 1]):
        check_varlen(cupy, [300, 1, 80], [260, 700, 519], 4, 2, 64, 64, DTYPES["bfloat16"], causal=True, backward=False,
                     max_seqlen=max_seqlen, seqused_k=cupy.asarray(np.array(used, np.int32)), seed=len(used) + used[0])


@pytest.mark.parametrize("dtype, page_size, in_place", [("bfloat16", 16, False), ("float32", 1, False),
                                                       ("float16", 64, False), ("bfloat16", 16, True),
                                                       ("float16", 64, True)])
def test_varlen_paged_keys_cupy(dtype, page_size, in_place, monkeypatch):
    """flash_attention_varlen's block_table on CuPy: the pages gathered on the device into each sequence's
    capacity (the in-place path turned away), or on an H100/H200 read in place by the Hopper forward's paged
    producer; counted with seqused_k, against the oracle (its own gather a loop over keys); pages in shuffled
    order, sequences of 0 to 200 keys, GQA, causal, the caller's seqused_k on top; then a sequence with a page
    outside the pool gets NaN rows (out, lse, the maximum score) and the others are unchanged."""
    from cupyflash import _cuda

    if in_place and _families.common.current_device().capability != 90:
        pytest.skip("the pages are read in place on compute capability 9.0")
    taken = []
    paged_in_place = _cuda.paged_in_place
    monkeypatch.setattr(_cuda, "paged_in_place", (lambda *args: taken.append(paged_in_place(*args)) or taken[-1])
                        if in_place else (lambda *args: taken.append(None)))
    dt = DTYPES[dtype]
    rng = np.random.default_rng(page_size)
    lengths_q, lengths_k = [5, 0, 70, 33], [200, 7, 0, 130]
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lengths_q, lengths_k))
    max_pages = -(-max(lengths_k) // page_size)
    num_pages = 4 * max_pages + 2
    table = rng.permutation(num_pages)[:4 * max_pages].reshape(4, max_pages).astype(np.int32)
    q = rng.standard_normal((int(cu_q[-1]), 4, 64)).astype(dt)
    k, v = (rng.standard_normal((num_pages, page_size, 2, 64)).astype(dt) for _ in range(2))
    used = np.array([150, 7, 0, 130], np.int32)
    arrays = [cupy.asarray(x) for x in (q, k, v, cu_q, cu_k)]
    out, lse, top = cupyflash.flash_attention_varlen(*arrays, causal=True, block_table=cupy.asarray(table),
                                                     seqused_k=cupy.asarray(used), return_lse=True,
                                                     return_max_score=True)
    wide = np.float64
    want = reference.attention_varlen(q, k, v, cu_q, cu_k, True, block_table=table, seqused_k=used, compute_dtype=wide,
                                      return_max_score=True)
    base = reference.attention_varlen(q, k, v, cu_q, cu_k, True, block_table=table, seqused_k=used, compute_dtype=dt,
                                      return_max_score=True)
    for name, got, expected, plain in zip(("out", "lse", "max_score"), (out, lse, top), want, base):
        assert_within_rule(name, got, expected, plain, OUTPUT_FACTOR)
    bad = table.copy()
    bad[2, 0] = num_pages + 5  # sequence 2 uses no key: its pages are not read, and not checked
    bad[3, 1] = -1
    # (both max_seqlen given: cu_seqlens_q checked on the device, no host synchronization at all)
    out2, lse2, top2 = cupyflash.flash_attention_varlen(*arrays, causal=True, block_table=cupy.asarray(bad),
                                                        seqused_k=cupy.asarray(used), return_lse=True,
                                                        return_max_score=True, max_seqlen_q=max(lengths_q),
                                                        max_seqlen_k=max(lengths_k))
    rows = slice(int(cu_q[3]), int(cu_q[4]))
    host = [to_host(x).astype(np.float64) for x in (out, lse, top, out2, lse2, top2)]
    assert np.isnan(host[3][rows]).all() and np.isnan(host[4][:, rows]).all() and np.isnan(host[5][3]).all()
    assert (host[3][:rows.start] == host[0][:rows.start]).all() and (host[5][:3] == host[2][:3]).all()
    assert all((x is not None) == in_place for x in taken) and len(taken) == 2


@pytest.mark.parametrize("dtype, causal", [("bfloat16", True), ("float32", True), ("bfloat16", False)])
def test_varlen_deterministic_and_long(dtype, causal):
    """Sequences longer than one tile of every kernel, GQA, the ordered sum (without a mask, on the Hopper
    kernel, the rotated walks: each sequence's own tile counts)."""
    check_varlen(cupy, [300, 1, 520], [260, 700, 519], 4, 2, 64, 64, dtype, causal=causal, deterministic=True)


def test_block_sparse_deterministic_is_reproducible_and_right():
    """The ordered sum follows the block-sparse lists (turns counted over the listed key tiles)."""
    sizes = (1, 700, 650, 4, 2, 64, 64)
    mask = cupyflash.BlockMask.from_dense(random_layout((1, 4, 11, 11), 0.35, 2), (64, 64))
    options = dict(block_mask=mask, window_size=(300, 40))
    got = check_dense(cupy, sizes, "bfloat16", causal=False, deterministic=True, seed=5, **options)
    q, k, v = random_qkv(cupy, *sizes[:5], 64, 64, DTYPES["bfloat16"], seed=5)
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
    dout = cupy.asarray(np.random.default_rng(6).standard_normal(out.shape).astype(out.dtype))
    runs = [[g.get() for g in cupyflash.flash_attention_backward(dout, q, k, v, out, lse, deterministic=True, **options)]
            for _ in range(10)]
    for again in runs[1:]:
        for a, b in zip(runs[0], again):
            assert np.array_equal(a, b)
    assert got["dq"].shape == q.shape


def test_varlen_malformed_offsets():
    """Host check (max_seqlen None): ValueError. Device check (both given, no synchronization): every
    output NaN, and nothing read or written outside the packed tensors."""
    q, k, v = (cupy.asarray(np.random.default_rng(1).standard_normal((20, 2, 16)).astype(np.float16)) for _ in range(3))
    bad = cupy.asarray(np.array([0, 12, 9, 20], np.int32))  # decreasing
    good = cupy.asarray(np.array([0, 9, 12, 20], np.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing from 0 to 20"):
        cupyflash.flash_attention_varlen(q, k, v, bad, good)
    out, lse = cupyflash.flash_attention_varlen(q, k, v, bad, good, max_seqlen_q=12, max_seqlen_k=9, return_lse=True)
    assert bool(cupy.isnan(out).all()) and bool(cupy.isnan(lse).all())
    # A sequence longer than max_seqlen is malformed too (the launch was sized for max_seqlen).
    out = cupyflash.flash_attention_varlen(q, k, v, good, good, max_seqlen_q=8, max_seqlen_k=9)
    assert bool(cupy.isnan(out).all())
    out, lse = cupyflash.flash_attention_varlen(q, k, v, good, good, max_seqlen_q=9, max_seqlen_k=9, return_lse=True)
    grads = cupyflash.flash_attention_varlen_backward(out, q, k, v, out, lse, bad, good, max_seqlen_q=12,
                                                      max_seqlen_k=9)
    assert all(bool(cupy.isnan(g).all()) for g in grads)
    assert not bool(cupy.isnan(out).any())


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_propagates_like_the_reference(dtype, where):
    """Regression: a NaN in q or k came back as silent zeros (out 0, lse -inf) on the float32/float64
    GPU path; every path now gives NaN exactly where the reference does."""
    dt = DTYPES[dtype]
    q, k, v = random_qkv(np, 1, 70, 90, 2, 1, 64, 64, dt, seed=21)
    if where == "q":
        q[0, 40, 1, 3] = np.nan
    else:
        k[0, 50, 0, 2] = np.nan
    for causal in (False, True):
        out, lse = cupyflash.flash_attention(*(cupy.asarray(x) for x in (q, k, v)), causal=causal, return_lse=True)
        with np.errstate(invalid="ignore"):
            ref_out, ref_lse = reference.attention(q, k, v, causal)
        np.testing.assert_array_equal(np.isnan(to_host(out)), np.isnan(ref_out))
        np.testing.assert_array_equal(np.isnan(to_host(lse)), np.isnan(ref_lse))
        if not causal:
            dout = np.ones(out.shape, dt)
            grads = cupyflash.flash_attention_backward(cupy.asarray(dout), *(cupy.asarray(x) for x in (q, k, v)), out,
                                                       lse)
            with np.errstate(invalid="ignore"):
                ref_grads = reference.attention_backward(dout, q, k, v)
            for got, ref in zip(grads, ref_grads):
                np.testing.assert_array_equal(np.isnan(to_host(got)), np.isnan(ref))


def test_score_modifications_take_the_tensor_core_kernels():
    from cupyflash import _problem

    q, k, v = random_qkv(cupy, 1, 3, 3, 2, 2, 64, 64, DTYPES["float16"], seed=3)
    slopes = cupy.ones(2, cupy.float32)
    p = _problem.forward_problem(q, k, v, softcap=3.0, alibi_slopes=slopes)
    device = _families.common.current_device()
    family, variant = _families.select(_families.FORWARD, p, device, (q, k, v))
    expected = ("sm90_fwd_fp16_d64_v64_q192_n128_s4_mod_1_drop_0_top_0" if device.capability == 90
                else "sm80_fwd_fp16_d64_n64_m2_mod_1_top_0")
    assert variant.key == expected


def test_block_mask_lists_are_built_once_per_tile_shape():
    mask = cupyflash.BlockMask.from_dense(cupy.asarray(random_layout((1, 1, 4, 4), 0.5, 1)), (64, 64))
    q, k, v = random_qkv(cupy, 1, 256, 256, 2, 2, 64, 64, DTYPES["bfloat16"], seed=4)
    cupyflash.flash_attention(q, k, v, block_mask=mask)
    shapes = set(mask._lists)
    cupyflash.flash_attention(q, k, v, block_mask=mask)
    assert set(mask._lists) == shapes and shapes  # the forward kernel's tile shape, built by the first call only


def test_packed_offsets_helper():
    assert packed_offsets([3, 0, 2]).tolist() == [0, 3, 3, 5]


def test_misaligned_dout_is_read_without_vector_copies():
    """Regression (review): the backward streamed dO with 16-byte cp.async when only q, k and v were
    aligned; a dO view 2 bytes off (or with an odd head stride) must take the element-wise loads."""
    q, k, v = random_qkv(cupy, 1, 256, 256, 4, 4, 64, 64, DTYPES["float16"], seed=7)
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True)
    for wide in (cupy.ones((1, 256, 4, 65), cupy.float16)[..., 1:], cupy.ones((1, 256, 4, 68), cupy.float16)[..., :64]):
        wide[...] = cupy.asarray(np.random.default_rng(8).standard_normal(out.shape).astype(np.float16))
        grads = cupyflash.flash_attention_backward(wide, q, k, v, out, lse)
        want = cupyflash.flash_attention_backward(cupy.ascontiguousarray(wide), q, k, v, out, lse, deterministic=True)
        for got, ref in zip(grads, want):
            assert float(cupy.abs(got.astype(cupy.float32) - ref.astype(cupy.float32)).max()) < 1e-2


def test_varlen_zero_max_seqlen_with_rows_is_nan():
    """Regression (review): max_seqlen 0 on the device-check path sized an empty grid and the launch failed."""
    q, k, v = (cupy.ones((20, 2, 16), cupy.float16) for _ in range(3))
    cu = cupy.asarray(np.array([0, 9, 20], np.int32))
    out, lse = cupyflash.flash_attention_varlen(q, k, v, cu, cu, max_seqlen_q=0, max_seqlen_k=11, return_lse=True)
    assert bool(cupy.isnan(out).all()) and bool(cupy.isnan(lse).all())
    grads = cupyflash.flash_attention_varlen_backward(out, q, k, v, out, lse, cu, cu, max_seqlen_q=11, max_seqlen_k=0)
    assert all(bool(cupy.isnan(g).all()) for g in grads)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("sizes, causal", [((2, 137, 201, 6, 2, 64, 64), True), ((1, 300, 96, 4, 4, 128, 128), True),
                                           ((2, 65, 65, 8, 1, 96, 96), False)])
def test_sinks(sizes, causal, dtype):
    """Sinks on every dtype's default kernels (joined in their epilogues; the backward from the lse that
    holds them): out, lse, dq, dk, dv and dsinks against the oracle. The rows that see no key (causal,
    seqlen_q > seqlen_k) get lse = sink."""
    heads = sizes[3]
    sinks = cupy.asarray((np.random.default_rng(heads).standard_normal(heads) * 2).astype(np.float32))
    check_dense(cupy, sizes, DTYPES[dtype], causal=causal, sinks=sinks)


def test_sinks_varlen():
    sinks = cupy.asarray(np.array([0.5, -1.0, -np.inf, 2.0], np.float32))
    check_varlen(cupy, [77, 0, 130], [90, 12, 64], 4, 2, 64, 64, DTYPES["bfloat16"], causal=True,
                 max_seqlen=(130, 90), sinks=sinks)


@pytest.mark.parametrize("family, dtype", [("sm90", "bfloat16"), ("sm90", "float32"), ("sm80", "float16"),
                                           ("sm80", "float32"), ("sm80", "float64"), ("general", "bfloat16"),
                                           ("general", "float64")])
def test_sinks_fused_on_every_family(family, dtype, monkeypatch):
    """Every forward's epilogue joins the sink (fragment/softmax.cuh's finish, the general row softmax),
    NaN sinks and rows without keys included."""
    use_family(monkeypatch, family)
    sinks = cupy.asarray(np.array([1.5, -np.inf, -3.0, 0.25], np.float32))
    check_dense(cupy, (2, 150, 97, 4, 2, 64, 64), DTYPES[dtype], causal=True, sinks=sinks)
    q, k, v = random_qkv(cupy, 1, 8, 8, 4, 2, 64, 64, DTYPES[dtype], seed=1)
    out, lse = cupyflash.flash_attention(q, k, v, sinks=cupy.asarray(np.array([0, np.nan, 0, 0], np.float32)),
                                         return_lse=True)
    assert bool(cupy.isnan(lse[0, 1]).all()) and not bool(cupy.isnan(lse[0, [0, 2, 3]]).any())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("fused", [False, True], ids=["elementwise", "fused"])
def test_apply_rotary_matches_numpy(fused, packed, dtype):
    """The CuPy paths (the fused kernel for columns at unit stride, the elementwise kernels for a strided
    x) against the NumPy one (within one rounding: the GPU may fuse a * c - b * s); CuPy offsets past
    the tables give NaN in the rotated columns only."""
    dt = DTYPES[dtype]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 40, 4, 64)).astype(dt)
    angles = rng.uniform(-5, 5, (64, 24))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    offsets = np.array([0, 11, 24], np.int32)
    options = {"seqlen_offsets": offsets}
    if packed:
        x = x.reshape(120, 4, 64)
        options["cu_seqlens"] = packed_offsets([40, 50, 30])
    want = cupyflash.apply_rotary(x, cos, sin, **options).astype(np.float64)
    gpu = {name: cupy.asarray(value) for name, value in options.items()}

    def device_x():  # every other column of a wider array: its columns are not at unit stride
        return cupy.asarray(x) if fused else cupy.asarray(np.stack([x, x], axis=-1))[..., 0]

    got = to_host(cupyflash.apply_rotary(device_x(), cupy.asarray(cos), cupy.asarray(sin), **gpu))
    # One rounding to dt, plus the accumulator's rounding of the two products (a fused multiply-add may
    # round differently where they cancel).
    eps = np.finfo(np.float64 if dt == np.float64 else np.float32).eps
    tolerance = np.spacing(np.abs(want).astype(dt)).astype(np.float64) + 4 * eps * np.abs(x.astype(np.float64)).max()
    assert (np.abs(got.astype(np.float64) - want) <= tolerance).all()
    gpu["seqlen_offsets"] = cupy.asarray(np.array([0, 11, 40], np.int32))  # the last rows past the 64 positions
    far = to_host(cupyflash.apply_rotary(device_x(), cupy.asarray(cos), cupy.asarray(sin), **gpu))
    rows = far.reshape(-1, 4, 64)[-30:].astype(np.float64)
    assert np.isnan(rows[-1, :, :48]).all() and not np.isnan(rows[..., 48:]).any()
