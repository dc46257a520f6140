"""The Hopper forward (cupyflash/_families/sm90.py) on the H200: every head-dim bucket, both 16-bit dtypes,
odd sizes that end mid-tile (seqlens 1, 113, 203, 1025), seqlen_q != seqlen_k both ways, GQA and MQA,
against the float64 oracle; that dispatch picks it there; and that inputs a TMA cannot address take the
sm80 kernels with the same results. GPU only; the sm90 cases skip on other GPUs."""

import numpy as np
import pytest
from helpers import DTYPES, GPU_MARKS, check_dense, gpu_available, random_qkv

import cupyflash
from cupyflash import _families, _validate
from cupyflash._families import common, sm90

pytestmark = GPU_MARKS

if gpu_available():
    import cupy

    HOPPER = int(cupy.cuda.Device().compute_capability) == sm90.CAPABILITY
else:
    cupy = None
    HOPPER = False

needs_hopper = pytest.mark.skipif(not HOPPER, reason="the sm90 kernels run on compute capability 9.0 only")

# (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v), dtype, causal
CASES = [
    ((2, 1, 1, 2, 2, 64, 64), "bfloat16", False),
    ((1, 113, 203, 4, 2, 64, 64), "float16", True),
    ((1, 1025, 1025, 2, 1, 64, 64), "bfloat16", True),
    ((2, 203, 113, 2, 2, 96, 96), "bfloat16", True),
    ((1, 1025, 203, 2, 2, 80, 80), "float16", False),
    ((1, 113, 1025, 4, 1, 128, 128), "bfloat16", False),
    ((1, 1025, 1025, 2, 2, 128, 128), "float16", True),
    ((2, 203, 203, 2, 1, 120, 128), "bfloat16", False),
    ((1, 113, 203, 2, 2, 192, 128), "bfloat16", True),
    ((1, 203, 113, 2, 1, 160, 160), "float16", False),
    ((1, 1025, 1025, 2, 2, 192, 192), "bfloat16", True),
    ((1, 203, 1025, 2, 2, 256, 256), "float16", True),
    ((2, 113, 113, 2, 2, 256, 256), "bfloat16", False),
    ((1, 1, 203, 2, 2, 64, 128), "float16", False),
]


def _id(case):
    (b, sq, sk, h, hk, d, dv), dtype, causal = case
    return f"b{b}_q{sq}_k{sk}_h{h}_hk{hk}_d{d}_dv{dv}_{dtype}_causal{int(causal)}"


@needs_hopper
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_forward_matches_oracle(case, monkeypatch):
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    sizes, dtype, causal = case
    check_dense(cupy, sizes, dtype, causal=causal, backward=False)


@needs_hopper
@pytest.mark.parametrize("headdim, headdim_v, expected", [
    (64, 64, (64, 64)), (40, 40, (64, 64)), (96, 96, (96, 96)), (128, 128, (128, 128)), (64, 128, (128, 128)),
    (192, 128, (192, 128)), (160, 192, (192, 192)), (256, 256, (256, 256)),
])
def test_dispatch_picks_sm90_on_hopper(headdim, headdim_v, expected):
    q, k, v = random_qkv(cupy, 1, 8, 8, 2, 2, headdim, headdim_v, DTYPES["bfloat16"], seed=0)
    p = _validate.forward_problem(q, k, v)
    family, variant = _families.select(_families.FORWARD, p, common.current_device())
    assert family is sm90.FORWARD
    assert (variant.param("headdim"), variant.param("headdim_v")) == expected


@needs_hopper
def test_unaligned_inputs_take_the_sm80_kernels(monkeypatch):
    """A head dim of 59 gives 118-byte rows: no TMA can read them, and sm80's kernels give the result."""
    q, _, _ = random_qkv(cupy, 1, 113, 203, 2, 2, 59, 59, DTYPES["bfloat16"], seed=3)
    assert not sm90.tma_addressable(q, False)
    monkeypatch.setenv("CUPYFLASH_FAMILY", "sm90")
    check_dense(cupy, (1, 113, 203, 2, 2, 59, 59), "bfloat16", causal=True, backward=False)


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_packed_sequences_do_not_read_their_neighbours_values(family, monkeypatch):
    """A key tile of sequence 0 runs into sequence 1's rows; an inf there has probability 0 for
    sequence 0, and 0 * inf must not reach sequence 0's output."""
    monkeypatch.setenv("CUPYFLASH_FAMILY", family)
    dtype = DTYPES["bfloat16"]
    rng = cupy.random.default_rng(7)
    q, k, v = (rng.standard_normal((250, 2, 128), dtype=cupy.float32).astype(dtype) for _ in range(3))
    v[100:130] = cupy.inf
    cu = cupy.asarray([0, 100, 250], dtype=cupy.int32)
    out = cupyflash.flash_attention_varlen(q, k, v, cu, cu)
    alone = cupyflash.flash_attention(q[None, :100], k[None, :100], v[None, :100])[0]
    first = cupy.asnumpy(out[:100].astype(cupy.float32))
    assert np.isfinite(first).all()
    np.testing.assert_allclose(first, cupy.asnumpy(alone.astype(cupy.float32)), atol=1e-2)
