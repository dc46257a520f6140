"""Dropout on the GPU (GPU only): the device generator (kernels_cu/common/dropout.cuh) against the
definition bit for bit, through cupyflash.dropout_mask; the Hopper 16-bit forward and backward and the
general kernels built with dropout against the float64 oracle given the same keep mask (every dtype, GQA, causal,
windows, packed batches, sinks);
runs reproducible to the bit and dispatch; the maximum score of every forward kernel and the decode kernel."""

import numpy as np
import pytest
from helpers import DTYPES, check_dense, check_varlen, gpu_available, random_qkv, to_host, use_family

import cupyflash
from cupyflash import _families, _problem

pytestmark = pytest.mark.gpu

if gpu_available():
    import cupy
else:
    cupy = None


@pytest.mark.parametrize("shape, p, seed, offset", [((2, 3, 37, 21), 0.5, 0, 0), ((1, 2, 300, 517), 0.1, 2**64 - 1, 7),
                                                    ((3, 1, 16, 16), 0.83, 12345678901, 2**32 - 1),
                                                    ((1, 1, 5, 0), 0.2, 1, 0)])
def test_device_mask_is_the_definition(shape, p, seed, offset):
    want = cupyflash.dropout_mask(seed, shape, p, offset)
    got = cupyflash.dropout_mask(seed, shape, p, offset, like=cupy.empty(0))
    assert isinstance(got, cupy.ndarray) and got.dtype == bool and got.shape == shape
    np.testing.assert_array_equal(to_host(got), want)


_CASES = [
    # sizes (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v), causal, options
    ((2, 77, 101, 4, 2, 64, 64), True, {}),
    ((1, 130, 45, 6, 3, 40, 24), False, {"window_size": (20, 5)}),
    ((2, 64, 64, 2, 1, 128, 128), True, {"softcap": 8.0}),
]


@pytest.mark.parametrize("dtype, family", [("float16", ""), ("bfloat16", ""), ("bfloat16", "general"),
                                           ("float32", ""), ("float64", "")])
@pytest.mark.parametrize("case", _CASES, ids=["gqa-causal", "window-d40-v24", "softcap-d128"])
def test_dense(case, dtype, family, monkeypatch):
    """16-bit: the Hopper forward and backward built with dropout where they take the problem (the default
    dispatch: these head dims are within the backward's 128), and the general kernels."""
    use_family(monkeypatch, family)
    sizes, causal, options = case
    check_dense(cupy, sizes, DTYPES[dtype], causal=causal, dropout_p=0.2, dropout_seed=99, dropout_offset=sizes[1],
                **options)


@pytest.mark.parametrize("sizes", [(1, 150, 330, 2, 1, 192, 192), (1, 140, 300, 2, 2, 192, 128),
                                   (1, 130, 410, 2, 1, 256, 256)], ids=["d192-n96", "d192-v128", "d256-n80"])
def test_hopper_forward_wide_heads(sizes):
    """The Hopper forward with dropout at head dims above the backward's 128, over walks of several key
    tiles: 96-key tiles (three generator calls a tile) and 80-key tiles, whose calls straddle the tiles (each
    16-key step draws a call and uses the half its keys' bit 4 picks), against the oracle given the same
    keep mask."""
    q, k, v = random_qkv(cupy, *sizes, DTYPES["bfloat16"], seed=0)
    p = _problem.forward_problem(q, k, v, causal=True, dropout_p=0.3, dropout_seed=5, dropout_offset=7)
    family, _ = _families.select(_families.FORWARD, p, _families.common.current_device(), (q, k, v))
    if family.name != "sm90":
        pytest.skip("the Hopper forward's tiles")
    check_dense(cupy, sizes, DTYPES["bfloat16"], causal=True, backward=False, dropout_p=0.3, dropout_seed=5,
                dropout_offset=7)


def test_dense_with_sinks():
    sinks = cupy.asarray(np.array([0.5, -1.0, 2.0, -np.inf], np.float32))
    check_dense(cupy, (2, 90, 70, 4, 2, 64, 64), DTYPES["bfloat16"], causal=True, sinks=sinks, dropout_p=0.5,
                dropout_seed=3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_varlen(dtype):
    check_varlen(cupy, [77, 0, 130, 5], [90, 12, 64, 0], 4, 2, 64, 64, DTYPES[dtype], causal=True,
                 max_seqlen=(130, 90), dropout_p=0.3, dropout_seed=2**40, dropout_offset=5)


def test_reproducible_and_dispatched():
    q, k, v = random_qkv(cupy, 2, 100, 100, 4, 2, 64, 64, DTYPES["bfloat16"], seed=0)
    p = _problem.forward_problem(q, k, v, causal=True, dropout_p=0.1, dropout_seed=1)
    device = _families.common.current_device()
    family, variant = _families.select(_families.FORWARD, p, device, (q, k, v))
    if device.capability == 90:
        assert variant.key == "sm90_fwd_bf16_d64_v64_q128_n128_s4_mod_0_drop_1_top_0"
    else:
        assert family.name == "general" and variant.key == "general_fwd_bf16_drop_1"
    options = {"causal": True, "dropout_p": 0.1, "dropout_seed": 1}
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
    again = cupyflash.flash_attention(q, k, v, **options)
    assert bool((out.view(np.uint16) == again.view(np.uint16)).all())
    dout = cupy.ones_like(out)
    grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, **options)
    grads_again = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, **options)
    assert all(bool((a.view(np.uint16) == b.view(np.uint16)).all()) for a, b in zip(grads, grads_again))
    # Agrees with the NumPy twin to within the rounding of the two (same draws).
    host = cupyflash.flash_attention(*(to_host(x) for x in (q, k, v)), **options)
    assert np.abs(to_host(out).astype(np.float64) - host.astype(np.float64)).max() < 0.02


