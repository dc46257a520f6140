"""The Hopper kernels with dropout under compute-sanitizer (memcheck, racecheck): session 32's 8-bit
draws, drawn early (head dims 64-128) and after the softmax (192, 256), forward and backward, dense and
packed, and the device mask."""
import os

import cupy
import ml_dtypes
import numpy

import cupyflash

os.environ["CUPYFLASH_FAMILY"] = "sm90"
rng = numpy.random.default_rng(0)


def normal(shape):
    return cupy.asarray(rng.standard_normal(shape).astype(ml_dtypes.bfloat16))


options = {"causal": True, "dropout_p": 0.3, "dropout_seed": 7}
for d, sq, sk in ((40, 77, 101), (128, 300, 390), (192, 150, 200), (256, 130, 170)):
    q, k, v, do = normal((2, sq, 4, d)), normal((2, sk, 2, d)), normal((2, sk, 2, d)), normal((2, sq, 4, d))
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
    if d <= 128:
        cupyflash.flash_attention_backward(do, q, k, v, out, lse, **options)
lengths = numpy.array([0, 5, 130, 1, 77])
cu = cupy.asarray(numpy.concatenate([[0], numpy.cumsum(lengths)]).astype(numpy.int32))
q, k, v, do = normal((213, 4, 128)), normal((213, 2, 128)), normal((213, 2, 128)), normal((213, 4, 128))
out, lse = cupyflash.flash_attention_varlen(q, k, v, cu, cu, max_seqlen_q=130, max_seqlen_k=130, return_lse=True,
                                          **options)
cupyflash.flash_attention_varlen_backward(do, q, k, v, out, lse, cu, cu, max_seqlen_q=130, max_seqlen_k=130, **options)
cupyflash.dropout_mask(1, (2, 3, 45, 37), 0.3, like=q)
cupy.cuda.Device().synchronize()
print("sanitize_dropout: done")
