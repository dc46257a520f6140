"""FP8 (e4m3) inputs: the format, its conversions on either array kind, and quantize_fp8.

``ml_dtypes.float8_e4m3fn``: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinity, one NaN
pattern per sign (S.1111.111); the largest finite value is 448 = 1.75 * 2^8, the smallest normal 2^-6
and the smallest subnormal 2^-9. CuPy holds arrays of that dtype (their bytes) but runs no elementwise
operation on them, so the conversions here work on the bits with integer and float32 operations that
NumPy and CuPy share: the same code, tested on the CPU against ml_dtypes, runs on the GPU.

Scaling (FlashAttention-3's convention): a tensor is stored as ``x_e4m3 = e4m3(x / descale)`` and its
real value is ``x_e4m3 * descale``; :func:`quantize_fp8` picks ``descale = amax / 448`` per (batch entry,
head), so the largest magnitude of each head lands on the format's largest value.
"""

import ml_dtypes
import numpy

#: The FP8 dtype cupyflash takes.
E4M3 = numpy.dtype(ml_dtypes.float8_e4m3fn)
#: Its largest finite magnitude.
E4M3_MAX = 448.0
#: The Problem fields of an FP8 call's descales (real value = stored value x descale), in argument order.
DESCALES = ("q_descale", "k_descale", "v_descale")
#: Its smallest normal magnitude, 2^-6; below it the spacing is 2^-9 (subnormals).
_MIN_NORMAL = 2.0**-6
#: The float32 value of every byte, for decoding on either array kind.
_VALUES = numpy.arange(256, dtype=numpy.uint8).view(E4M3).astype(numpy.float32)

GRANULARITIES = ("per_head", "per_tensor")
#: The scale of the probabilities the FP8 kernels round to e4m3 (fragment/softmax.cuh's kOffset = 8: a row's
#: largest is 2^8, so e4m3 keeps those down to 2^-17 of it), which the NumPy twin and the reference's FP8
#: emulation apply too. (The kernels' running maximum may lag a row's by up to 0.75 in log2 units, so their
#: largest probabilities reach 2^8.75, still below e4m3's 448.)
P_SCALE = 256.0


def is_fp8(dtype):
    return numpy.dtype(dtype) == E4M3


def e4m3_bits(xp, x):
    """The e4m3 bytes (uint8) of float32 array ``x``, rounded to nearest even, finite values beyond 448
    saturated to +-448 (the format has no infinity), NaN to NaN; signed zeros kept.

    Normal results round float32's 23 mantissa bits to 3 (adding half a unit minus one, plus the kept
    bit's parity, then truncating: a carry moves the exponent up, as it should); results below 2^-6 are
    multiples of 2^-9, which rint(|x| * 512) counts exactly (a power-of-two product), 8 of them being the
    smallest normal's pattern 0x08."""
    x = xp.asarray(x, dtype=numpy.float32)
    nan = xp.isnan(x)
    a = xp.where(nan, numpy.float32(0), xp.minimum(xp.abs(x), numpy.float32(E4M3_MAX)))
    u = xp.ascontiguousarray(a).view(numpy.uint32)
    rounded = u + numpy.uint32(0x7FFFF) + ((u >> numpy.uint32(20)) & numpy.uint32(1))
    exponent = (rounded >> numpy.uint32(23)).astype(numpy.int32) - 120  # float32 bias 127, e4m3 bias 7
    normal = (exponent << 3) | ((rounded >> numpy.uint32(20)) & numpy.uint32(7)).astype(numpy.int32)
    small = xp.rint(a * numpy.float32(512.0)).astype(numpy.int32)
    bits = xp.where(a < numpy.float32(_MIN_NORMAL), small, normal)
    bits = xp.where(nan, 0x7F, bits)
    bits = bits | xp.where(xp.signbit(x), 0x80, 0)
    return bits.astype(numpy.uint8)


def e4m3_values(xp, bits):
    """The float32 values of e4m3 bytes (uint8, or an array of dtype :data:`E4M3` viewed as such)."""
    bits = bits.view(numpy.uint8) if bits.dtype == E4M3 else bits
    return xp.asarray(_VALUES)[bits]


