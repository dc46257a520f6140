"""Dropout's keep decisions: a pure function of (seed, offset, b, h, i, j), from the counter-based
generator Philox4x32 with 7 rounds (Salmon et al., SC 2011; Random123's constants and round function,
FlashAttention-2's round count), so that the NumPy twin, the reference and any kernel can draw the same
decision for the same entry without sharing state.

The decision for batch entry (or packed sequence) ``b``, query head ``h`` of ``heads``, query row ``i``
and key column ``j`` (both counted from 0 within the sequence) is

    words = philox4x32_7(counter=(I, J, b * heads + h, offset), key=(seed mod 2^32, seed >> 32))
    u     = byte 2 * bit3(j) + bit0(j) of words[2 * bit3(i) + bit4(j)]    (byte 0: the low 8 bits)
    keep  = u >= threshold(dropout_p)

where ``I`` is ``i`` without its bit 3 (``(i >> 4) * 8 + i % 8``), ``J`` is ``j`` without its bits 0, 3
and 4 (``(j >> 5) * 4 + (j >> 1) % 4``), and bitN(x) = (x >> N) & 1. One generator call thus serves the
sixteen entries {i, i ^ 8} x {j, j ^ 1, j ^ 8, j ^ 9, j ^ 16, j ^ 17, j ^ 24, j ^ 25}: exactly the
entries of two rows and a 32-key block that one thread of an mma.sync or wgmma accumulator holds (rows r
and r + 8 of a 16-row block, column pairs 2c, 2c + 1 of four 8-column blocks), so the forward uses every
byte it draws; the backward, whose transposed fragments hold keys r and r + 8 and query pairs, uses
half of each call (a lane's quarter, and the quarter of the lane that holds keys r ^ 1, r ^ 1 + 8, sent
to it by a shuffle).

The decisions are 8-bit, as FlashAttention-2's are: ``threshold(dropout_p)`` is ``256 dropout_p``
rounded to the nearest integer (halves up), so each entry is dropped with probability ``rate =
threshold / 256`` (dropout_p = 0.1 drops 26/256 = 0.1016), and kept probabilities are scaled by
``1 / (1 - rate)``, so that dropout leaves the expectation of every output unchanged. (FlashAttention-2
rounds its threshold another way and scales by ``1 / (1 - dropout_p)``, whose expectation is off by up
to ``(1/512) / (1 - dropout_p)``.) ``dropout_p`` must be 0 or in [1/512, 511/512), where the threshold
is 1 to 255. A 16-bit decision per entry took twice the generator calls and ten rounds each: the forward
ran at 2x the time of no dropout (bench/NOTES.md, sessions 29-32).
"""

import fractions
import math

import numpy

#: Philox4x32's multipliers and Weyl key increments (Random123), and the rounds of a draw.
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 7
_LOW = numpy.uint64(0xFFFFFFFF)
_SHIFT = numpy.uint64(32)

#: Largest seed (64 bits, the generator's key) and offset (32 bits, its fourth counter word), inclusive.
MAX_SEED = 2**64 - 1
MAX_OFFSET = 2**32 - 1


def philox4x32(c0, c1, c2, c3, k0, k1, rounds=ROUNDS):
    """The four 32-bit words of Philox4x32 with ``rounds`` rounds for counters (c0, c1, c2, c3) (integer
    arrays that broadcast, each word below 2^32) and the key (k0, k1) (ints below 2^32); returns uint32
    arrays."""
    c0, c1, c2, c3 = (numpy.asarray(c, dtype=numpy.uint64) for c in (c0, c1, c2, c3))
    k0, k1 = numpy.uint64(k0), numpy.uint64(k1)
    m0, m1, w0, w1 = (numpy.uint64(x) for x in (_M0, _M1, _W0, _W1))
    for _ in range(rounds):
        p0 = m0 * c0  # below 2^64: both factors are below 2^32
        p1 = m1 * c2
        c0, c1, c2, c3 = (p1 >> _SHIFT) ^ c1 ^ k0, p1 & _LOW, (p0 >> _SHIFT) ^ c3 ^ k1, p0 & _LOW
        k0, k1 = (k0 + w0) & _LOW, (k1 + w1) & _LOW
    return tuple(c.astype(numpy.uint32) for c in (c0, c1, c2, c3))


def threshold(dropout_p):
    """The byte an entry's draw must reach to be kept: 256 dropout_p rounded to nearest (halves up),
    computed exactly (dropout_p as the binary fraction it is); 0 for no dropout. Raises ValueError where
    that is not 1 to 255 (dropout_p > 0 outside [1/512, 511/512)): no 8-bit decision draws that rate."""
    if dropout_p == 0:
        return 0
    t = math.floor(fractions.Fraction(float(dropout_p)) * 256 + fractions.Fraction(1, 2))
    if not 1 <= t <= 255:
        raise ValueError(f"dropout_p must be 0 or in [1/512, 511/512), got {dropout_p}: dropout's decisions are "
                         f"8-bit, so it drops round(256 dropout_p) / 256 of the probabilities "
                         f"(cupyflash.dropout_rate), which is 0 or 1 there")
    return t


def keep_scale(dropout_p):
    """The factor of a kept probability: 1 / (1 - dropout_rate(dropout_p)) = 256 / (256 - threshold), so
    that the expectation of every output is the one without dropout (1.0 for none)."""
    return 256.0 / (256 - threshold(dropout_p))


