"""Block-sparse attention masks: :class:`BlockMask` and builders for the usual patterns."""

import math
import numbers

import numpy

from . import _policy

#: Largest block side: the kernels hold block bounds in 32 bits with room to spare.
_MAX_BLOCK = 2**30
#: from_mask_mod on the device keeps its partial blocks' pairs as bits (block_q * block_k / 4 bytes a block:
#: both orientations) while they take at most this many bytes; past it the kernels evaluate the function.
ELEMENT_BITS_MAX_BYTES = 1 << 28


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _block_size(value):
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(b, numbers.Integral) and not isinstance(b, (bool, numpy.bool_)) for b in value)
    ):
        raise TypeError(f"block_size must be a pair of ints (block_q, block_k), got {value!r}")
    block_q, block_k = (int(b) for b in value)
    if not (1 <= block_q <= _MAX_BLOCK and 1 <= block_k <= _MAX_BLOCK):
        raise ValueError(f"block_size must be positive and at most {_MAX_BLOCK}, got {(block_q, block_k)}")
    return block_q, block_k


class TileLists:
    """A layout's lists at one tile shape (tile_q rows by tile_k keys), on one array module.

    ``kv_count`` (..., q_tiles) and ``kv_index`` (..., q_tiles, k_tiles): the key tiles each query tile
    visits; ``q_count`` (..., k_tiles) and ``q_index`` (..., k_tiles, q_tiles): the query tiles each key
    tile visits. Entries are ``tile * 2 + partial``, ascending; partial marks a tile that covers set and
    clear blocks, or (with ``full``, a mask_mod's blocks where it holds for every pair) a block that is
    not full, and so needs the element mask.
    """

    def __init__(self, xp, layout, block_size, tile_q, tile_k, full=None):
        covered, partial = _policy.coarsen(xp, layout, block_size, tile_q, tile_k, full)
        self.tile_q, self.tile_k = tile_q, tile_k
        self.q_tiles, self.k_tiles = covered.shape[-2:]
        self.kv_count, self.kv_index = _policy.tile_lists(xp, covered, partial)
        self.q_count, self.q_index = _policy.tile_lists(xp, covered.swapaxes(-1, -2), partial.swapaxes(-1, -2))