def dequantize(xp, x, descale, heads_k):
    """float32 ``x_e4m3 * descale`` of an e4m3 array (batch, seqlen, heads, dim); ``descale`` (batch, heads)
    or (batch, heads_k) (a kv head's scale for its group of query heads), or None (1)."""
    values = e4m3_values(xp, x)
    if descale is None:
        return values
    batch, heads = x.shape[0], x.shape[2]
    per_head = descale if descale.shape[1] == heads else xp.repeat(descale, heads // heads_k, axis=1)
    return values * per_head.reshape(batch, 1, heads, 1)


def _check_host_range(x, granularity):
    """quantize_fp8's checks of a NumPy x, in x's own precision: finite, within float32's range (the
    descales and the kernels' arithmetic are float32), and each descale (amax / 448) a normal float32."""
    if not numpy.isfinite(x).all():
        raise ValueError("x must be finite: a non-finite value has no e4m3 scale")
    if x.size == 0:
        return
    magnitude = numpy.abs(x.astype(numpy.float64))
    amax = magnitude.max(axis=(1, 3)) if granularity == "per_head" else magnitude.max()
    largest = float(numpy.max(amax))
    if largest > float(numpy.finfo(numpy.float32).max):
        raise ValueError(f"x holds a value of magnitude {largest:.6g}, past float32's range (the descales and the "
                         "attention's arithmetic are float32); scale x down first")
    smallest = float(numpy.min(numpy.where(amax > 0, amax, numpy.inf)))
    if smallest < E4M3_MAX * float(numpy.finfo(numpy.float32).tiny):
        where = "a head's" if granularity == "per_head" else "x's"
        raise ValueError(f"{where} largest magnitude is {smallest:.6g}: its descale ({smallest:.6g} / {E4M3_MAX:g}) is "
                         "below float32's smallest normal number, which the float32 descales cannot hold; scale x "
                         "up first")


def quantize_fp8(x, granularity="per_head"):
    """``(x_e4m3, descale)``: ``x`` stored as e4m3 with its float32 descale, real value = stored value x
    descale (FlashAttention-3's convention, which :func:`cupyflash.flash_attention` takes as
    ``q_descale``, ``k_descale`` and ``v_descale``).

    Parameters
    ----------
    x : array, shape (batch, seqlen, heads, headdim)
        float16, bfloat16, float32 or float64, NumPy or CuPy; finite.
    granularity : {"per_head", "per_tensor"}
        One descale per (batch entry, head), ``amax / 448`` over its (seqlen, headdim) values, or one
        for the whole tensor (repeated in every slot). An all-zero head gets descale 1.

    Returns
    -------
    x_e4m3 : array of dtype ``ml_dtypes.float8_e4m3fn``, shape of ``x``
        ``x / descale`` rounded to nearest even: every value within the format's range, each with 4
        significant bits (relative error up to 2^-4; values below ``2^-6 * descale`` lose more, down to
        0 below ``2^-10 * descale``).
    descale : float32 array, shape (batch, heads)
        For keys and values of GQA, pass it as k_descale / v_descale ((batch, heads_k)); a query's may
        be per query head.

    Raises
    ------
    TypeError, ValueError
        For another rank or dtype, an unknown granularity, or (NumPy) a non-finite value, a value past
        float32's range, or a head (tensor) whose largest magnitude is not 0 but below
        ``448 * 2^-126``, whose descale float32 cannot hold as a normal number.
    """
    from . import _problem

    xp = _problem.array_module({"x": x})
    if getattr(x, "ndim", None) != 4:
        raise ValueError(f"x must have rank 4 (batch, seqlen, heads, headdim), got shape {getattr(x, 'shape', None)}")
    if x.dtype not in _problem.SUPPORTED_DTYPES.values():
        raise TypeError(f"x has dtype {x.dtype}; expected float16, bfloat16, float32 or float64")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if xp is numpy:
        _check_host_range(x, granularity)
    wide = x.astype(numpy.float32)
    batch, _, heads, _ = x.shape
    if granularity == "per_head":
        amax = xp.abs(wide).max(axis=(1, 3)) if x.size else xp.zeros((batch, heads), numpy.float32)
    else:
        amax = xp.full((batch, heads), xp.abs(wide).max() if x.size else 0.0, numpy.float32)
    descale = xp.where(amax > 0, amax / numpy.float32(E4M3_MAX), numpy.float32(1)).astype(numpy.float32)
    bits = e4m3_bits(xp, wide / descale.reshape(batch, 1, heads, 1))
    return bits.view(E4M3), descale