def dropout_rate(p):
    """The probability with which ``flash_attention(..., dropout_p=p)`` (and its backward, and
    :func:`cupyflash.dropout_mask`) drops each probability: ``round(256 p) / 256``, halves rounded up (the
    decisions are 8-bit, as FlashAttention-2's are). The kept ones are scaled by ``1 / (1 -
    dropout_rate(p))``, so dropout leaves the expectation of every output unchanged. ``p`` must be 0 or
    in [1/512, 511/512), where the rate is 1/256 to 255/256.

    Parameters
    ----------
    p : float
        The ``dropout_p`` of the attention functions: 0 or in [1/512, 511/512).

    Returns
    -------
    float
        ``round(256 p) / 256``; 0.0 for ``p = 0`` (for example 0.1015625 for 0.1, 0.5 for 0.5).
    """
    from . import _problem

    p, _, _ = _problem.check_dropout(p, 0, 0)
    return threshold(p) / 256


def _fold_rows(x):
    return (x >> 4) * 8 + (x & 7)


def _fold_cols(x):
    return (x >> 5) * 4 + ((x >> 1) & 3)


def _counters(start, stop, fold):
    """For positions [start, stop): the distinct counter words ``fold`` gives them, and the index of each
    position's word among those."""
    x = numpy.arange(start, stop, dtype=numpy.int64)
    counters, index = numpy.unique(fold(x), return_inverse=True)
    return x, counters, index.reshape(-1)


def keep(seed, offset, bh, rows, cols, dropout_p):
    """Keep decisions of query rows ``rows`` = (start, stop) against key columns ``cols`` = (start, stop)
    for the heads ``bh`` (an int array of ``b * heads + h`` values, any shape): a bool array of shape
    ``bh.shape + (rows, cols)``. Each generator call is made once."""
    bh = numpy.asarray(bh, dtype=numpy.int64)
    i, ci, index_i = _counters(*rows, _fold_rows)
    j, cj, index_j = _counters(*cols, _fold_cols)
    words = philox4x32(ci[:, None], cj[None, :], bh[..., None, None], offset, seed & 0xFFFFFFFF, seed >> 32)
    stacked = numpy.stack(words, axis=-1)  # bh.shape + (distinct rows, distinct columns, 4)
    which = 2 * ((i[:, None] >> 3) & 1) + ((j[None, :] >> 4) & 1)
    chosen = stacked[..., index_i[:, None], index_j[None, :], which]
    byte = (chosen >> (8 * (2 * ((j >> 3) & 1) + (j & 1))).astype(numpy.uint32)) & numpy.uint32(0xFF)
    return byte >= numpy.uint32(threshold(dropout_p))


def dropout_mask(seed, shape, p, offset=0, *, like=None):
    """The keep mask of attention dropout: ``mask[b, h, i, j]`` is True where the probability of query
    ``i`` (head ``h``, batch entry ``b``) for key ``j`` is kept by ``flash_attention(...,
    dropout_p=p, dropout_seed=seed, dropout_offset=offset)`` and by its backward.

    For tests and debugging: it takes O(batch * heads * seqlen_q * seqlen_k) memory and host time (about
    a second per 10^7 entries), where the attention functions draw the decisions tile by tile and store
    none. For packed (varlen) batches, sequence ``b`` of the packed call is batch entry ``b`` here, with
    ``i`` and ``j`` counted from its first row.

    Parameters
    ----------
    seed : int
        In [0, 2^64).
    shape : (batch, heads, seqlen_q, seqlen_k)
        ``heads`` is the number of query heads.
    p : float
        The dropout probability: 0 or in [1/512, 511/512) (:func:`cupyflash.dropout_rate`).
    offset : int
        In [0, 2^32): the generator's fourth counter word, so one seed serves many calls (say, one
        offset per layer and step).
    like : numpy.ndarray or cupy.ndarray, optional, keyword-only
        The kind of array to return: a CuPy ``like`` draws the mask on its device
        (kernels_cu/common/dropout_mask.cu), bit for bit the host's.

    Returns
    -------
    numpy.ndarray or cupy.ndarray of bool, shape ``shape``
        Each entry is True (kept) with probability ``1 - round(256 p) / 256`` (see
        :func:`cupyflash.dropout_rate`), independently of the others; the attention functions scale kept
        probabilities by ``1 / (1 - dropout_rate(p))``.
    """
    from . import _problem

    if not isinstance(shape, (tuple, list)) or len(shape) != 4 or not all(_problem.is_int(x) for x in shape):
        raise TypeError(f"shape must be (batch, heads, seqlen_q, seqlen_k), four ints; got {shape!r}")
    if min(shape) < 0:
        raise ValueError(f"shape must hold non-negative sizes, got {tuple(shape)}")
    batch, heads, seqlen_q, seqlen_k = (int(x) for x in shape)
    p, seed, offset = _problem.check_dropout(p, seed, offset)
    if like is not None and _problem.array_module({"like": like}) is not numpy:
        from ._families import common

        return common.dropout_mask(p, seed, offset, (batch, heads, seqlen_q, seqlen_k))
    if p == 0.0:
        return numpy.ones((batch, heads, seqlen_q, seqlen_k), dtype=bool)
    mask = numpy.empty((batch, heads, seqlen_q, seqlen_k), dtype=bool)
    rows = max(1, 2**20 // max(seqlen_k, 1))  # bounds the generator's temporaries to a few tens of MB
    rows = max(16, rows - rows % 16)
    for b in range(batch):
        for h in range(heads):
            for i in range(0, seqlen_q, rows):
                stop = min(i + rows, seqlen_q)
                mask[b, h, i:stop] = keep(seed, offset, b * heads + h, (i, stop), (0, seqlen_k), p)
    return mask