_MAX_SCORE_FAMILIES = [("float16", "", "sm90_fwd"), ("bfloat16", "", "sm90_fwd"), ("bfloat16", "sm80", "sm80_fwd"),
                       ("bfloat16", "general", "general_fwd"), ("float32", "", "sm90_fwd_planes"),
                       ("float32", "sm80", "sm80_fwd_parts"), ("float64", "", "sm80_fwd_dmma"),
                       ("float64", "general", "general_fwd")]


@pytest.mark.parametrize("dtype, family, kernel", _MAX_SCORE_FAMILIES)
def test_max_score(dtype, family, kernel, monkeypatch):
    """The per-head maximum (common/max_score.cuh) of every forward kernel (the Hopper family's
    (kernel names for an H100/H200), the sm80 family's and the general one), with a score modification
    (log2 or natural-log units) and without (raw products in the Hopper 16-bit kernel), dense and packed,
    against the oracle's (float32; the kernels' scores round as the plain implementation's do), -inf for
    a head that sees nothing and NaN where a score is NaN."""
    import dataclasses

    from helpers import assert_within_rule, oracle, plain

    use_family(monkeypatch, family)
    q, k, v = random_qkv(cupy, 2, 150, 97, 4, 2, 64, 64, DTYPES[dtype], seed=3)
    device = _families.common.current_device()
    p = dataclasses.replace(_problem.forward_problem(q, k, v, causal=True), max_score=True)
    selected = _families.select(_families.FORWARD, p, device, (q, k, v))[1]
    assert selected.param("max_score") if "max_score" in selected.kernel.flags else selected.kernel.name == "general_fwd"
    if device.capability == 90:
        assert selected.kernel.name == kernel
    for options in ({"softcap": 5.0}, {}):
        out, lse, top = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True, return_max_score=True,
                                                  **options)
        assert top.dtype == np.float32 and top.shape == (2, 4)
        want, base = oracle(q, k, v, True, **options), plain(q, k, v, True, **options)
        assert_within_rule("max_score", top, want["max_score"], base["max_score"], 2)
        assert_within_rule("out", out, want["out"], base["out"], 2)
    q[1, 7, 2, 0] = float("nan")
    layout = np.ones((2, 4, 2, 1), bool)
    layout[0, 3] = False
    mask = cupyflash.BlockMask.from_dense(layout, (128, 128))
    _, top = cupyflash.flash_attention(q, k, v, block_mask=mask, return_max_score=True)
    top = to_host(top)
    assert np.isnan(top[1, 2]) and top[0, 3] == -np.inf and np.isfinite(top[0, :3]).all()
    cu = cupy.asarray(np.array([0, 40, 40, 150], np.int32))
    packed = [x.reshape(-1, *x.shape[2:])[:150] for x in random_qkv(cupy, 1, 150, 150, 4, 2, 64, 64, DTYPES[dtype],
                                                                       seed=4)]
    _, top = cupyflash.flash_attention_varlen(*packed, cu, cu, causal=True, return_max_score=True)
    host = cupyflash.flash_attention_varlen(*(to_host(x) for x in packed), to_host(cu), to_host(cu), causal=True,
                                            return_max_score=True)[1]
    np.testing.assert_allclose(to_host(top), host, rtol=2e-3 if DTYPES[dtype].itemsize == 2 else 1e-6)
    assert (to_host(top)[1] == -np.inf).all()
    # An overflowing score is +inf (its row's sum is NaN, but no score is).
    big = cupy.full((1, 3, 2, 64), 1e20, np.float32)
    _, top = cupyflash.flash_attention(big, big, big, return_max_score=True)
    assert (to_host(top) == np.inf).all()


@pytest.mark.parametrize("index", [0, 1, 3, 6, 7, 9, 11])
def test_max_score_with_a_kv_cache(index):
    """flash_attention_with_kvcache's maximum score (tests/test_kvcache.py's cases, against the oracle): the
    decode kernel's (appending, five splits, pages of one row, head dim 256 with ALiBi, sinks) and the
    general path's (a prefill chunk, float32 with a block table)."""
    import test_kvcache

    dtype, sizes, options = test_kvcache._options(cupy, test_kvcache.CASES[index])
    test_kvcache._check(cupy, dtype, options, max_score=True, **sizes)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_max_score_of_an_out_of_range_entry_is_nan(dtype):
    """An entry whose cache_seqlens is out of range has NaN maxima, as its rows (the decode kernel's and
    the general path's kvc_poison); the others are finite."""
    from test_kvcache import _inputs

    sizes = {"batch": 4, "seqlen_q": 1, "heads": 4, "heads_k": 2, "headdim": 64, "headdim_v": 64, "capacity": 64,
             "lengths": [10, 63, 20, 5], "new": 1, "page_size": 16}
    (q, k_cache, v_cache), arrays = _inputs(cupy, dtype, **sizes, seed=5)
    arrays["cache_seqlens"][3] = -2
    out, top = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **arrays, return_max_score=True)
    top = to_host(top)
    assert top.shape == (4, 4) and np.isnan(top[3]).all() and np.isfinite(top[:3]).all()
