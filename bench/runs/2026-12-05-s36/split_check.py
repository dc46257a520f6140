"""The float32 Hopper forward with k and v split by the kernel (split_keys) against the planes pass:
outputs and lse bitwise equal (the planes are the same bits), over dense, causal, GQA, odd lengths,
head dims 40 / 64 / 96 / 128, tf32, packed sequences (one empty, ends inside key tiles), a block mask and
a score_mod; then the speed of both, back to back (events), at the issue's rows.
Run inside the tree to test: PYTHONPATH=$PWD python split_check.py [--speed-only] [--d128]"""
import os
import sys
import time

import cupy
import numpy as np

sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from test_mods import _documents, _softcap_mod, same_document  # noqa: E402

import cupyflash  # noqa: E402
from cupyflash import _api  # noqa: E402
from cupyflash._families import sm90  # noqa: E402

chosen = []
_plan = sm90.Sm90Forward.plan


def _spy(self, b, variant, *args):
    chosen.append(variant.key)
    return _plan(self, b, variant, *args)


sm90.Sm90Forward.plan = _spy
_addressable = sm90.tma_addressable


def run(split, fn, *args, **kw):
    """fn's outputs with (split) or without split_keys, from a fresh plan."""
    _api.PLANS.clear()
    sm90.tma_addressable = _addressable if split else (lambda x, varlen: False)
    chosen.clear()
    try:
        res = fn(*args, **kw)
    finally:
        sm90.tma_addressable = _addressable
    cupy.cuda.Device().synchronize()
    key = chosen[-1] if chosen else None
    assert key is not None and ("_kv_1" if split else "_kv_0") in key, key
    return res


def rnd(shape, seed, scale=1.0):
    return cupy.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale)


def check():
    cases = [  # b, sq, sk, h, hk, d, causal, tf32
        (2, 200, 333, 4, 2, 128, False, False), (1, 257, 257, 3, 3, 64, True, False),
        (2, 130, 70, 2, 1, 96, True, False), (1, 300, 1000, 2, 2, 40, False, False),
        (2, 1024, 1024, 2, 2, 128, True, False), (1, 190, 190, 2, 2, 128, False, True),
        (1, 64, 4100, 1, 1, 64, False, True),
    ]
    bad = 0
    for i, (b, sq, sk, h, hk, d, causal, tf32) in enumerate(cases):
        q, k, v = rnd((b, sq, h, d), 3 * i, 2.0), rnd((b, sk, hk, d), 3 * i + 1, 2.0), rnd((b, sk, hk, d), 3 * i + 2)
        kw = dict(causal=causal, return_lse=True, precision="tf32" if tf32 else "highest")
        o1, l1 = run(True, cupyflash.flash_attention, q, k, v, **kw)
        o0, l0 = run(False, cupyflash.flash_attention, q, k, v, **kw)
        same = bool((o1 == o0).all()) and bool((l1 == l0).all())
        bad += not same
        print(f"case {i} {(b, sq, sk, h, hk, d, causal, tf32)}: {'bitwise equal' if same else 'DIFFER'} "
              f"max|o1-o0| {float(abs(o1 - o0).max()):.3g} finite {bool(cupy.isfinite(o1).all())}")
    # Packed: an empty sequence, ends inside key tiles, values past each sequence set to inf in the
    # tensor (they must not reach another sequence's output).
    lens_q, lens_k = [5, 0, 130, 77, 64], [70, 0, 129, 200, 1]
    cu_q = cupy.asarray(np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32))
    cu_k = cupy.asarray(np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32))
    q, k, v = rnd((sum(lens_q), 4, 128), 40, 2.0), rnd((sum(lens_k), 2, 128), 41, 2.0), rnd((sum(lens_k), 2, 128), 42)
    for causal in (False, True):
        kw = dict(causal=causal, return_lse=True)
        o1, l1 = run(True, cupyflash.flash_attention_varlen, q, k, v, cu_q, cu_k, **kw)
        o0, l0 = run(False, cupyflash.flash_attention_varlen, q, k, v, cu_q, cu_k, **kw)
        same = bool((o1 == o0).all()) and bool((l1 == l0).all())
        bad += not same
        print(f"varlen causal={causal}: {'bitwise equal' if same else 'DIFFER'} finite {bool(cupy.isfinite(o1).all())}")
    # A block mask and a score_mod (last: its kernels compile on first use).
    q, k, v = rnd((1, 300, 2, 64), 50), rnd((1, 300, 2, 64), 51), rnd((1, 300, 2, 64), 52)
    doc = cupy.asarray(_documents(1, 300, 3, 7))
    mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, 300, 300, block_size=(128, 64), buffers=(doc,))
    for kw in (dict(block_mask=mask), dict(score_mod=_softcap_mod(20.0))):
        o1, l1 = run(True, cupyflash.flash_attention, q, k, v, return_lse=True, **kw)
        o0, l0 = run(False, cupyflash.flash_attention, q, k, v, return_lse=True, **kw)
        same = bool((o1 == o0).all()) and bool((l1 == l0).all())
        bad += not same
        print(f"{list(kw)[0]}: {'bitwise equal' if same else 'DIFFER'}")
    print(f"check: {bad} differ")
    return bad


def speed():
    print("float32 forward TFLOP/s, events over 20 calls (pre-pass -> split)")
    dims = (128,) if "--d128" in sys.argv else (128, 64)
    for d in dims:
        for s in (1024, 4096):
            for causal in (False, True):
                b, h = 16 * 1024 // s, 16
                q, k, v = (rnd((b, s, h, d), i) for i in range(3))
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                rates = []
                for split in (False, True):
                    run(split, cupyflash.flash_attention, q, k, v, causal=causal)
                    sm90.tma_addressable = _addressable if split else (lambda x, varlen: False)
                    for _ in range(3):
                        cupyflash.flash_attention(q, k, v, causal=causal)
                    start, end = cupy.cuda.Event(), cupy.cuda.Event()
                    start.record()
                    for _ in range(20):
                        cupyflash.flash_attention(q, k, v, causal=causal)
                    end.record()
                    end.synchronize()
                    sm90.tma_addressable = _addressable
                    rates.append(flops * 20 / cupy.cuda.get_elapsed_time(start, end) / 1e9)
                print(f" d{d} {'causal ' if causal else ''}{s}: {rates[0]:.1f} -> {rates[1]:.1f} ({rates[1] / rates[0]:.3f}x)")


if __name__ == "__main__":
    t = time.time()
    speed()  # (first: the call may end before the checks)
    if "--speed-only" not in sys.argv:
        check()
    print(f"{time.time() - t:.0f} s")
