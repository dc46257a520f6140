"""The sm90 family: Hopper kernels (TMA, wgmma, warp specialization) for float16 and bfloat16, built for
``sm_90a`` and run only on compute capability 9.0 exactly (kernels_cu/sm90/fwd.cu describes the design;
bench/NOTES.md has the measurements behind the tile table).

The kernels read q, k and v through TMA tensor maps, which this module builds on the host with the
driver's ``cuTensorMapEncodeTiled`` (through ctypes: CuPy does not wrap it) once, when a plan is made; a
plan's later runs move each map to the run's array with ``cuTensorMapReplaceAddress`` (cupyflash/_plan.py),
since the layout, the only other thing a map encodes, is the plan's. A TMA needs 16-byte aligned bases
and strides; dispatch gives inputs that do not have them to the sm80 family.
"""

import ctypes
import functools
import math

import numpy

from .. import _fp8, _kernels, _params, _plan
from .._problem import lse_dtype
from . import common, sm80

#: The only compute capability whose cubins these are (sm_90a code runs nowhere else).
CAPABILITY = 90
#: Shared memory of the per-CTA state, and the slack that aligns the tiles to 1024 bytes.
CTA_STATE_BYTES = 1024
ALIGN_SLACK = 1024

#: Forward tiles: (headdim, headdim_v) bucket -> the (query rows, keys per tile, K/V stages) choices, the
#: first for every walk, the second (where there is one) for block masks whose query blocks the first
#: would straddle. A problem takes the cheapest bucket covering both of its head dims; the TMA zero-fills
#: the columns past them. A CTA runs a producer warpgroup and a consumer warpgroup per 64 query rows: d64
#: takes three (192 rows, 160 registers each), whose softmax warps hide each other's exponentials (+1-6%
#: at 1k keys, +11-13% at 2k, +6-11% beyond). Each of the three computes only the key tiles its own rows
#: see, and the tiles end at the sequence's last row (Sm90Schedule::align_end), so causal walks do no
#: more work than on 128-row tiles: equal to them at 512-1024 causal keys, 3-12% faster at 2k-4k
#: (bench/NOTES.md). Where the O tile fits beside the ring (fwd_stores_o) the epilogue stages it in
#: shared memory for TMA stores: d64, d96 and d128, whose 2 K/V stages leave it room (with a third
#: stage it would not fit; 2 stages and the staged epilogue ran 0.98-1.05x the speed of 3 stages and
#: the register epilogue at 4k-16k keys, bench/NOTES.md).
FWD_TILES = {
    (64, 64): ((192, 128, 4), (128, 128, 4)),
    (96, 96): ((128, 128, 2),),
    (128, 128): ((128, 128, 2),),
    (192, 128): ((128, 128, 2),),
    (192, 192): ((128, 96, 2),),
    (256, 256): ((128, 80, 2),),
}
#: The shared memory a CTA may opt into on sm_90 (Sm90FwdTraits::kStoreO's limit).
SMEM_OPTIN = 227 * 1024

#: Backward threads: a producer warpgroup and two consumer warpgroups.
BWD_THREADS = 384
#: Backward tiles: (headdim, headdim_v) bucket -> (queries per tile, Q/dO stages). Up to head dim 128 a
#: CTA takes 128 keys, 64 per consumer, whose dK and dV stay in its registers (headdim / 2 + headdim_v /
#: 2 floats per thread) beside S^T and dP^T (block_m / 2 each): the tiles are those whose sum leaves room
#: in 240 registers. Above, a CTA takes 64 keys and the consumers take roles (Sm90BwdTraits::kSplitCols:
#: one holds dV, the other dK, every column: 128 floats per thread at head dim 256) and split dQ by
#: columns. Head dims 80 and 96, and 160 and 192, take buckets of their own: tiles of whole 64-column
#: atoms (two for 96, three for 192), products as wide as the head dim (the 128 and 256 buckets computed
#: a third more than they need; bench/NOTES.md, session 16). The TMA reads zeros past a head dim's
#: columns.
BWD_TILES = {
    (64, 64): (128, 2),
    (96, 96): (64, 2),
    (128, 128): (64, 2),
    (192, 192): (64, 2),
    (256, 256): (64, 2),
}
#: float32 dQ buffers of the deterministic backward. A producer thread polls the turns ahead of the
#: reducing one (Sm90BwdMainloop::wait_turns), so the turns no longer bind and a second buffer, which
#: halves the chains, mostly adds its zeroing and its share of the conversion (bench/NOTES.md,
#: session 14: one buffer 1-20% faster than two, but for head dim 256 non-causal at 4k, 4% slower).
DETERMINISTIC_DQ_SPLITS = 1
#: Above head dim 128 (64-key CTAs, 64 KiB of dQ per tile), the rotated walks of an unmasked problem
#: keep two buffers: their chains of turns, half as long, gave 7-10% at non-causal 4k and changed
#: nothing elsewhere (bench/NOTES.md, session 15).
DETERMINISTIC_DQ_SPLITS_SPLIT_COLS_BY_WALK = 2

FWD = _kernels.Kernel(
    "sm90_fwd", "sm90/fwd.cu", _kernels.HALF_DTYPES, ("headdim", "headdim_v", "block_m", "block_n", "stages"),
    tuple((*dims, *tile) for dims, tiles in FWD_TILES.items() for tile in tiles), ("score_mod", "dropout", "max_score"),
    arch="90a", user_functions=True,
)
#: The paired forward (kernels_cu/sm90/fwd.cu's sm90_fwd_pairs): a paged cache's prefill whose query heads
#: pair up on their kv heads, in clusters of two CTAs that fill their K/V rings together, each issuing
#: half of a tile's TMA boxes into both. The head-dim buckets it is built for, with FWD_TILES' tile.
FWD_PAIRS_DIMS = ((128, 128),)
#: Pages whose boxes (paged_box_rows) hold at most this many rows pair up: where a tile takes four boxes or
#: more an operand, their issue limits the walk. Session 59, H100, 512 causal queries over a 32k cache, GQA
#: 32/8, d128 (TFLOP/s, 5 rounds): pages of 16 (8 boxes) 493-538 unpaired, 532-554 paired (ncu at base
#: clocks 617.6 -> 552.1 us); pages of 64 (2 boxes) 586-592 unpaired, 579-583 paired (the cluster's shared
#: stage releases cost more than the halved issue saves). Session 60, H200, 3 rounds: pages of 16 511-516
#: unpaired, 536-541 paired; pages of 32 (4 boxes) 561-567 unpaired, 565-567 paired.
FWD_PAIRS_MAX_BOX_ROWS = 32
FWD_PAIRS = _kernels.Kernel(
    "sm90_fwd_pairs", "sm90/fwd.cu", _kernels.HALF_DTYPES, ("headdim", "headdim_v", "block_m", "block_n", "stages"),
    tuple((*dims, *FWD_TILES[dims][0]) for dims in FWD_PAIRS_DIMS), arch="90a",
)
#: The forwards whose operands wgmma reads K-major only (kernels_cu/sm90/fwd_kmajor_mainloop.cuh), in
#: 128-row CTAs of two consumer warpgroups (e4m3 at head dim 64: 192 rows, three; kmajor_block_m).
#: FP8 (e4m3) inputs: head-dim bucket -> (keys per tile, K/V^T stages); the kernel's dtype is out's
#: (bfloat16 or float16).
FWD_FP8_TILES = {(64, 64): (128, 4), (128, 128): (128, 4), (256, 256): (128, 2)}
FWD_FP8 = _kernels.Kernel(
    "sm90_fwd_fp8", "sm90/fwd_kmajor.cu", _kernels.HALF_DTYPES, ("headdim", "headdim_v", "block_n", "stages"),
    tuple((*dims, *tile) for dims, tile in FWD_FP8_TILES.items()), ("max_score",), arch="90a",
)
#: float32 at precision="tf32" (one tf32 product per product, k = 8; four bytes an element): at head dim
#: 128 the Q tile (64 KB) and two stages of 64-key K and V^T tiles (32 KB each) fill 192 KB; at 64 two
#: stages of 128-key tiles, 160 KB. Larger head dims take the planes kernel (FWD_PLANES).
FWD_TF32_TILES = {(64, 64): (128, 2), (128, 128): (64, 2)}
FWD_TF32 = _kernels.Kernel(
    "sm90_fwd_tf32", "sm90/fwd_kmajor.cu", ("float32",), ("headdim", "headdim_v", "block_n", "stages"),
    tuple((*dims, *tile) for dims, tile in FWD_TF32_TILES.items()), ("max_score",), arch="90a",
)