class BlockMask:
    """Block-sparse attention: full attention inside a block, none between absent blocks.

    Build one with :meth:`from_dense` (any boolean layout) or with the :meth:`longformer` and
    :meth:`bigbird` builders, and pass it as ``block_mask=`` to :func:`cupyflash.flash_attention`,
    :func:`cupyflash.flash_attention_backward` or :func:`cupyflash.flash_attention_vjp`. Query i may see
    key j iff ``layout[b, h, i // block_q, j // block_k]``; ``causal``, ``window_size`` and the rest apply
    on top. Blocks are aligned to the top-left corner (block (0, 0) holds query 0 and key 0).

    The mask keeps, on the device of its layout (NumPy layouts: on the host), the per-query-block lists
    of key blocks and the per-key-block lists of query blocks (:attr:`kv_num_blocks`,
    :attr:`kv_indices`, :attr:`q_num_blocks`, :attr:`q_indices`, FlexAttention's names), so the forward
    and the backward pass skip absent blocks without reading them. A kernel whose tiles differ from
    the block size gets lists at its own tile size, built once on the device on first use and cached in
    the mask (a tile that covers set and clear blocks then evaluates the element mask). Block sizes of 64
    and multiples of 128 match every kernel's tiles but the FP8 forward's 192 query rows at head dim 64
    (64 matches all but the 16-bit and float32 forwards' 128 query rows); a
    mask needs seqlen_q and seqlen_k of at least 1. The mask keeps its own copy of the layout (read-only
    for NumPy): the lists built from it are cached.
    """

    def __init__(self, layout, block_size, mask_mod=None, element_bits=None):
        """Use :meth:`from_dense` or :meth:`from_mask_mod`; this constructor takes an already checked
        boolean layout (and from_mask_mod's function: its full blocks decide the lists' partial tiles, and
        on the device the bits of its partial blocks' pairs). Lists are built when first asked for (a
        call's kernel tile, or the block-size ones of the properties below), so building a mask is its
        layout's work alone."""
        self._layout = layout
        self.block_size = block_size
        self.mask_mod = mask_mod  # from_mask_mod: (traced mask_mod, buffers, full layout, (seqlen_q, seqlen_k))
        # from_mask_mod on the device: (slot, bits), CuPy arrays (BlockSparseArg's elem_slot and elem_bits).
        self._element_bits = element_bits
        self._lists = {}
        self._copies = {}
        self._partial = None  # _has_partial_blocks, once asked

    @property
    def _own(self):
        """The lists at the mask's own block size, on its layout's module and device."""
        xp = self._module(self._layout)
        if xp is numpy:
            return self.tile_lists(xp, *self.block_size)
        with self._layout.device:
            return self.tile_lists(xp, *self.block_size)

    # ------------------------------------------------------------------------------------ building

    @classmethod
    def from_dense(cls, layout, block_size=(128, 128)):
        """A mask from a boolean block layout.

        Parameters
        ----------
        layout : numpy.ndarray or cupy.ndarray of bool, shape (batch or 1, heads or 1, q_blocks, k_blocks)
            ``layout[b, h, r, c]`` allows queries ``r * block_q ...`` of query head h to see keys
            ``c * block_k ...``; a leading axis of size 1 applies to every batch entry or head. A call
            with sequence lengths seqlen_q and seqlen_k needs ``q_blocks = ceil(seqlen_q / block_q)`` and
            ``k_blocks = ceil(seqlen_k / block_k)``.
        block_size : (int, int)
            (block_q, block_k), the queries and keys per block.

        Returns
        -------
        BlockMask
            On the layout's device, with its own copy of the layout (read-only for NumPy).
        """
        block_size = _block_size(block_size)
        cupy = _cupy()
        if not isinstance(layout, numpy.ndarray) and not (cupy is not None and isinstance(layout, cupy.ndarray)):
            raise TypeError(
                f"layout must be a numpy.ndarray or cupy.ndarray of bool, got {type(layout).__module__}."
                f"{type(layout).__qualname__}"
            )
        if layout.dtype != numpy.bool_:
            raise TypeError(f"layout has dtype {layout.dtype}; expected bool")
        if layout.ndim != 4:
            raise ValueError(
                f"layout: {layout.ndim}-dimensional array given. Array must be 4-dimensional "
                "(batch or 1, heads or 1, q_blocks, k_blocks)"
            )
        if 0 in layout.shape:
            raise ValueError(f"layout must not be empty, got shape {layout.shape}")
        # A copy of the caller's array: the lists built from it are cached, so it must not change.
        xp = cls._module(layout)
        if xp is numpy:
            layout = numpy.array(layout, order="C")
            layout.flags.writeable = False
            return cls(layout, block_size)
        with layout.device:
            return cls(xp.array(layout, order="C"), block_size)

    @classmethod
    def from_mask_mod(cls, mask_mod, batch, heads, seqlen_q, seqlen_k, block_size=(128, 128), buffers=()):
        """A mask from a function of the positions (FlexAttention's ``create_block_mask``).

        Parameters
        ----------
        mask_mod : callable
            ``mask_mod(b, h, q_idx, kv_idx, *buffers) -> bool``: whether query q_idx of batch entry b and
            query head h sees key kv_idx. Traced once, like a score_mod (README, "Score and mask
            functions"); an index outside a buffer makes the pair visible with a NaN score.
        batch, heads : int
            The calls' batch and query heads, or 1 for a mask that does not depend on them. A call of
            more refuses (ValueError) a mask built with 1 whose function reads b (h) and that has partial
            blocks: the layout holds the blocks of b = 0 (h = 0), while the calls evaluate the function in
            partial blocks at each entry's b (h).
        seqlen_q, seqlen_k : int
            The calls' sequence lengths (at least 1): the mask serves exactly these.
        block_size : (int, int)
            (block_q, block_k).
        buffers : tuple of arrays
            The arrays the function indexes (at most 8; float32, float64, int32 or bool, rank at most 4), all NumPy
            or all CuPy, copied (later writes to them do not change the mask). The layout is built on
            their device (by a kernel compiled from the function, one CTA per block) or on the host
            (NumPy buffers, or none).

        Returns
        -------
        BlockMask
            Layout (batch, heads, q_blocks, k_blocks): a block is set where the function holds for some
            pair in it. The calls evaluate the function only in blocks where it does not hold for every
            pair (and skip the blocks where it holds for none). Built on the device with block sides that
            are multiples of 128, the mask also keeps those blocks' pairs as bits (block_q * block_k / 4
            bytes a block while they take at most ELEMENT_BITS_MAX_BYTES), which the forward kernels and
            (without a score function) the Hopper backward read instead of evaluating the function.
        """
        from . import _problem, _trace

        rows, cols, block_size = cls._grid(seqlen_q, seqlen_k, block_size)
        for name, value in (("batch", batch), ("heads", heads)):
            if cls._count(name, value) < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        cupy = _cupy()
        xp = cupy if cupy is not None and any(isinstance(b, cupy.ndarray) for b in buffers) else numpy
        # Copies: the mask's blocks are classified once, so later writes to the caller's arrays must not
        # reach the function the kernels evaluate.
        buffers = tuple(xp.array(x, copy=True) for x in _problem.check_buffers("buffers", buffers, xp))
        traced = _trace.trace(mask_mod, "mask", [(b.dtype, b.ndim) for b in buffers], "mask_mod")
        if xp is not numpy:
            from ._families import common

            with buffers[0].device:
                some, every = common.mask_mod_blocks(traced, buffers, batch, heads, seqlen_q, seqlen_k, block_size)
                bits = cls._build_element_bits(traced, buffers, heads, seqlen_q, seqlen_k, block_size, some, every)
                return cls(some, block_size, (traced, buffers, every, (seqlen_q, seqlen_k)), bits)
        for x in buffers:
            x.flags.writeable = False
        # NumPy buffers (or none): the host classifies the blocks.
        block_q, block_k = block_size
        b = numpy.arange(batch, dtype=numpy.int32).reshape(batch, 1, 1, 1)
        h = numpy.arange(heads, dtype=numpy.int32).reshape(1, heads, 1, 1)
        kv_idx = numpy.arange(seqlen_k, dtype=numpy.int32)[None, :]
        some = numpy.zeros((batch, heads, rows, cols), dtype=bool)
        every = numpy.zeros((batch, heads, rows, cols), dtype=bool)
        for r in range(rows):  # one block row of queries at a time: memory of block_q * seqlen_k pairs
            q_idx = numpy.arange(r * block_q, min((r + 1) * block_q, seqlen_q), dtype=numpy.int32)[:, None]
            (seen, ok), = _trace.evaluate([traced.root], {"b": b, "h": h, "q_idx": q_idx, "kv_idx": kv_idx},
                                          buffers, numpy.float32, numpy)
            shape = (batch, heads, q_idx.shape[0], seqlen_k)
            seen = numpy.broadcast_to(seen, shape)
            # A pair whose index is out of range is visible (with a NaN score): its block is partial.
            certain = seen if ok is None else seen & numpy.broadcast_to(ok, shape)
            padded = numpy.zeros(shape[:3] + (cols * block_k,), dtype=bool)
            padded[..., :seqlen_k] = seen if ok is None else seen | ~numpy.broadcast_to(ok, shape)
            some[:, :, r] = padded.reshape(shape[:3] + (cols, block_k)).any(axis=(2, 4))
            padded[..., :seqlen_k] = certain
            padded[..., seqlen_k:] = True  # keys past the end do not make a block partial
            every[:, :, r] = padded.reshape(shape[:3] + (cols, block_k)).all(axis=(2, 4))
        some.flags.writeable = every.flags.writeable = False
        return cls(some, block_size, (traced, buffers, every, (seqlen_q, seqlen_k)))

    @staticmethod
    def _build_element_bits(traced, buffers, heads, seqlen_q, seqlen_k, block_size, some, every):
        """from_mask_mod's partial blocks (some pair, not every pair visible) as bits on the device, or None
        where the block sides are not multiples of 128 (a word holds 128 positions of a row) or the bits
        would pass ELEMENT_BITS_MAX_BYTES. Synchronizes the current stream (the count of partial blocks,
        their positions, then the finished bits), so a mask is not built this way inside a CUDA graph
        capture."""
        from ._families import common

        block_q, block_k = block_size
        if block_q % 128 or block_k % 128:
            return None
        partial = some & ~every
        count = int(partial.sum())
        if count == 0 or count * block_q * block_k // 4 > ELEMENT_BITS_MAX_BYTES:
            return None
        cupy = _cupy()
        flat = partial.ravel()
        slot = cupy.where(flat, cupy.cumsum(flat, dtype=cupy.int32) - 1, -1).astype(cupy.int32).reshape(partial.shape)
        cells = cupy.flatnonzero(flat).astype(cupy.int64)
        bits = common.mask_mod_bits(traced, buffers, heads, seqlen_q, seqlen_k, block_size, slot, cells)
        # Complete before a call on any stream reads them (the kernel also writes slots).
        cupy.cuda.get_current_stream().synchronize()
        return slot, bits

    @classmethod
    def longformer(cls, seqlen_q, seqlen_k=None, *, block_size=(128, 128), window_blocks=1, global_blocks=1):
        """A sliding window of blocks plus global blocks (Longformer), on the host.

        Query block r sees key block c iff ``|r - c| <= window_blocks``, or c < global_blocks (global
        keys every query sees), or r < global_blocks (global queries that see every key). The same
        layout serves every batch entry and head.

        Parameters
        ----------
        seqlen_q : int
            Queries of the calls the mask is for, at least 1.
        seqlen_k : int or None
            Keys, at least 1; None: seqlen_q.
        block_size : (int, int), keyword-only
            (block_q, block_k), the queries and keys per block.
        window_blocks : int, keyword-only
            Blocks on each side of the diagonal block that a query block sees, at least 0.
        global_blocks : int, keyword-only
            The first global_blocks key blocks are seen by every query block, and the first
            global_blocks query blocks see every key block; at least 0.

        Returns
        -------
        BlockMask
            A NumPy layout of shape (1, 1, ceil(seqlen_q / block_q), ceil(seqlen_k / block_k)). Move it
            to the device with ``BlockMask.from_dense(cupy.asarray(mask.layout), mask.block_size)``, or
            let the first GPU call copy it (once).
        """
        rows, cols, block_size = cls._grid(seqlen_q, seqlen_k, block_size)
        window_blocks = cls._count("window_blocks", window_blocks)
        global_blocks = cls._count("global_blocks", global_blocks)
        r = numpy.arange(rows)[:, None]
        c = numpy.arange(cols)[None, :]
        layout = (numpy.abs(r - c) <= window_blocks) | (c < global_blocks) | (r < global_blocks)
        return cls.from_dense(layout[None, None], block_size)

    @classmethod
    def bigbird(cls, seqlen_q, seqlen_k=None, *, block_size=(128, 128), window_blocks=1, global_blocks=1,
                random_blocks=2, heads=1, seed=0):
        """Longformer's pattern plus random key blocks for each query block (BigBird), on the host.

        Parameters
        ----------
        seqlen_q, seqlen_k, block_size, window_blocks, global_blocks
            As in :meth:`longformer`.
        random_blocks : int, keyword-only
            Key blocks drawn at random (without replacement, at most all of them) for each query block,
            on top of Longformer's; at least 0.
        heads : int, keyword-only
            Layouts drawn, one per query head, at least 1; 1 shares one layout among all heads.
        seed : int, keyword-only
            Seed of ``numpy.random.default_rng``, a non-negative int: a seed gives the same mask in
            every process (every rank of a ring, every run).

        Returns
        -------
        BlockMask
            A NumPy layout of shape (1, heads, ceil(seqlen_q / block_q), ceil(seqlen_k / block_k)).
        """
        base = cls.longformer(seqlen_q, seqlen_k, block_size=block_size, window_blocks=window_blocks,
                              global_blocks=global_blocks)
        random_blocks = cls._count("random_blocks", random_blocks)
        if cls._count("heads", heads) < 1:
            raise ValueError(f"heads must be at least 1, got {heads}")
        rng = numpy.random.default_rng(cls._count("seed", seed))
        rows, cols = base.layout.shape[-2:]
        layout = numpy.repeat(base.layout, heads, axis=1)
        picks = min(random_blocks, cols)
        for h in range(heads):
            for r in range(rows):
                layout[0, h, r, rng.choice(cols, picks, replace=False)] = True
        return cls.from_dense(layout, base.block_size)

    @classmethod
    def _grid(cls, seqlen_q, seqlen_k, block_size):
        block_size = _block_size(block_size)
        seqlen_k = seqlen_q if seqlen_k is None else seqlen_k
        for name, value in (("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
            if cls._count(name, value) < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        return math.ceil(seqlen_q / block_size[0]), math.ceil(seqlen_k / block_size[1]), block_size

    @staticmethod
    def _count(name, value):
        if not isinstance(value, numbers.Integral) or isinstance(value, (bool, numpy.bool_)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
        return int(value)

    # ----------------------------------------------------------------------------------- properties

    @property
    def layout(self):
        """The boolean layout (batch or 1, heads or 1, q_blocks, k_blocks), as given to :meth:`from_dense`."""
        return self._layout

    @property
    def shape(self):
        return self._layout.shape

    @property
    def density(self):
        """Fraction of set blocks."""
        return float(self._layout.mean())

    @property
    def kv_num_blocks(self):
        """(batch or 1, heads or 1, q_blocks): key blocks each query block sees."""
        return self._own.kv_count

    @property
    def kv_indices(self):
        """(..., q_blocks, k_blocks): their indices, ascending (entries past the count are unused)."""
        return self._own.kv_index >> 1

    @property
    def q_num_blocks(self):
        """(batch or 1, heads or 1, k_blocks): query blocks that see each key block."""
        return self._own.q_count

    @property
    def q_indices(self):
        """(..., k_blocks, q_blocks): their indices, ascending (entries past the count are unused)."""
        return self._own.q_index >> 1

    def _has_partial_blocks(self):
        """from_mask_mod masks: whether some set block is not full (the calls evaluate the function
        there); read back from the device once, then kept. False for masks of from_dense."""
        if self.mask_mod is None:
            return False
        if self._partial is None:
            self._partial = bool((self._layout & ~self.mask_mod[2]).any())
        return self._partial

    def __repr__(self):
        kind = "" if self.mask_mod is None else f", mask_mod={self.mask_mod[0].name}"
        return f"BlockMask(shape={self.shape}, block_size={self.block_size}, density={self.density:.3f}{kind})"

    # --------------------------------------------------------------------------------- for the calls

    @staticmethod
    def _module(array):
        cupy = _cupy()
        if cupy is not None and isinstance(array, cupy.ndarray):
            return cupy
        return numpy

    def layout_on(self, xp):
        """The layout on ``xp`` (numpy, or cupy on the current device), copied once when needed."""
        if self._module(self._layout) is xp and (xp is numpy or self._layout.device.id == xp.cuda.Device().id):
            return self._layout
        key = (xp.__name__, xp.cuda.Device().id if xp is not numpy else None)
        if key not in self._copies:
            self._copies[key] = xp.asarray(self._layout) if xp is not numpy else self._layout.get()
        return self._copies[key]

    def mask_buffers_on(self, xp):
        """A mask_mod's buffers on ``xp`` (numpy, or cupy on the current device), copied once when needed."""
        buffers = self.mask_mod[1]
        if all(self._module(x) is xp and (xp is numpy or x.device.id == xp.cuda.Device().id) for x in buffers):
            return buffers
        key = ("buffers", xp.__name__, xp.cuda.Device().id if xp is not numpy else None)
        if key not in self._copies:
            self._copies[key] = tuple(xp.asarray(x) if xp is not numpy else x.get() for x in buffers)
        return self._copies[key]

    def element_bits_on(self, xp):
        """from_mask_mod's (slot, bits) on cupy's current device (copied once when needed), or None."""
        if self._element_bits is None:
            return None
        slot, bits = self._element_bits
        if slot.device.id == xp.cuda.Device().id:
            return self._element_bits
        key = ("element_bits", xp.cuda.Device().id)
        if key not in self._copies:
            self._copies[key] = (xp.asarray(slot), xp.asarray(bits))
            xp.cuda.get_current_stream().synchronize()  # (complete before a call on another stream)
        return self._copies[key]

    def full_on(self, xp):
        """A mask_mod's full-block layout on ``xp`` (numpy, or cupy on the current device; None without a
        mask_mod), copied once when needed."""
        if self.mask_mod is None:
            return None
        full = self.mask_mod[2]
        if self._module(full) is xp and (xp is numpy or full.device.id == xp.cuda.Device().id):
            return full
        key = ("full", xp.__name__, xp.cuda.Device().id if xp is not numpy else None)
        if key not in self._copies:
            self._copies[key] = xp.asarray(full) if xp is not numpy else full.get()
        return self._copies[key]

    def tile_lists(self, xp, tile_q, tile_k):
        """The :class:`TileLists` at a kernel's tile shape on ``xp`` (the current device), built once.

        On the device they are built on the current stream, which is then synchronized once, so that a
        later call on any stream finds them complete.
        """
        key = (xp.__name__, xp.cuda.Device().id if xp is not numpy else None, tile_q, tile_k)
        lists = self._lists.get(key)
        if lists is None:
            lists = TileLists(xp, self.layout_on(xp), self.block_size, tile_q, tile_k, self.full_on(xp))
            if xp is not numpy:
                xp.cuda.get_current_stream().synchronize()
            self._lists[key] = lists
        return lists
