"""Rotary position embedding (RoPE) of a checked call (cupyflash._problem.Rotary), written once against
NumPy or CuPy: FlashAttention's ``apply_rotary_emb``. Row t of a sequence, at position ``p = offset + t``,
has its pairs (a, b) of the first rotary_dim columns turned by the angle whose cosine and sine are row p
of the tables: ``(a cos - b sin, a sin + b cos)``, the sine negated for ``conjugate`` (the inverse
rotation, which is also the gradient: a rotation's transpose is its inverse). The pairs are columns
(2c, 2c + 1) when interleaved, else (c, c + rotary_dim / 2) (GPT-NeoX). The arithmetic runs in
float32 (float64 for float64 x) and rounds once to x's dtype.

On CuPy arrays whose columns are at unit stride it is one fused kernel on the current stream
(kernels_cu/common/rotary.cu: one read and one write of x), on other CuPy layouts a few elementwise kernels; neither
synchronizes with the host."""

import numpy

from ._problem import acc_dtype


def _positions(xp, r, x):
    """Each row's position, shaped to broadcast against x's (.., heads, pairs) columns: (batch, seqlen, 1, 1)
    for dense x, (total, 1, 1) for packed x."""
    if r.cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        offsets = xp.asarray(r.offsets).reshape(-1, 1) if not isinstance(r.offsets, int) else r.offsets
        positions = offsets + xp.arange(seqlen)[None, :] + xp.zeros((batch, 1), numpy.int64)
    else:
        rows = xp.arange(x.shape[0])
        sequence = xp.searchsorted(r.cu_seqlens, rows, side="right") - 1
        start = r.cu_seqlens[sequence]
        offsets = r.offsets if isinstance(r.offsets, int) else r.offsets[sequence]
        positions = offsets + rows - start
    return positions[..., None, None]


def apply(r, x, cos, sin):
    """x rotated (a new array, or x itself with ``r.inplace``)."""
    xp = r.xp
    # The fused kernel reads columns at unit stride (other layouts take the elementwise kernels).
    if xp is not numpy and x.strides[-1] == x.itemsize:
        from ._families import common

        # float32 tables serve every dtype; a float32 x reads them as its own dtype.
        return common.rotary(r, x, cos, sin, x if r.inplace else xp.empty(x.shape, x.dtype))
    acc = acc_dtype(x.dtype)
    half = r.rotary_dim // 2
    positions = _positions(xp, r, x)
    rows = cos.shape[0]
    inside = (positions >= 0) & (positions < rows)  # CuPy offsets are not read on the host
    index = xp.where(inside, positions, 0)[..., 0, 0]
    c = cos.astype(acc)[index][..., None, :]  # (.., 1, half)
    s = sin.astype(acc)[index][..., None, :]
    if r.conjugate:
        s = -s
    if xp is not numpy:
        # Positions past the tables (unchecked CuPy offsets): NaN rather than a wrong rotation.
        c = xp.where(inside, c, acc.type(numpy.nan))
    if r.interleaved:
        first, second = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
    else:
        first, second = x[..., :half], x[..., half:2 * half]
    a, b = first.astype(acc), second.astype(acc)
    rotated_a, rotated_b = (a * c - b * s).astype(x.dtype), (a * s + b * c).astype(x.dtype)
    out = x if r.inplace else x.copy()
    if r.interleaved:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = rotated_a, rotated_b
    else:
        out[..., :half], out[..., half:2 * half] = rotated_a, rotated_b
    return out
