"""Sequences and masks on the host: the rules of ``kernels_cu/common/sequence.cuh``, ``mask.cuh`` and
``score_mod.cuh``, for the NumPy twin and for building block-sparse tile lists.

Rows i and keys j count from the start of their sequence. Query i sees key j iff ``i < seqlen_q``,
``j < seqlen_k``, ``lo <= j - i <= hi`` and the block layout (if any) sets block
``(i // block_q, j // block_k)``, with the window of FlashAttention-2 aligned bottom-right:
``lo = seqlen_k - seqlen_q - left`` and ``hi = seqlen_k - seqlen_q + right``, an unbounded side (-1)
excluding nothing and causal being ``right = 0``. Every function here works on NumPy or CuPy arrays
(``xp``).
"""

import dataclasses

import numpy


@dataclasses.dataclass(frozen=True)
class Window:
    """The window and sequence bounds of one sequence: pair (i, j) passes iff lo <= j - i <= hi."""

    seqlen_q: int
    seqlen_k: int
    lo: int
    hi: int

    @classmethod
    def of(cls, seqlen_q, seqlen_k, window_left, window_right):
        """Clamped into [-seqlen_q, seqlen_k], which holds every j - i of real pairs (see common/mask.cuh)."""
        offset = seqlen_k - seqlen_q
        lo = -seqlen_q if window_left < 0 else max(offset - window_left, -seqlen_q)
        hi = seqlen_k if window_right < 0 else min(offset + window_right, seqlen_k)
        return cls(seqlen_q, seqlen_k, lo, hi)

    def visible(self, i, j):
        """Window and bounds test of rows ``i`` and keys ``j`` (broadcasting integer arrays)."""
        d = j - i
        return (i < self.seqlen_q) & (j < self.seqlen_k) & (d >= self.lo) & (d <= self.hi)

    def key_range(self, m0, rows):
        """Keys [begin, end) seen by some real row of [m0, m0 + rows); end <= begin: none."""
        m1 = min(m0 + rows, self.seqlen_q)
        return max(0, m0 + self.lo), min(self.seqlen_k, m1 + self.hi)

    def query_range(self, n0, cols):
        """Rows [begin, end) that see some real key of [n0, n0 + cols)."""
        n1 = min(n0 + cols, self.seqlen_k)
        return max(0, n0 - self.hi), min(self.seqlen_q, n1 - self.lo)

    def tile_is_full(self, m0, rows, n0, cols):
        """Every real row of [m0, m0 + rows) sees every key of [n0, n0 + cols), all of them real."""
        m1 = min(m0 + rows, self.seqlen_q)
        return n0 + cols <= self.seqlen_k and n0 + cols - 1 - m0 <= self.hi and n0 - (m1 - 1) >= self.lo


def tiles_of(begin, end, tile):
    """Indices of the tiles of ``tile`` rows or keys that meet [begin, end)."""
    if end <= begin:
        return range(0)
    return range(begin // tile, -(-end // tile))


def modify_scores(xp, s, rows, cols, softcap, slopes, offset):
    """FlashAttention-2's score modifications in natural-log units, in its order (common/score_mod.cuh).

    ``s`` holds scaled scores ``softmax_scale * q . k``; ``rows`` and ``cols`` broadcast against its last
    two axes and ``slopes`` (ALiBi, or None) against the rest. Returns the modified scores and their
    derivative with respect to ``s`` (``1 - tanh^2`` under a softcap, else None).
    """
    grad = None
    if softcap:
        t = xp.tanh(s / s.dtype.type(softcap))
        s = s.dtype.type(softcap) * t
        grad = 1 - t * t
    if slopes is not None:
        distance = xp.abs(rows + offset - cols).astype(s.dtype)
        s = s - slopes.astype(s.dtype)[..., None, None] * distance
    return s, grad


def layout_cells(layout, block_size, rows, cols):
    """Element mask of a block layout (..., R, C) at rows ``rows`` and keys ``cols`` (1-D arrays)."""
    block_q, block_k = block_size
    return layout[..., (rows // block_q)[:, None], (cols // block_k)[None, :]]


def coarsen(xp, layout, block_size, tile_q, tile_k, full=None):
    """The layout (..., R, C) seen at a kernel's tiles of tile_q rows by tile_k keys.

    Returns ``(any, partial)`` of shape (..., ceil(R * block_q / tile_q), ceil(C * block_k / tile_k)):
    ``any`` where the tile covers a set block, ``partial`` where it covers set and clear blocks (and so
    needs the element mask); with ``full`` (a mask_mod's blocks where it holds for every pair, shaped
    like ``layout``), where it covers a set block and a block that is not full (the kernels then
    evaluate the mask_mod there). A tile covers the blocks its rows and keys fall in; rows past R * block_q
    have no block, and the last tile's real rows (below seqlen_q, hence below R * block_q) cover the
    same blocks as all of its rows within R * block_q, so the result holds for every seqlen with those
    R and C. Computed with 2-D prefix sums, on the device for CuPy layouts.
    """
    block_q, block_k = block_size
    n_rows, n_cols = layout.shape[-2:]
    q_tiles = -(-n_rows * block_q // tile_q)
    k_tiles = -(-n_cols * block_k // tile_k)
    t_q = xp.arange(q_tiles)
    t_k = xp.arange(k_tiles)
    r0 = (t_q * tile_q) // block_q
    r1 = xp.minimum(((t_q + 1) * tile_q - 1) // block_q, n_rows - 1) + 1
    c0 = (t_k * tile_k) // block_k
    c1 = xp.minimum(((t_k + 1) * tile_k - 1) // block_k, n_cols - 1) + 1
    r0, r1, c0, c1 = r0[:, None], r1[:, None], c0[None, :], c1[None, :]

    def count(cells):  # set cells of each tile's blocks, by 2-D prefix sums
        sums = xp.zeros(cells.shape[:-2] + (n_rows + 1, n_cols + 1), dtype=numpy.int32)
        sums[..., 1:, 1:] = cells.astype(numpy.int32).cumsum(-2).cumsum(-1)
        return sums[..., r1, c1] - sums[..., r0, c1] - sums[..., r1, c0] + sums[..., r0, c0]

    area = (r1 - r0) * (c1 - c0)
    covered = count(layout) > 0
    return covered, covered & (count(layout if full is None else full) < area)


def tile_lists(xp, covered, partial):
    """Per row of ``covered`` (..., rows, cols): the count and the ascending list of its set columns.

    List entries are ``column * 2 + partial``; entries past the count are 0 and never read. Built by
    a scatter without host synchronization, so it stays on the device for CuPy arrays.
    """
    cols = covered.shape[-1]
    count = covered.sum(axis=-1, dtype=numpy.int32)
    position = covered.cumsum(axis=-1, dtype=numpy.int64) - 1
    # Absent columns go to a spare column past the end, dropped below.
    position = xp.where(covered, position, cols)
    rows = numpy.prod(covered.shape[:-1], dtype=numpy.int64)
    flat = (xp.arange(rows, dtype=numpy.int64)[:, None] * (cols + 1) + position.reshape(rows, cols)).ravel()
    entries = (xp.arange(cols, dtype=numpy.int32) * 2 + partial.astype(numpy.int32)).reshape(rows, cols).ravel()
    index = xp.zeros(rows * (cols + 1), dtype=numpy.int32)
    index[flat] = entries
    index = xp.ascontiguousarray(index.reshape(covered.shape[:-1] + (cols + 1,))[..., :cols])
    return count, index
