"""Session 53: the Hopper forward's out and lse and the backward's dQ, dK and dV on a set of problems, saved
to OUT.npz, to compare two trees bitwise: i24_bwd_store_staged.patch stores dK/dV by TMA from shared
memory where the register path stored them (the same floats, the same rounding: equal bits), and moves
the forward's staging loop (equal bits). The backward runs deterministic where its dQ is compared (the
default mode's dQ sums in arrival order); a staging write over K under the walk's last dQ product would
show there. Run from a tree: PYTHONPATH=TREE python staged_check.py OUT.npz"""
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(5)
bf16, fp16 = ml_dtypes.bfloat16, np.float16
saved = {}


def arr(shape, dtype):
    return cupy.asarray(rng.standard_normal(shape).astype(dtype))


def keep(name, *arrays):
    for label, x in zip(("out", "lse", "dq", "dk", "dv"), arrays):
        x = cupy.asnumpy(x)
        saved[f"{name}_{label}"] = x.view(np.uint16) if x.dtype.itemsize == 2 else x


def dense(name, b, sq, sk, h, hk, d, dt, deterministic=True, **options):
    q, dout = arr((b, sq, h, d), dt), arr((b, sq, h, d), dt)
    k, v = arr((b, sk, hk, d), dt), arr((b, sk, hk, d), dt)
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
    dq, dk, dv = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, deterministic=deterministic, **options)[:3]
    keep(name, out, lse, dq if deterministic else out[:0], dk, dv)


dense("dense_d128_1000", 2, 1000, 1000, 4, 4, 128, bf16)
dense("causal_d64_gqa_777", 1, 777, 777, 8, 2, 64, bf16, causal=True)
dense("causal_d96_512", 2, 512, 512, 2, 2, 96, bf16, causal=True)
dense("fp16_d128_640", 1, 640, 640, 3, 3, 128, fp16, causal=True)
dense("d40_300", 1, 300, 300, 2, 2, 40, bf16)
dense("sq_ne_sk_d128", 1, 200, 900, 2, 2, 128, bf16, causal=True)
dense("window_softcap_d128", 1, 1500, 1500, 2, 2, 128, bf16, window_size=(200, 0), softcap=30.0)
dense("dropout_d128", 1, 700, 700, 2, 2, 128, bf16, dropout_p=0.1, dropout_seed=7)
dense("default_mode_causal_d128_4096", 1, 4096, 4096, 4, 4, 128, bf16, deterministic=False, causal=True)
# packed sequences: full tiles staged, each sequence's partial last tile (and the sequence of 60) from the registers
cu = cupy.asarray(np.array([0, 300, 360, 616, 1000, 1384], np.int32))
q, dout, k, v = (arr((1384, 4, 128), bf16) for _ in range(4))
out, lse = cupyflash.flash_attention_varlen(q, k, v, cu, cu, max_seqlen_q=384, max_seqlen_k=384, causal=True,
                                            return_lse=True)
grads = cupyflash.flash_attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, max_seqlen_q=384,
                                                  max_seqlen_k=384, causal=True, deterministic=True)
keep("varlen", out, lse, *grads[:3])
# a document block mask (the key order and the ranked launch; the backward's default mode)
n = 2048
doc = np.repeat(np.arange(5), [300, 700, 100, 500, 448]).astype(np.int32)
mask = cupyflash.BlockMask.from_mask_mod(lambda bb, hh, qi, ki, dd: dd[bb, qi] == dd[bb, ki], 1, 1, n, n, (128, 128),
                                         (cupy.asarray(doc[None]),))
q, dout, k, v = (arr((1, n, 4, 128), bf16) for _ in range(4))
out, lse = cupyflash.flash_attention(q, k, v, causal=True, block_mask=mask, return_lse=True)
grads = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, block_mask=mask)
keep("document", out, lse, out[:0], *grads[1:3])
np.savez(sys.argv[1], **saved)
print(f"saved {len(saved)} arrays to {sys.argv[1]}")
