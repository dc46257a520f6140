"""Session 53: dK and dV of the Hopper backward on a set of problems, saved to OUT.npz, to compare two trees
bitwise (i24_bwd_store_staged.patch's TMA-stored dK/dV against the register path: the same rounding of
the same floats, so equal bits). Run from a tree: PYTHONPATH=TREE python staged_check.py OUT.npz"""
import sys

import cupy
import ml_dtypes
import numpy as np

import cupyflash

rng = np.random.default_rng(5)


def arr(shape, dtype):
    return cupy.asarray(rng.standard_normal(shape).astype(dtype))


saved = {}
bf16, fp16 = ml_dtypes.bfloat16, np.float16
cases = [("dense_d128_1000", 2, 1000, 4, 4, 128, bf16, False), ("causal_d64_gqa_777", 1, 777, 8, 2, 64, bf16, True),
         ("causal_d96_512", 2, 512, 2, 2, 96, bf16, True), ("fp16_d128_640", 1, 640, 3, 3, 128, fp16, True),
         ("d40_300", 1, 300, 2, 2, 40, bf16, False), ("causal_d128_4096", 1, 4096, 4, 4, 128, bf16, True)]
for name, b, s, h, hk, d, dt, causal in cases:
    q, dout = arr((b, s, h, d), dt), arr((b, s, h, d), dt)
    k, v = arr((b, s, hk, d), dt), arr((b, s, hk, d), dt)
    out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
    _, dk, dv = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal)
    saved[name + "_dk"], saved[name + "_dv"] = cupy.asnumpy(dk).view(np.uint16), cupy.asnumpy(dv).view(np.uint16)
# packed sequences: full tiles staged, each sequence's partial last tile from the registers
cu = cupy.asarray(np.array([0, 300, 556, 1000, 1384], np.int32))
q, dout, k, v = (arr((1384, 4, 128), bf16) for _ in range(4))
out, lse = cupyflash.flash_attention_varlen(q, k, v, cu, cu, max_seqlen_q=444, max_seqlen_k=444, causal=True,
                                            return_lse=True)
_, dk, dv = cupyflash.flash_attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, max_seqlen_q=444,
                                                      max_seqlen_k=444, causal=True)
saved["varlen_dk"], saved["varlen_dv"] = cupy.asnumpy(dk).view(np.uint16), cupy.asnumpy(dv).view(np.uint16)
# a document block mask (the key order and ranked launch)
n = 2048
doc = np.repeat(np.arange(5), [300, 700, 100, 500, 448]).astype(np.int32)
mask = cupyflash.BlockMask.from_mask_mod(lambda bb, hh, qi, ki, dd: dd[bb, qi] == dd[bb, ki], 1, 1, n, n, (128, 128),
                                         (cupy.asarray(doc[None]),))
q, dout, k, v = (arr((1, n, 4, 128), bf16) for _ in range(4))
out, lse = cupyflash.flash_attention(q, k, v, causal=True, block_mask=mask, return_lse=True)
_, dk, dv = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True, block_mask=mask)
saved["document_dk"], saved["document_dv"] = cupy.asnumpy(dk).view(np.uint16), cupy.asnumpy(dv).view(np.uint16)
np.savez(sys.argv[1], **saved)
print(f"saved {len(saved)} arrays to {sys.argv[1]}")