def kmajor_block_m(variant):
    """Query rows per CTA of a K-major forward variant (Sm90FwdKMajorTraits::kBlockM): 192 (three consumer
    warpgroups) for e4m3 at head dim 64, else 128."""
    return 192 if variant.kernel is FWD_FP8 and variant.param("headdim") <= 64 else 128


def kmajor_threads(variant):
    """Threads of a K-major forward variant's CTA: a producer warpgroup and a consumer per 64 rows."""
    return 128 * (1 + kmajor_block_m(variant) // 64)

#: Their pre-passes (kernels_cu/sm90/kmajor_values.cu): v as V^T, keys contiguous and permuted per k-step
#: (e4m3 and float32, the latter rounded to tf32), and q and k rounded to tf32.
FP8_VALUES = _kernels.Kernel("fp8_transpose_values", "sm90/kmajor_values.cu", ())
TF32_VALUES = _kernels.Kernel("tf32_transpose_values", "sm90/kmajor_values.cu", ())
TF32_ROWS = _kernels.Kernel("tf32_round_rows", "sm90/kmajor_values.cu", ())
PREPASS_THREADS = 256
#: The float32 forward's tiles (kernels_cu/sm90/fwd_planes_mainloop.cuh): head-dim bucket -> ((keys per
#: tile, K/V stages),). q, k and v are read as three bfloat16 planes (6 bytes an element): at head dim
#: 128 the 128-row Q tile (96 KB) and one stage of 64-key K and V tiles (48 KB each) fill 194 KB.
FWD_PLANES_TILES = {64: ((64, 2),), 128: ((64, 1),)}
FWD_PLANES = _kernels.Kernel(
    "sm90_fwd_planes", "sm90/fwd_planes.cu", ("float32",), ("headdim", "block_n", "stages"),
    tuple((d, *tile) for d, tiles in FWD_PLANES_TILES.items() for tile in tiles), ("score_mod", "tf32", "max_score"),
    arch="90a", user_functions=True,
)
#: Query rows per CTA of the float32 forward (two consumer warpgroups).
FWD_PLANES_BLOCK_M = 128
#: Head dims up to which the backward's consumers each hold their keys' dK and dV (above, the split-column
#: roles, Sm90BwdTraits::kSplitCols), the tiles built with dropout.
BWD_DROPOUT_MAX_HEADDIM = 128
#: The head dims whose backward adds an additive score_mod's buffer gradients: 64-query tiles whose
#: consumers hold their keys' dK and dV (head dim 64's 128-query tile made 164 local accesses in its
#: consumers, against 16 at head dim 128; session 26).
BWD_SCATTER_DIMS = ((96, 96), (128, 128))
BWD = _kernels.Kernel(
    "sm90_bwd", "sm90/bwd.cu", _kernels.HALF_DTYPES, ("headdim", "headdim_v", "block_m", "stages"),
    tuple((*dims, *tile) for dims, tile in BWD_TILES.items()), ("score_mod", "dropout"), arch="90a",
    excludes=lambda tile, flags: flags["dropout"] and max(tile[:2]) > BWD_DROPOUT_MAX_HEADDIM, user_functions=True,
)
#: The float32 backward's Q/dO stages per head-dim bucket (kernels_cu/sm90/bwd_planes_mainloop.cuh): 64-key
#: CTAs and 64-query tiles whose operands are three bfloat16 planes each; at head dim 128 K and V (48 KB
#: each), one Q and dO stage (96 KB) and the P'/dS^T/dQ buffer (32 KB) fill 227 KB.
BWD_PLANES_STAGES = {64: 2, 128: 1}
BWD_PLANES = _kernels.Kernel(
    "sm90_bwd_planes", "sm90/bwd_planes.cu", ("float32",), ("headdim", "stages"),
    tuple(BWD_PLANES_STAGES.items()), ("score_mod", "tf32"), arch="90a", user_functions=True,
)
#: Keys per CTA and queries per tile of the float32 backward.
BWD_PLANES_BLOCK = 64
#: The backward's launch order under a block mask (kernels_cu/sm90/bwd_key_order.cu, BwdArgs::key_order):
#: a CTA of KEY_ORDER_THREADS per (batch entry, kv head), its key tiles' walks in the 48 KB of shared
#: memory a kernel has without opting in.
BWD_KEY_ORDER = _kernels.Kernel("bwd_key_order", "sm90/bwd_key_order.cu", ())
KEY_ORDER_THREADS = 256
KEY_ORDER_MAX_TILES = 12 * 1024


def _atoms(columns):
    return -(-columns // 64)


def _fwd_tile_bytes(variant):
    """(the Q tile and the ring, the O tile) of a forward variant, in 64-column atoms of 128 bytes per row."""
    d, dv, block_m, block_n, stages = (variant.param(n) for n in ("headdim", "headdim_v", "block_m", "block_n", "stages"))
    return block_m * 128 * _atoms(d) + stages * block_n * 128 * (_atoms(d) + _atoms(dv)), block_m * 128 * _atoms(dv)


def fwd_threads(variant):
    """Threads of a forward variant's CTA (Sm90FwdTraits::kThreads): the producer warpgroup and a consumer
    warpgroup per 64 query rows."""
    return 128 * (1 + variant.param("block_m") // 64)


def fwd_stores_o(variant):
    """Whether a forward variant's epilogue stages O in shared memory (Sm90FwdTraits::kStoreO): the O
    tile fits beside the Q tile and the ring."""
    ring, o_tile = _fwd_tile_bytes(variant)
    return ALIGN_SLACK + ring + o_tile + CTA_STATE_BYTES <= SMEM_OPTIN


def fwd_smem_bytes(variant):
    """Dynamic shared memory of a forward variant (Sm90FwdTraits::kSmemBytes): the Q tile, ``stages`` K
    and V tiles, the O tile where it fits, the state, and the alignment slack."""
    ring, o_tile = _fwd_tile_bytes(variant)
    return ALIGN_SLACK + ring + (o_tile if fwd_stores_o(variant) else 0) + CTA_STATE_BYTES


def fwd_planes_smem_bytes(variant):
    """Dynamic shared memory of a float32 forward variant (Sm90FwdPlanesTraits::kSmemBytes): the Q tile
    and ``stages`` K and V tiles, each of three bfloat16 planes (two for "tf32") in 64-column atoms, the
    state and the alignment slack."""
    d, block_n, stages = (variant.param(n) for n in ("headdim", "block_n", "stages"))
    planes = 2 if variant.param("tf32") else 3
    return ALIGN_SLACK + planes * 128 * _atoms(d) * (FWD_PLANES_BLOCK_M + 2 * stages * block_n) + CTA_STATE_BYTES


def paged_box_rows(page_size, block_n):
    """Rows of a paged key tile's TMA boxes (Sm90FwdMaps::box_rows): the largest divisor of both the page
    size and the tile's keys, so no box straddles a page; None unless it is a multiple of 8 (whole
    1024-byte swizzle periods: smaller pages take the decode kernel)."""
    rows = math.gcd(page_size, block_n)
    return rows if rows % 8 == 0 else None


def paged_values_map(b, maps, v, box_rows, bucket_v):
    """With a paged v whose head dim is its bucket's (``bucket_v``: the kernel's tile columns) and a
    multiple of 64 above 64, and boxes of a power of two of at least 16 rows (one k-step of O += P V inside
    a box): ``maps["v"]`` becomes the 5-D view (64 columns, page rows, 64-column atoms 128 bytes apart,
    heads_k, pages), whose box of ``box_rows`` rows spans every atom, and ``maps["v_box_rows"]`` is set
    (kernels_cu/sm90/fwd_mainloop.cuh's Sm90FwdMaps::v_box_rows). Returns whether it did (else v keeps
    tensor_map's view, a box per atom, whose atoms past a narrower head dim the TMA fills with zeros)."""
    pages, page_size, heads_k, dim = v.shape
    if dim != bucket_v or dim % 64 or dim == 64 or box_rows < 16 or box_rows & (box_rows - 1):
        return False
    page_stride, row_stride, head_stride = v.strides[:3]
    dims, strides = (64, page_size, dim // 64, heads_k, pages), (row_stride, 128, head_stride, page_stride)
    b.tensor_map(maps, "v", v, functools.partial(_encode, dtype_code=_TMA_DTYPE[v.dtype.name], dims=dims,
                                                 strides=strides, box=(64, box_rows, dim // 64, 1, 1)))
    maps["v_box_rows"] = box_rows
    return True


def _prepass_blocks(chunks):
    """Blocks of a grid-stride pre-pass over ``chunks`` 16-byte chunks (at most 8192)."""
    return max(1, min(common.cdiv(chunks, PREPASS_THREADS), 8192))


def kmajor_element_bytes(variant):
    """Bytes of an element of a K-major forward variant's operands: 1 (e4m3) or 4 (tf32)."""
    return 4 if variant.kernel is FWD_TF32 else 1


def fwd_kmajor_smem_bytes(variant):
    """Dynamic shared memory of a K-major forward variant (Sm90FwdKMajorTraits::kSmemBytes): the Q tile and
    ``stages`` K and V^T tiles (128-byte atoms of 128 e4m3 or 32 float32 columns; V^T: headdim_v rows of
    the tile's keys), the state and the alignment slack."""
    d, dv, block_n, stages = (variant.param(n) for n in ("headdim", "headdim_v", "block_n", "stages"))
    size = kmajor_element_bytes(variant)
    atoms = common.cdiv(d, 128 // size)
    return (ALIGN_SLACK + kmajor_block_m(variant) * 128 * atoms + stages * (block_n * 128 * atoms + dv * block_n * size)
            + CTA_STATE_BYTES)


def kmajor_missing(p, capability, operands):
    """What the K-major forward of problem ``p`` (the FP8 kernel for e4m3 inputs, the tf32 kernel for float32
    ones) does not take on a device of ``capability`` with these operands, in words (empty: it runs). The
    checks of FP8 calls and dispatch share this one list; a float32 problem it rejects takes the planes
    kernel."""
    fp8 = p.dtype == _fp8.E4M3
    limits = (
        (capability != CAPABILITY, f"a device of compute capability {capability} (it runs on 9.0: H100, H200)"),
        (p.varlen, "packed (varlen) batches"), (p.seqused_k is not None, "seqused_k"), (p.softcap != 0.0, "softcap"),
        (p.alibi_slopes is not None, "ALiBi"), (p.sinks is not None, "sinks"),
        (p.user_mask is not None, "BlockMask.from_mask_mod"), (p.user_score is not None, "score_mod"),
        (p.dropout, "dropout"), (p.softmax_scale <= 0, "softmax_scale <= 0"), (p.block_table is not None, "paged keys"),
        (max(p.headdim, p.headdim_v) > (256 if fp8 else 128), f"head dims above {256 if fp8 else 128}"),
        # The tf32 kernel reads the pre-passes' copies, never q, k or v themselves.
        (fp8 and not p.varlen and not all(tma_addressable(x, False) for x in operands),
         "q, k or v rows that are not 16-byte aligned (make them contiguous with a head dim that is a multiple of 16)"),
    )
    return [what for failed, what in limits if failed]


def bwd_split_cols(variant):
    """Whether a backward variant's consumers split dK, dV and dQ by columns (Sm90BwdTraits::kSplitCols):
    above head dim 128."""
    return max(variant.param("headdim"), variant.param("headdim_v")) > 128


def bwd_block_n(variant):
    """Keys per CTA of a backward variant (Sm90BwdTraits::kBlockN)."""
    return 64 if bwd_split_cols(variant) else 128


def bwd_smem_bytes(variant):
    """Dynamic shared memory of a backward variant (Sm90BwdTraits::kSmemBytes): K and V (block_n keys),
    ``stages`` Q and dO tiles, two dS^T buffers (block_n x block_m, 16-bit; with split columns room for
    one tile's P' in float32 too, as many bytes, which at head dim 192 also stages one atom of dQ),
    ``stages`` rows of lse and delta, the float32 dQ tiles (block_m x headdim: one per consumer when
    block_m is 64, Sm90BwdTraits::kDqAlternate, one when it is 128, none with split columns), the
    state, and the alignment slack."""
    d, dv, block_m, stages = (variant.param(n) for n in ("headdim", "headdim_v", "block_m", "stages"))
    block_n, split = bwd_block_n(variant), bwd_split_cols(variant)
    tiles = (block_n + stages * block_m) * 128 * (_atoms(d) + _atoms(dv)) + (4 if split else 2) * block_n * block_m * 2
    dq_tiles = 0 if split else 2 if block_m == 64 else 1
    dq_tile = dq_tiles * block_m * d * 4
    return ALIGN_SLACK + tiles + stages * 2 * block_m * 4 + dq_tile + CTA_STATE_BYTES


def bwd_planes_smem_bytes(variant):
    """Dynamic shared memory of a float32 backward variant (Sm90BwdPlanesTraits::kSmemBytes): K and V and
    ``stages`` Q and dO tiles, each of three bfloat16 planes (two for "tf32") in 64-column atoms of 64
    rows, the P'/dS^T/dQ buffer, ``stages`` rows of lse (float64) and delta, the state, and the alignment
    slack."""
    d, stages = variant.param("headdim"), variant.param("stages")
    planes = 2 if variant.param("tf32") else 3
    block = BWD_PLANES_BLOCK
    x = max(planes * block * block * 2, block * block * 4, block * d * 4 if stages == 1 else 0)  # (kDqInX: dQ too)
    return ALIGN_SLACK + planes * block * 128 * _atoms(d) * (2 + 2 * stages) + x + stages * block * 12 + CTA_STATE_BYTES


def l2_section(p, device):
    """(batch entry, head) pairs per section of the longest-first schedule (Sm90Schedule): as many as
    have their K and V in ``L2_SECTION_SHARE`` of L2 together, at least ``L2_SECTION_MIN_PAIRS`` (block
    masks: ``L2_SECTION_MIN_PAIRS_SPARSE``), then evened out so that every section holds about as many
    (at most all). Even, because a short last section starts its longest tiles when most CTAs are near
    their end: 256 pairs in sections of 60 left a last one of 16, whose 128 tiles ran on the SMs one by
    one as they freed. The query heads of one group of GQA share their K and V, and the schedule takes
    them one after another."""
    pairs = p.batch * p.heads
    kv_bytes = p.seqlen_k * (p.headdim + p.headdim_v) * p.dtype.itemsize * p.heads_k // p.heads
    least = L2_SECTION_MIN_PAIRS if p.block_mask is None else L2_SECTION_MIN_PAIRS_SPARSE
    fit = max(int(device.l2_bytes * L2_SECTION_SHARE) // max(kv_bytes, 1), least)
    sections = -(-pairs // fit)
    return numpy.int32(min(-(-pairs // sections), pairs))


@functools.lru_cache(maxsize=None)
def bucket(headdim, headdim_v, buckets=tuple(FWD_TILES)):
    """The cheapest (headdim, headdim_v) bucket covering both head dims, or None."""
    covering = [b for b in buckets if b[0] >= headdim and b[1] >= headdim_v]
    return min(covering, key=lambda b: (b[0] + b[1], b), default=None)


# ---- TMA tensor maps ----

#: CUtensorMapDataType of each 16-bit dtype, and the other enums cuTensorMapEncodeTiled takes.
_TMA_FLOAT32 = 7
_TMA_DTYPE = {"float16": 6, "bfloat16": 9, "float8_e4m3fn": 0, "float32": _TMA_FLOAT32}  # 0: CU_TENSOR_MAP_DATA_TYPE_UINT8
_SWIZZLE_128B = 3
_L2_PROMOTION_128B = 2
_TMA_MAX_STRIDE = 1 << 40
#: Sm90Schedule: the work order flag, the (batch entry, head) pairs per L2 section and the device counter
#: of dynamically handed-out tiles.
SCHEDULE = numpy.dtype({"names": ["longest_first", "section", "next_work", "align_end"],
                        "formats": [numpy.int32, numpy.int32, numpy.uint64, numpy.int32], "offsets": [0, 4, 8, 16],
                        "itemsize": 24, "aligned": True})
#: The share of L2 a longest-first section's K and V may take. H100/H200 split L2 into two halves, and
#: a line another SM's half holds is fetched again: half of it is what every SM can hit. Measured on the
#: H200 (bench/NOTES.md, 2026-12-02): sections of 16-32 MB of K and V were the fastest at every seqlen.
L2_SECTION_SHARE = 0.5
#: Sections hold at least about this many (batch entry, head) pairs (l2_section evens them out), even
#: where their K and V pass the share of L2: with fewer, most CTAs walk few heads' keys at once. The
#: CTAs on one head walk its keys nearly in step, so the lines they use at once are far fewer than the
#: section's K and V. Measured on the H200 (bench/NOTES.md, 2026-12-02, fifth session): causal d256
#: s4096 (32 pairs of 4 MiB) 592 TF/s in sections of 7, 677 in sections of 16; d128 s4096 584 -> 601;
#: below 4 pairs 5-20% slower at seqlen 16k.
L2_SECTION_MIN_PAIRS = 16
#: The same for block masks, whose tiles read scattered key blocks rather than walking in step, so a
#: section's K and V are its working set: 25% of d128 s8192 (32 pairs of 4 MiB) lost 6% in sections
#: of 16 against 7.
L2_SECTION_MIN_PAIRS_SPARSE = 4
#: Sm90FwdMaps: the CUtensorMaps of q, k, v and out, and whether out's is set (the kernel parameter is
#: 64-byte aligned, which the driver arranges when it copies the bytes).
MAPS = numpy.dtype({"names": ["q", "k", "v", "o", "store_o", "block_table", "table_stride", "page_size", "box_rows",
                              "capacity", "v_box_rows"],
                    "formats": [(numpy.void, 128)] * 4 + [numpy.int32, numpy.uint64, numpy.int64] + [numpy.int32] * 4,
                    "offsets": [0, 128, 256, 384, 512, 520, 528, 536, 540, 544, 548], "itemsize": 576, "aligned": True})
#: Sm90BwdMaps: q, k, v, dout, the float32 dQ buffers, dk and dv, and whether dk's and dv's are set.
BWD_MAPS = numpy.dtype({"names": ["q", "k", "v", "dout", "dq_accum", "dk", "dv", "store_dkv"],
                        "formats": [(numpy.void, 128)] * 7 + [numpy.int32],
                        "offsets": [0, 128, 256, 384, 512, 640, 768, 896], "itemsize": 960, "aligned": True})


@functools.lru_cache(maxsize=None)
def _encode_tiled():
    driver = ctypes.CDLL("libcuda.so.1")
    encode = driver.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    encode.restype = ctypes.c_int
    return encode


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (no attributes: the kernels' cluster shape is compiled in)."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


@functools.lru_cache(maxsize=None)
def _max_active_clusters(function, threads, smem, ctas, sm_count):
    driver = ctypes.CDLL("libcuda.so.1")
    query = driver.cuOccupancyMaxActiveClusters
    query.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]
    query.restype = ctypes.c_int
    config = _LaunchConfig((ctas * (sm_count // ctas), 1, 1), (threads, 1, 1), smem, None, None, 0)
    count = ctypes.c_int(0)
    result = query(ctypes.byref(count), ctypes.c_void_p(function), ctypes.byref(config))
    return count.value if result == 0 and count.value >= 1 else sm_count // ctas


def max_active_clusters(function, threads, smem, ctas, device):
    """How many clusters of ``ctas`` CTAs of the driver function ``function`` (``threads`` threads and ``smem``
    bytes of dynamic shared memory each) the device runs at once: its SMs come in GPCs, and a cluster's CTAs
    share one, so that can be fewer than sm_count / ctas. Where the driver cannot tell, sm_count / ctas: a
    persistent grid of more clusters than fit is still right, its last clusters starting late."""
    return _max_active_clusters(function, threads, smem, ctas, device.sm_count)


def _views(x, varlen):
    """(dims, byte strides) of the 4-D view (headdim, rows, heads, batch) of a (batch, rows, heads, dim)
    tensor, or of a packed (rows, heads, dim) one as a batch of one."""
    if varlen:
        rows, heads, dim = x.shape
        row_stride, head_stride = x.strides[:2]
        batch, batch_stride = 1, 16  # one entry: its stride is never used, but must be a multiple of 16
    else:
        batch, rows, heads, dim = x.shape
        batch_stride, row_stride, head_stride = x.strides[:3]
    return (dim, rows, heads, batch), (row_stride, head_stride, batch_stride)


def tma_addressable(x, varlen):
    """Whether a TMA can read ``x`` (an array or a plan slot): 16-byte aligned base, and every stride of
    an axis longer than one a positive multiple of 16 bytes below 2^40 (so a contiguous 16-bit tensor
    needs headdim % 8 == 0)."""
    dims, strides = _views(x, varlen)
    if not _plan.aligned16(x):
        return False
    return all(n == 1 or (0 < s < _TMA_MAX_STRIDE and s % 16 == 0) for n, s in zip(dims[1:], strides))


def tensor_map(b, maps, field, x, varlen, box_rows):
    """``maps[field]`` (a struct of plan ``b``) becomes the 128-byte CUtensorMap of slot ``x`` with a box of
    128 bytes of columns (64 16-bit ones, 128 e4m3 ones) by ``box_rows`` rows, 128-byte swizzle,
    out-of-bounds elements read as zeros."""
    dims, strides = _views(x, varlen)
    b.tensor_map(maps, field, x, functools.partial(_encode, dtype_code=_TMA_DTYPE[x.dtype.name], dims=dims,
                                                   strides=strides, box=(128 // x.dtype.itemsize, box_rows, 1, 1)))


def accum_map(b, maps, field, dq_accum, p, dq_ld, box_rows):
    """``maps[field]`` becomes the CUtensorMap of the float32 dQ buffers (sm80.backward_buffers) as the 5-D
    view (dq_ld, rows, heads, batch, buffer), with a box of 32 columns (128 bytes) by ``box_rows`` rows,
    128-byte swizzle."""
    rows, batch = (p.total_q, 1) if p.varlen else (p.seqlen_q, p.batch)
    row_bytes = dq_ld * 4
    dims = (dq_ld, rows, p.heads, batch, dq_accum.shape[0])
    strides = (row_bytes, rows * row_bytes, p.heads * rows * row_bytes, dq_accum.strides[0])
    b.tensor_map(maps, field, dq_accum, functools.partial(_encode, dtype_code=_TMA_FLOAT32, dims=dims, strides=strides,
                                                          box=(32, box_rows, 1, 1, 1)))


def dq_map(b, maps, field, dq, p, box_rows):
    """``maps[field]`` becomes the CUtensorMap of dq itself (float32, the float32 backward's
    BwdArgs::dq_in_place) in accum_map's 5-D view (headdim, rows, heads, batch, one buffer), so the
    kernel's reductions take the same coordinates."""
    if p.varlen:  # (total_q, heads, headdim)
        dims, strides = (p.headdim, p.total_q, p.heads, 1, 1), (dq.strides[0], dq.strides[1], 16, 16)
    else:  # (batch, seqlen_q, heads, headdim)
        dims, strides = (p.headdim, p.seqlen_q, p.heads, p.batch, 1), (dq.strides[1], dq.strides[2], dq.strides[0], 16)
    b.tensor_map(maps, field, dq, functools.partial(_encode, dtype_code=_TMA_FLOAT32, dims=dims, strides=strides,
                                                     box=(32, box_rows, 1, 1, 1)))


def _encode(ptr, dtype_code, dims, strides, box):
    """cuTensorMapEncodeTiled of a tensor of extents ``dims`` (innermost first) and byte ``strides`` (of
    dims 1...); a dimension of extent 1 gets stride 16 (never used, but the driver checks it)."""
    rank = len(dims)
    strides = tuple(s if n > 1 else 16 for n, s in zip(dims[1:], strides))
    out = (ctypes.c_uint64 * 16)()
    result = _encode_tiled()(
        ctypes.addressof(out), dtype_code, rank, ptr, (ctypes.c_uint64 * rank)(*dims),
        (ctypes.c_uint64 * (rank - 1))(*strides), (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*[1] * rank),
        0, _SWIZZLE_128B, _L2_PROMOTION_128B, 0,
    )
    if result != 0:
        raise RuntimeError(f"cupyflash: cuTensorMapEncodeTiled failed with CUresult {result} for a tensor of extents "
                           f"{dims} and byte strides {strides}")
    return bytes(out)


def cxx_facts():
    """The family's constants, shared memory and extra kernel parameters as the kernels state them:
    (headers, {C++ expression: value}) for tests/test_compile.py (the driver copies each parameter's
    bytes to its offset, so the host buffers need no particular alignment)."""
    facts = {"sizeof(cupyflash::Sm90FwdMaps)": MAPS.itemsize, "sizeof(cupyflash::Sm90Schedule)": SCHEDULE.itemsize,
             "alignof(cupyflash::Sm90Schedule)": SCHEDULE.alignment, "sizeof(cupyflash::Sm90BwdMaps)": BWD_MAPS.itemsize}
    for v in FWD.variants():
        traits = f"cupyflash::Sm90FwdTraits<__half, {', '.join(map(str, v.tile))}>"
        facts.update({f"{traits}::kSmemBytes": fwd_smem_bytes(v), f"{traits}::kThreads": fwd_threads(v),
                      f"{traits}::kBlockM": v.param("block_m"), f"(int){traits}::kStoreO": int(fwd_stores_o(v))})
    for v in FWD_PLANES.variants():
        traits = f"cupyflash::Sm90FwdPlanesTraits<{', '.join(map(str, v.tile))}, {str(v.param('tf32')).lower()}>"
        facts.update({f"{traits}::kSmemBytes": fwd_planes_smem_bytes(v), f"{traits}::kThreads": 384,
                      f"{traits}::kBlockM": FWD_PLANES_BLOCK_M})
    for kernel, op in ((FWD_FP8, "E4m3Operands"), (FWD_TF32, "Tf32Operands")):
        for v in kernel.variants():
            traits = f"cupyflash::Sm90FwdKMajorTraits<cupyflash::{op}, {', '.join(map(str, v.tile))}>"
            facts.update({f"{traits}::kSmemBytes": fwd_kmajor_smem_bytes(v), f"{traits}::kThreads": kmajor_threads(v),
                          f"{traits}::kBlockM": kmajor_block_m(v)})
    for v in BWD.variants():
        traits = f"cupyflash::Sm90BwdTraits<__half, {', '.join(map(str, v.tile))}>"
        facts.update({f"{traits}::kSmemBytes": bwd_smem_bytes(v), f"{traits}::kThreads": BWD_THREADS,
                      f"{traits}::kBlockN": bwd_block_n(v), f"(int){traits}::kSplitCols": int(bwd_split_cols(v))})
    for v in BWD_PLANES.variants():
        traits = f"cupyflash::Sm90BwdPlanesTraits<{', '.join(map(str, v.tile))}, {str(v.param('tf32')).lower()}>"
        facts.update({f"{traits}::kSmemBytes": bwd_planes_smem_bytes(v), f"{traits}::kThreads": BWD_THREADS,
                      f"{traits}::kBlockN": BWD_PLANES_BLOCK, f"{traits}::kBlockM": BWD_PLANES_BLOCK})
    return ("sm90/fwd.cu", "sm90/fwd_planes.cu", "sm90/fwd_kmajor.cu", "sm90/bwd.cu", "sm90/bwd_planes.cu"), facts


class Sm90Forward:
    """float16/bfloat16 on compute capability 9.0, head dims up to 256, inputs a TMA can address (other
    inputs take the sm80 family); float32 up to head dim 128, any layout (its bfloat16 planes are the
    kernel's operands)."""

    name = "sm90"
    kernels = (FWD, FWD_PAIRS, sm80.PLANES, FWD_PLANES, FP8_VALUES, FWD_FP8, TF32_VALUES, TF32_ROWS, FWD_TF32)
    user_functions = True
    paged_keys = True  # 16-bit problems with a block table (a KV cache's prefill): paged_box_rows

    def select(self, p, device, operands):
        if device.capability != CAPABILITY:
            return None
        if p.dtype == _fp8.E4M3:
            return self._select_fp8(p, device, operands)
        max_score = p.max_score is not None
        user = common.user_code(p, fast=p.dtype.itemsize == 2)
        if p.dtype == numpy.float32:
            if p.dropout or p.block_table is not None:  # (the float32 kernels have neither yet)
                return None
            # The tf32 kernel rounds q, k and v to tf32 and sums in its own order: the backward (the planes
            # kernel's) could not recompute its scores, whose differences exp(s - lse) magnifies at large
            # logits (scores near 1000: gradients 15x past the rule), so it runs only for calls whose lse
            # stays inside (no backward can follow).
            if (p.precision == "tf32" and not p.lse_returned
                    and not kmajor_missing(p, device.capability, operands)):
                variant = self._select_kmajor(FWD_TF32, FWD_TF32_TILES, "float32", p, device)
                if variant is not None:
                    return variant
            dim = sm80.headdim_bucket(p.headdim, p.headdim_v, tuple(FWD_PLANES_TILES))
            if dim is None:
                return None
            variant = FWD_PLANES.variant("float32", (dim, *FWD_PLANES_TILES[dim][0]), score_mod=p.score_mod,
                                         tf32=p.precision == "tf32", max_score=max_score, user=user)
            return variant if fwd_planes_smem_bytes(variant) <= device.smem_optin else None
        if p.dtype.itemsize != 2:
            return None
        dims = bucket(p.headdim, p.headdim_v)
        # (Paged keys: k and v are page pools, 4-D whether or not the queries are packed.)
        packed = (p.varlen, p.varlen and p.block_table is None, p.varlen and p.block_table is None)
        if dims is None or not all(tma_addressable(x, varlen) for x, varlen in zip(operands, packed)):
            return None
        # The plain kernels fold softmax_scale into the exponent after the row maximum, which needs a
        # positive scale; the score_mod kernels scale first, as do those built with a score_mod function.
        score_mod = p.score_mod or (p.softmax_scale <= 0 and p.user_score is None)
        tiles = FWD_TILES[dims]
        tile = tiles[0]
        # A block mask's query blocks (128 rows or multiples of 128, as a rule) would straddle 192-row
        # tiles, each of which would then take the element mask: such masks keep the 128-row tile. So does
        # dropout: the 192-row tile's consumers (160 registers) spilled around the generator (100 local
        # accesses against 40), and so do score and mask functions (150-250 against 40; none at 128 rows),
        # and the maximum score (its two registers a thread, unmeasured there).
        if (p.dropout or user is not None or max_score
                or p.block_mask is not None and p.block_mask.block_size[0] % tile[0] != 0):
            tile = tiles[-1]
        if p.block_table is not None and paged_box_rows(p.page_size, tile[1]) is None:
            return None
        if (p.block_table is not None and dims in FWD_PAIRS_DIMS and tile == tiles[0]
                and paged_box_rows(p.page_size, tile[1]) <= FWD_PAIRS_MAX_BOX_ROWS and not score_mod
                and not p.dropout and user is None and not max_score and p.block_mask is None
                and (p.heads // p.heads_k) % 2 == 0):
            variant = FWD_PAIRS.variant(common.dtype_name(p.dtype), (*dims, *tile))
        else:
            variant = FWD.variant(common.dtype_name(p.dtype), (*dims, *tile), score_mod=score_mod, dropout=p.dropout,
                                  max_score=max_score, user=user)
        return variant if fwd_smem_bytes(variant) <= device.smem_optin else None

    def _select_fp8(self, p, device, operands):
        """The FP8 forward for the problems :func:`kmajor_missing` finds nothing missing in (the checks refuse
        the others, cupyflash/_problem.py's check_fp8_on_the_gpu)."""
        if kmajor_missing(p, device.capability, operands):
            return None
        return self._select_kmajor(FWD_FP8, FWD_FP8_TILES, common.dtype_name(p.output_dtype), p, device)

    @staticmethod
    def _select_kmajor(kernel, tiles, dtype, p, device):
        """The variant of a K-major forward (FWD_FP8 or FWD_TF32) for its bucket of p's head dims, if any."""
        dims = bucket(p.headdim, p.headdim_v, tuple(tiles))
        if dims is None:
            return None
        variant = kernel.variant(dtype, (*dims, *tiles[dims]), max_score=p.max_score is not None)
        return variant if fwd_kmajor_smem_bytes(variant) <= device.smem_optin else None

    def plan(self, b, variant, p, q, k, v, device):
        if variant.kernel is FWD_PLANES:
            return self._plan_planes(b, variant, p, q, k, v, device)
        if variant.kernel is FWD_FP8 or variant.kernel is FWD_TF32:
            return self._plan_kmajor(b, variant, p, q, k, v, device)
        block_m, block_n = variant.param("block_m"), variant.param("block_n")
        out, lse = b.output(p.out_shape, p.dtype), b.output(p.lse_shape, numpy.float32)
        lists = common.sparse_lists(b, p, block_m, block_n)
        args = common.fwd_args(b, p, q, k, v, out, lse, lists)
        maps = b.struct(MAPS)
        key_rows = block_n
        if p.block_table is not None:
            # Paged keys: k and v are page pools, read in boxes of key_rows rows from their pages.
            key_rows = paged_box_rows(p.page_size, block_n)
            maps["block_table"] = _params.pointer(p.block_table)
            maps["table_stride"] = p.block_table.strides[0] // 4  # (int32)
            maps["page_size"], maps["box_rows"] = p.page_size, key_rows
            maps["capacity"] = p.block_table.shape[1] * p.page_size
        pools = p.block_table is not None
        for field, x, rows in (("q", q, block_m), ("k", k, key_rows), ("v", v, key_rows)):
            if not (field == "v" and pools and paged_values_map(b, maps, v, key_rows, variant.param("headdim_v"))):
                tensor_map(b, maps, field, x, p.varlen and not (pools and field != "q"), rows)
        # The staged epilogue stores a consumer warpgroup's 64 rows per box (out is C-contiguous: a TMA
        # addresses it when headdim_v * 2 bytes is a multiple of 16).
        if fwd_stores_o(variant) and tma_addressable(out, p.varlen):
            tensor_map(b, maps, "o", out, p.varlen, 64)
            maps["store_o"] = 1
        # Persistent: one CTA per SM walks the work tiles (fewer CTAs when there are fewer tiles). Tiles
        # of unequal length (a mask, packed sequences, KV caches) go longest first, to whichever CTA is free,
        # through a counter each launch leaves zero (Sm90QueryTileScheduler::next), a section of heads whose
        # K and V fit L2 at a time.
        # Paired: a work tile is a cluster's, the same rows of two query heads; the grid is of whole
        # clusters, as many as fit at once (two SMs of one GPC each).
        ctas = 2 if variant.kernel is FWD_PAIRS else 1
        work = common.cdiv(p.seqlen_q, block_m) * p.batch * p.heads // ctas
        schedule = self._schedule(b, p, device, ctas)
        smem = fwd_smem_bytes(variant)
        function = common.function(variant, smem)
        ctas_that_fit = device.sm_count if ctas == 1 else ctas * min(
            device.sm_count // ctas, max_active_clusters(function, fwd_threads(variant), smem, ctas, device))
        b.launch(function, (min(ctas * work, ctas_that_fit), 1, 1), fwd_threads(variant), (args, maps, schedule), smem)
        return out, lse


    @staticmethod
    def _schedule(b, p, device, ctas=1):
        """The Sm90Schedule of a forward plan (``ctas``: CTAs of a cluster, which take ``ctas`` heads a work
        tile, so a section holds 1 / ctas as many work tile heads)."""
        schedule = b.struct(SCHEDULE)
        # Query tiles end at each sequence's last row (a partial tile is the first, the shortest causal
        # walk), except under a block mask, whose lists are per query block from row 0, and with dropout,
        # whose generator calls serve rows r and r + 8 of 16-row blocks from row 0 (fragment/dropout.cuh).
        schedule["align_end"] = int(p.block_mask is None and not p.dropout)
        if (p.varlen or p.seqused_k is not None or p.block_mask is not None or p.window_left >= 0
                or p.window_right >= 0):
            schedule["longest_first"] = 1
            schedule["section"] = max(1, l2_section(p, device) // ctas)
            schedule["next_work"] = b.counters(1).data.ptr
        return schedule

    def _plan_kmajor(self, b, variant, p, q, k, v, device):
        """A K-major forward: v as V^T (the pre-pass; for tf32 also q and k rounded, into copies), then the
        forward over q, k (or their copies) and V^T; out in the variant's dtype."""
        block_m, block_n = kmajor_block_m(variant), variant.param("block_n")
        tf32 = variant.kernel is FWD_TF32
        out, lse = b.output(p.out_shape, p.output_dtype), b.output(p.lse_shape, lse_dtype(p.dtype))
        step = 8 if tf32 else 32  # keys per k-step: V^T's rows are whole k-steps
        keys = common.cdiv(p.seqlen_k, step) * step
        vt = b.workspace((p.batch, p.heads_k, p.headdim_v, keys), numpy.float32 if tf32 else numpy.uint8)
        pre = b.struct(_params.TRANSPOSE_VALUES_ARGS)
        pre[0] = (_params.tensor(v), _params.pointer(vt), p.batch, p.seqlen_k, p.heads_k, p.headdim_v, keys)
        chunks = p.batch * p.heads_k * (keys // (4 if tf32 else 16)) * p.headdim_v  # 16 bytes a thread
        b.launch(common.function((TF32_VALUES if tf32 else FP8_VALUES).variant()), (_prepass_blocks(chunks), 1, 1),
                 PREPASS_THREADS, (pre,))
        if tf32:
            q, k = (self._round_rows(b, x) for x in (q, k))
        lists = common.sparse_lists(b, p, block_m, block_n)
        args = common.fwd_args(b, p, q, k, v, out, lse, lists)
        maps = b.struct(MAPS)
        for field, x, rows in (("q", q, block_m), ("k", k, block_n)):
            tensor_map(b, maps, field, x, False, rows)
        # V^T's 4-D view (keys, headdim_v, heads_k, batch): a box of one atom's keys (128 bytes) by the
        # bucket's rows.
        size = vt.dtype.itemsize
        dims = (keys, p.headdim_v, p.heads_k, p.batch)
        strides = tuple(size * x for x in (keys, p.headdim_v * keys, p.heads_k * p.headdim_v * keys))
        code = _TMA_FLOAT32 if tf32 else _TMA_DTYPE["float8_e4m3fn"]  # (V^T's e4m3 bytes: a uint8 workspace)
        b.tensor_map(maps, "v", vt, functools.partial(_encode, dtype_code=code, dims=dims, strides=strides,
                                                      box=(128 // size, variant.param("headdim_v"), 1, 1)))
        work = common.cdiv(p.seqlen_q, block_m) * p.batch * p.heads
        schedule = self._schedule(b, p, device)
        smem = fwd_kmajor_smem_bytes(variant)
        b.launch(common.function(variant, smem), (min(work, device.sm_count), 1, 1), kmajor_threads(variant),
                 (args, maps, schedule), smem)
        return out, lse

    @staticmethod
    def _round_rows(b, x):
        """A contiguous copy of q or k (plan slot ``x``, (batch, rows, heads, dim)) rounded to tf32, its head
        dim padded to 4 with zeros (the pre-pass tf32_round_rows), as a workspace slot."""
        batch, rows, heads, dim = x.shape
        dim_out = common.cdiv(dim, 4) * 4
        copy = b.workspace((batch, rows, heads, dim_out), numpy.float32)
        args = b.struct(_params.ROUND_ROWS_ARGS)
        args[0] = (_params.tensor(x), _params.pointer(copy), batch, rows, heads, dim, dim_out)
        b.launch(common.function(TF32_ROWS.variant()), (_prepass_blocks(batch * rows * heads * (dim_out // 4)), 1, 1),
                 PREPASS_THREADS, (args,))
        return copy

    def _plan_planes(self, b, variant, p, q, k, v, device):
        """float32: k and v split into bfloat16 planes (sm80.plan_planes), then the forward over them and q
        (whose planes the kernel's consumers split)."""
        block_n = variant.param("block_n")
        out, lse = b.output(p.out_shape, p.dtype), b.output(p.lse_shape, lse_dtype(p.dtype))
        tf32 = variant.param("tf32")
        k, v = (sm80.plan_planes(b, p, x, p.heads_k, tf32) for x in (k, v))
        lists = common.sparse_lists(b, p, FWD_PLANES_BLOCK_M, block_n)
        args = common.fwd_args(b, p, q, k, v, out, lse, lists)
        maps = b.struct(MAPS)
        for field, x in (("k", k), ("v", v)):
            tensor_map(b, maps, field, x, p.varlen, block_n)
        work = common.cdiv(p.seqlen_q, FWD_PLANES_BLOCK_M) * p.batch * p.heads
        schedule = self._schedule(b, p, device)
        smem = fwd_planes_smem_bytes(variant)
        b.launch(common.function(variant, smem), (min(work, device.sm_count), 1, 1), 128 * (1 + FWD_PLANES_BLOCK_M // 64),
                 (args, maps, schedule), smem)
        return out, lse


def bwd_tile_group(p, key_tiles, deterministic, sm_count, grouped):
    """BwdArgs::tile_group (common/scheduler.cuh): under a causal mask (``grouped``: an unbounded left
    window and a bounded right one, no block mask, 128-key CTAs), where a key tile's walk shrinks with
    its index, the pairs of about one wave of CTAs (one per SM) take their key tiles in turn, so that
    the longest walks start first; 1 (tiles fastest) otherwise, under the ordered sum, which has its own
    launch orders, and for 64-key CTAs (split columns), which gained nothing from it (bench/NOTES.md,
    session 16: +2-6% at head dims 64 and 128, causal 1024-8192; -4% to +2% at head dim 256)."""
    if deterministic or not grouped:
        return 1
    return max(1, sm_count // key_tiles)


def bwd_key_order(b, p, args, key_tiles, deterministic):
    """Under a block mask, BwdArgs::walk_ranges (each walk's range in the mask's lists, which the backward's
    producers read in place of searching the lists) and, but in the deterministic mode (whose ordered sum
    has its own launch order), BwdArgs::key_order: each (batch entry, kv head) pair's key tiles longest
    walk first, where their walks fit the kernel's shared memory (KEY_ORDER_MAX_TILES); by a CTA per pair
    (kernels_cu/sm90/bwd_key_order.cu) before the backward. Returns whether it set key_order."""
    if p.block_mask is None:
        return False
    pairs = p.batch * p.heads_k
    args["walk_ranges"] = _params.pointer(b.workspace((pairs, key_tiles, p.heads // p.heads_k, 2), numpy.int32))
    ordered = not deterministic and key_tiles <= KEY_ORDER_MAX_TILES
    smem = 0
    if ordered:
        args["key_order"] = _params.pointer(b.workspace((pairs, key_tiles), numpy.int32))
        # Shared memory for the walks rounded up to 16 bytes: the rank loop's unrolled reads are 16-byte
        # loads, and its remainder reads a whole 16 bytes for the last 1-3 walks (compute-sanitizer's
        # memcheck found them past a 4 * key_tiles allocation, session 46).
        smem = 16 * common.cdiv(key_tiles, 4)
    b.launch(common.function(BWD_KEY_ORDER.variant()), (pairs, 1, 1), KEY_ORDER_THREADS, (args,), smem)
    return ordered


def bwd_tail_pairs(p, key_tiles, deterministic, sm_count, tailed):
    """BwdArgs::tail_pairs (common/scheduler.cuh): for 64-key CTAs under a causal mask, and under a block
    mask with its key_order (``tailed``), the pairs of about the last two waves of CTAs take their key
    tiles in turn after the others' tiles fastest, so the grid ends on its shortest walks (the SMs idled
    5% of a causal 1k or 4k backward at its end, bench/NOTES.md, session 17; a document mask's longest
    walks started in the last wave, session 45); 0 otherwise."""
    if deterministic or not tailed:
        return 0
    return min(p.batch * p.heads_k, common.cdiv(2 * sm_count, key_tiles))


class Sm90Backward:
    """float16/bfloat16 on compute capability 9.0, head dims up to 256 (BWD_TILES), inputs a TMA can
    address; float32 up to head dim 128, any layout (its bfloat16 planes are the kernel's operands).

    The argument setup, delta, the float32 dQ buffers, the ordered sum of the deterministic mode and
    the dQ conversion are the sm80 family's (float32 but deterministic: dQ added into dq itself, no
    buffers nor conversion); only the main kernel differs.
    """

    name = "sm90"
    kernels = (common.DELTA, sm80.PLANES, BWD_KEY_ORDER, BWD, BWD_PLANES, common.DQ_CONVERT)
    # A score_mod whose buffers take gradients only where it is additive, on 16-bit inputs at
    # BWD_SCATTER_DIMS (the sm80 or general kernels add the others').
    user_functions = True

    def select(self, p, device, operands):
        if device.capability != CAPABILITY:
            return None
        user = common.user_code(p, fast=p.dtype.itemsize == 2)
        scatter = p.user_score is not None and p.user_score.buffer_gradients
        if scatter and not (p.user_score.additive and p.dtype.itemsize == 2):
            return None
        if p.dtype == numpy.float32:
            if p.dropout:  # the float32 kernel has no dropout yet: the general family's
                return None
            dim = sm80.headdim_bucket(p.headdim, p.headdim_v, tuple(BWD_PLANES_STAGES))
            if dim is None:
                return None
            variant = BWD_PLANES.variant("float32", (dim, BWD_PLANES_STAGES[dim]), score_mod=p.score_mod,
                                         tf32=p.precision == "tf32", user=user)
            return variant if bwd_planes_smem_bytes(variant) <= device.smem_optin else None
        if p.dtype.itemsize != 2:
            return None
        dims = bucket(p.headdim, p.headdim_v, tuple(BWD_TILES))
        if dims is None or not all(tma_addressable(x, p.varlen) for x in operands):
            return None
        if p.dropout and max(dims) > BWD_DROPOUT_MAX_HEADDIM:  # the split-column roles draw no dropout
            return None
        if scatter and dims not in BWD_SCATTER_DIMS:
            return None
        variant = BWD.variant(common.dtype_name(p.dtype), (*dims, *BWD_TILES[dims]), score_mod=p.score_mod,
                              dropout=p.dropout, user=user)
        return variant if bwd_smem_bytes(variant) <= device.smem_optin else None

    def plan(self, b, variant, p, dout, q, k, v, out, lse, deterministic, device):
        planes = variant.kernel is BWD_PLANES
        if planes:
            # 64 keys per CTA, consumers in roles: the 16-bit kernel's split columns.
            block_m = block_n = BWD_PLANES_BLOCK
            split_cols, smem = True, bwd_planes_smem_bytes(variant)
        else:
            block_m, block_n = variant.param("block_m"), bwd_block_n(variant)
            split_cols, smem = bwd_split_cols(variant), bwd_smem_bytes(variant)
        key_tiles = common.cdiv(p.seqlen_k, block_n)
        # The ordered sum by walk order (rotated walks, common/ordered_sum.cuh) is for problems where every
        # key tile visits every query tile: no causal mask, window or block mask. It needs the CTAs of a
        # (batch entry, kv head), one per SM, to run at once, and its turns take query tiles x key tiles
        # in 31 bits. Masked walks are staggered already and keep the launch order, last key tile first:
        # launched first-first they lost 19-37% at causal 4k-16k (bench/NOTES.md, session 14).
        by_walk = (key_tiles <= device.sm_count and common.cdiv(p.seqlen_q, block_m) * key_tiles < 2**31
                   and p.block_mask is None and p.window_left < 0 and p.window_right < 0)
        order = sm80.ORDERED_BY_WALK if by_walk else sm80.ORDERED_BY_LAUNCH
        # The TMA reductions need 16-byte rows in the dQ buffers. float32's go straight into dq (its rows
        # are headdim floats: 16-byte ones where headdim is a multiple of 4), saving the buffers' zeroing
        # and the conversion pass (~95 us of a 5.2 ms call at 1k keys, bench/NOTES.md, session 35).
        in_place = planes and not deterministic and p.headdim % 4 == 0
        args, grads, dq_accum = sm80.backward_buffers(b, p, dout, q, k, v, out, lse, block_m, block_n,
                                                      deterministic, dq_align=4, order=order,
                                                      splits=DETERMINISTIC_DQ_SPLITS_SPLIT_COLS_BY_WALK
                                                      if by_walk and split_cols else DETERMINISTIC_DQ_SPLITS,
                                                      in_place=in_place)
        if not planes and not deterministic and not p.varlen:
            # The first share of each query tile is stored, not added, so bwd_delta zeroes a pair of
            # claim counters per tile instead of the buffers (BwdArgs::dq_claims, common/ordered_sum.cuh).
            # Packed sequences share their boundary tiles' rows, whose claims would be two.
            assert block_m % common.ROW_RUN == 0, "a conversion run lies in one claim tile"
            claims = b.workspace((2 * p.batch * p.heads * common.cdiv(p.seqlen_q, block_m),), numpy.int32)
            args["dq_claims"] = _params.pointer(claims)
            args["dq_claim_rows"] = block_m
        causal_walks = p.window_left < 0 <= p.window_right and p.block_mask is None
        ordered = bwd_key_order(b, p, args, key_tiles, deterministic)
        args["tile_group"] = bwd_tile_group(p, key_tiles, deterministic, device.sm_count, causal_walks and not split_cols)
        args["tail_pairs"] = bwd_tail_pairs(p, key_tiles, deterministic, device.sm_count,
                                            causal_walks and split_cols or ordered)
        common.plan_delta(b, p, args)
        maps = b.struct(BWD_MAPS)
        if planes:
            # q and dout as planes (their tiles are read once per key tile); the kernel's consumers split k
            # and v, which each CTA reads once (Sm90BwdPlanesMainloop::split_keys): no maps for them.
            tf32 = variant.param("tf32")
            q, dout = (sm80.plan_planes(b, p, x, p.heads, tf32) for x in (q, dout))
            operands = (("q", q, block_m), ("dout", dout, block_m))
        else:
            operands = (("q", q, block_m), ("k", k, block_n), ("v", v, block_n), ("dout", dout, block_m))
        for field, x, rows in operands:
            tensor_map(b, maps, field, x, p.varlen, rows)
        # The 128-key CTAs store dK and dV through shared memory, a tile per TMA store
        # (Sm90BwdEpilogue::store_staged), where a TMA addresses them.
        dk, dv = grads[1:]
        if not split_cols and tma_addressable(dk, p.varlen) and tma_addressable(dv, p.varlen):
            tensor_map(b, maps, "dk", dk, p.varlen, block_n)
            tensor_map(b, maps, "dv", dv, p.varlen, block_n)
            maps["store_dkv"] = 1
        if in_place:
            dq_map(b, maps, "dq_accum", grads[0], p, block_m)
        else:
            accum_map(b, maps, "dq_accum", dq_accum, p, int(args["dq_ld"][0]), block_m)
        grid = (key_tiles * p.batch * p.heads_k, 1, 1)
        b.launch(common.function(variant, smem), grid, BWD_THREADS, (args, maps), smem)
        if not in_place:
            common.plan_dq_convert(b, p, args)
        return grads


FORWARD = Sm90Forward()
BACKWARD = Sm90Backward()
