"""The randomized differential test (issue 19): seeded random problems against the float64 oracle with
the tolerance rule of helpers.py, over the whole public API (dense, packed and KV-cache attention,
forward and both backward modes), more widely than the fixed cases of the feature tests do.

Each case is one seed. :func:`problem` turns it into a :class:`Problem`, a plain printable
description: the kind (dense, varlen or kvcache), dtype, sizes (odd ones, GQA/MQA, seqlen_q !=
seqlen_k, headdim_v != headdim), the mask and score options (causal, windows of every form, softcap,
ALiBi, block masks), softmax_scale, the backward mode, the input scale, the memory layout of the
inputs and, for KV caches, the cache (dense or paged), its lengths, new tokens and rotary embedding;
on the GPU also the kernel family to force (``CUPYFLASH_FAMILY``). :func:`run` draws fresh random
inputs from the seed, calls the public functions and judges every result (out, lse, dq, dk, dv; out,
lse and the caches' new contents) against the oracle. ``test_cpu`` runs CPU_CASES problems on the
NumPy path everywhere; ``test_gpu`` runs GPU_CASES larger ones on CuPy arrays over every kernel
family, and is skipped without a GPU.

Not generated, because the API refuses them: block masks with packed batches (TypeError) or KV
caches (no such argument), a block mask with an empty sequence (a mask needs seqlen_q and seqlen_k
of at least 1), rotary embedding without new keys, cache_batch_idx with a paged cache, more keys than
a cache holds, rotary tables shorter than the cache. Left out by choice: head dims above 256 (where
the tensor-core kernels stop; the general kernels are covered up to 256), and sizes whose host-side
oracle would be slow (the float64 oracle of float16/bfloat16/float32 inputs, the np.longdouble one of
float64 inputs, see Limits.budget).

Replaying a case
----------------
A failure's message starts with the seed and the problem. Run that seed alone with::

    CUPYFLASH_RANDOM_SEED=17 python -m pytest tests/test_random.py::test_cpu

(a comma-separated list runs several; without ``::test_cpu`` the GPU problem of the seed runs too), or
by node id with the default seeds: ``python -m pytest "tests/test_random.py::test_cpu[cpu-dense-17]"``
(ids are ``<cpu|gpu>-<kind>-<seed>``). A problem printed by a failure can also be pasted:
``run(numpy, Problem(seed=17, ...))``.

Exploratory runs
----------------
The seeds are DEFAULT_BASE, DEFAULT_BASE + 1, ... so every run checks the same set.
``CUPYFLASH_RANDOM_BASE=<int>`` starts them elsewhere, and ``CUPYFLASH_RANDOM_BASE=fresh`` at a new
random base each run (a failure still prints its seed; with pytest-xdist give an int, since every
worker must collect the same seeds). The rule compares maxima of errors, and
their ratio has a tail: about one float32 case in 300 with head dims of 1 to 3 (each gradient entry
then a lone sum with cancellation) exceeds the bound, by less than 1.5 times (NumPy path, 300 such
problems per head dim); MIN_ROWS keeps the same tail away from problems of one or two query rows.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
from typing import NamedTuple

import numpy as np
import pytest
from helpers import (
    DTYPES,
    GRAD_FACTOR,
    OUTPUT_FACTOR,
    assert_within_rule,
    gpu_available,
    oracle,
    packed_offsets,
    plain,
    random_layout,
    random_normal,
    random_qkv,
    seed_from,
    to_host,
    use_family,
)

import cupyflash
from cupyflash import reference

if gpu_available():
    import cupy
else:
    cupy = None

#: Cases of each part, and the first seed of the fixed set.
CPU_CASES = 300
GPU_CASES = 400
DEFAULT_BASE = 0

#: Seeds of the fixed set that fail for a known reason: kept, as expected failures (strict where seen: a
#: fix makes them pass, and the test then says so). float64 gradients recompute every probability from
#: the float64 lse, whose rounding (half an ulp of |lse|) puts |lse| * 2^-53 into each of them: past
#: |lse| ~ 10 that is several times the error of a plain float64 softmax. A lse carried in more than
#: float64 precision would remove it (bench/NOTES.md).
FLOAT64_LSE = "float64 backward: probabilities recomputed from a float64 lse lose |lse| * 2^-53"
#: One more where the rule compares rounding with rounding. Seed 304: one key per row, so every dk is
#: exactly 0 and both errors are the rounding of dP - delta (2e-14 against 5e-15). (Seed 147, float32 lse
#: 2.2x the plain one's from 200-term dot products summed in order, passes since the general kernels
#: sum scores with compensation: kernels_cu/general/tile.cuh.)
EXACT_ZERO = "float64 dk exactly 0 (one key per row): the rule compares two roundings of dP - delta"
#: Seed 355 (general kernels, float32, a 6 x 19 causal window, inputs scaled by 7.7): dq 2.7x the plain
#: error before the general kernels' scores were summed with compensation, 3.1x after (the rule allows
#: 3x), with out and lse within 0.6 of theirs: the scores' last bits move the roundings of dS = P (dP -
#: delta) that dq sums (bench/NOTES.md, session 19). Not strict: on an H100 (2026-12-06) the same kernels'
#: dq came within the 3x: the plain float32 reference runs in NumPy on the host, whose BLAS rounds by
#: the host's processor (as seed 7's below), and the case sits at 1.03 of the allowance.
FLOAT32_DQ = "float32 dq of the general backward at 3.1x the plain error: the rule compares rounding with rounding"
#: The CPU ones are not strict either: seed 7 failed in every CI run up to 2026-12-02's fourth session
#: and passes in the fifth's environment (NumPy 2.4.6, OpenBLAS 0.3.31) on the same code: its margin is
#: within how the BLAS rounds the plain float64 reference.
KNOWN_FAILURES = {("cpu", 7): (FLOAT64_LSE, False), ("cpu", 78): (FLOAT64_LSE, False), ("cpu", 157): (FLOAT64_LSE, False),
                  ("gpu", 7): (FLOAT64_LSE, False), ("gpu", 157): (FLOAT64_LSE, False), ("gpu", 321): (FLOAT64_LSE, False),
                  ("gpu", 304): (EXACT_ZERO, True), ("gpu", 355): (FLOAT32_DQ, False)}

# --------------------------------------------------------------------------------------- problems


class RandomBlocks(NamedTuple):
    """A random block layout of shape (lead[0], lead[1], ceil(seqlen_q / block_q), ceil(seqlen_k / block_k)),
    with ``density`` of its blocks set (and every query-block row one, helpers.random_layout), then,
    with ``empty_row``, one query-block row cleared: its queries see no key."""

    lead: tuple  # (1 or batch, 1 or heads)
    block: tuple  # (block_q, block_k)
    density: float
    empty_row: bool


class Longformer(NamedTuple):
    """``cupyflash.BlockMask.longformer``: a window of blocks plus global blocks, built on the host."""

    block: tuple
    window_blocks: int
    global_blocks: int


class BigBird(NamedTuple):
    """``cupyflash.BlockMask.bigbird``: Longformer plus random blocks per head, built on the host."""

    block: tuple
    window_blocks: int
    global_blocks: int
    random_blocks: int
    heads: int  # 1 (one layout for every head) or the problem's heads


@dataclasses.dataclass(frozen=True)
class Problem:
    """One random problem; printed, it shows the fields that differ from these defaults.

    Sizes follow :func:`cupyflash.flash_attention`'s names. ``kind`` picks the API: "dense"
    (seqlen_q, seqlen_k), "varlen" (lengths_q, lengths_k of the packed sequences) or "kvcache"
    (seqlen_q queries per entry, a cache of ``capacity`` keys per entry).
    """

    seed: int
    kind: str
    dtype: str
    batch: int
    heads: int
    heads_k: int
    headdim: int
    headdim_v: int
    family: str = ""  # CUPYFLASH_FAMILY of a GPU run ("" on the CPU)
    seqlen_q: int = 0
    seqlen_k: int = 0
    lengths_q: tuple = ()
    lengths_k: tuple = ()
    max_seqlen: tuple | None = None  # varlen: (max_seqlen_q, max_seqlen_k) passed, or None
    causal: bool = False
    window_size: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = ""  # "": none; "heads": slopes of shape (heads,); "batch": (batch, heads)
    block_mask: object = None  # RandomBlocks, Longformer or BigBird
    softmax_scale: float | None = None
    deterministic: bool = False
    scale: float = 1.0  # standard deviation of the inputs (dout has 1)
    layout: str = "contiguous"  # memory of the floating inputs, see _view
    page_size: int = 0  # kvcache: 0 for a dense cache
    capacity: int = 0
    cache_seqlens: tuple = ()  # kvcache: keys already in each entry's cache
    seqlens_form: str = "array"  # how cache_seqlens is passed: "array" (int32), "int" or "none" (full)
    batch_idx: bool = False  # kvcache, dense: a cache of batch + 2 entries mapped by cache_batch_idx
    seqlen_new: int = 0  # kvcache: new keys and values appended (0: none)
    rotary_dim: int = 0
    rotary_interleaved: bool = True
    num_splits: int = 0
    sinks: bool = False  # CPU part: attention sinks (random logits, one of them -inf now and then)
    dropout_p: float = 0.0  # CPU part, dense and varlen: dropout, seeded by the problem's seed

    def __str__(self):
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                   if f.default is dataclasses.MISSING or getattr(self, f.name) != f.default]
        return f"Problem({', '.join(changed)})"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Where a part draws its problems: sizes small enough for its oracle, which runs on the host."""

    max_seqlen: int
    edges: tuple  # tile edges the lengths land next to
    headdims: tuple
    tc_headdims: tuple  # float16/bfloat16 head dims for the tensor-core families
    max_batch: int
    max_heads_k: int
    max_group: int
    max_capacity: int
    max_chunk: int  # kvcache queries per entry beyond decoding's 1
    page_sizes: tuple
    budget: float  # about the most batch * heads * seqlen_q * seqlen_k * (headdim + headdim_v) of a case


#: Head dims the tensor-core kernels cannot read with vector loads (an odd row takes a fallback path).
ODD_HEADDIMS = (3, 59, 111)

CPU = Limits(max_seqlen=200, edges=(64, 128, 192), headdims=(1, 3, 8, 16, 24, 32, 40, 48, 59, 64, 72, 80, 96, 111, 128),
             tc_headdims=(), max_batch=3, max_heads_k=3, max_group=3, max_capacity=120, max_chunk=20,
             page_sizes=(1, 3, 4, 7, 16, 32), budget=6e6)
GPU = Limits(max_seqlen=600, edges=(64, 128, 192, 256, 512),
             headdims=(1, 3, 16, 24, 40, 59, 64, 96, 111, 128, 200, 256),
             tc_headdims=(32, 40, 64, 72, 80, 96, 128, 160, 192, 200, 256), max_batch=4, max_heads_k=4, max_group=4,
             max_capacity=1000, max_chunk=64, page_sizes=(1, 3, 16, 32, 64, 128), budget=1.2e8)

#: Draw weights: kinds, dtypes, and the families of a float16/bfloat16 GPU case.
KINDS = {"dense": 0.6, "varlen": 0.2, "kvcache": 0.2}
DTYPE_WEIGHTS = {"float16": 0.3, "bfloat16": 0.3, "float32": 0.25, "float64": 0.15}
HALF_FAMILY_WEIGHTS = {"sm90": 0.4, "sm80": 0.4, "general": 0.2}
#: float32 and float64 GPU cases run the sm80 family (head dims up to 128, forward and backward; the
#: general kernels above it) when seed % 4 == 1, the general kernels otherwise: a rule of the seed,
#: not a draw, so that the fixed set's problems stay what they were when these kernels came (and the
#: known failures on the general kernels, 304 and 355, stay there).
WIDE_SM80_SEEDS = (4, 1)
#: float32 cases run the Hopper forward (and sm80's backward) when seed % 4 == 2, by the same rule (the
#: known failures, 304 and 355, stay on the general kernels).
FLOAT32_SM90_SEEDS = 2
#: float64 cases run a np.longdouble oracle, which has no BLAS: a tenth of the budget.
FLOAT64_BUDGET = 0.1
#: Fewest query rows (batch * heads * seqlen_q) of a case; a smaller batch grows to reach it. The rule
#: compares maxima of errors: over a row or two, plain's maximum is one rounding, and the ratio of two
#: such draws passes the factor in 5-15% of input draws (float32 lse of a decoding row, measured over
#: 200 draws); over 16 rows in none of 300.
MIN_ROWS = 16
LAYOUTS = {"contiguous": 0.6, "heads-major": 0.2, "padded+8": 0.1, "padded+3": 0.1}
BLOCK_SIDES = (1, 3, 7, 16, 24, 32, 48, 64, 100, 128)


def _pick(rng, weights):
    """A key of ``weights`` (name -> probability)."""
    return str(rng.choice(list(weights), p=list(weights.values())))


def _length(rng, longest, edges, zero=0.0):
    """A sequence length up to ``longest``: 0 with probability ``zero``, else tiny, next to a tile edge
    or anywhere."""
    r = rng.random()
    near = [e + d for e in edges for d in (-1, 0, 1) if e + d <= longest]
    if r < zero:
        return 0
    if r < 0.2 or longest < 8:
        return int(rng.integers(1, min(8, longest) + 1))
    if r < 0.35 and near:
        return int(rng.choice(near))
    return int(rng.integers(1, longest + 1))


def _longest(limits, budget, rows):
    """The longest length a case of ``rows`` = batch * heads * (headdim + headdim_v) may have for both
    seqlen_q and seqlen_k within ``budget``."""
    return int(max(1, min(limits.max_seqlen, math.sqrt(budget / rows))))


def _window(rng, longest):
    """A window_size: none, both sides, (0, 0), left only or right only; sides short or up to ``longest``."""

    def side():
        return int(rng.integers(0, 9)) if rng.random() < 0.4 else int(rng.integers(0, longest + 1))

    r = rng.random()
    if r < 0.55:
        return (-1, -1)
    if r < 0.7:
        return (side(), side())
    if r < 0.75:
        return (0, 0)
    if r < 0.875:
        return (side(), -1)
    return (-1, side())


def _score_options(rng, longest):
    """causal, window_size, softcap, alibi, softmax_scale and scale of any kind."""
    options = {"causal": bool(rng.random() < 0.35), "window_size": _window(rng, longest)}
    if rng.random() < 0.2:
        options["softcap"] = round(float(np.exp(rng.uniform(np.log(0.3), np.log(30)))), 3)
    if rng.random() < 0.2:
        options["alibi"] = "heads" if rng.random() < 0.5 else "batch"
    r = rng.random()
    if r < 0.02:
        options["softmax_scale"] = 0.0  # uniform attention; the sm90 kernels take their score_mod path
    elif r < 0.3:
        magnitude = float(np.exp(rng.uniform(np.log(0.02), 0)))
        options["softmax_scale"] = round(magnitude if rng.random() < 0.7 else -magnitude, 4)
    if rng.random() < 0.25:
        options["scale"] = round(float(rng.uniform(4, 8)), 2)  # large scores stress the online softmax
    return options


def _block_mask(rng, batch, heads):
    """A block mask description: random layouts at random (also non-dividing, non-square) block sizes,
    sometimes Longformer or BigBird."""
    r = rng.random()
    if r < 0.15:
        block = (int(rng.choice((16, 32, 64, 128))),) * 2
        return Longformer(block, int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    if r < 0.3:
        block = (int(rng.choice((16, 32, 64, 128))), int(rng.choice((16, 32, 64, 128))))
        return BigBird(block, int(rng.integers(0, 3)), int(rng.integers(0, 3)), int(rng.integers(1, 4)),
                       int(rng.choice((1, heads))))
    block = (int(rng.choice(BLOCK_SIDES)), int(rng.choice(BLOCK_SIDES)))
    lead = (int(rng.choice((1, batch))), int(rng.choice((1, heads))))
    return RandomBlocks(lead, block, round(float(rng.uniform(0.1, 0.9)), 2), bool(rng.random() < 0.2))


def _headdims(rng, limits, tensor_cores):
    """(headdim, headdim_v): equal more often than not; for the tensor-core families, sizes they read
    with vector loads and now and then an odd one."""
    choices = limits.tc_headdims if tensor_cores else limits.headdims
    if tensor_cores and rng.random() < 0.1:
        choices = ODD_HEADDIMS
    headdim = int(rng.choice(choices))
    headdim_v = headdim if rng.random() < 0.55 else int(rng.choice(choices))
    return headdim, headdim_v


def problem(seed, gpu=False):
    """The random problem of ``seed`` for the CPU part (NumPy) or the GPU part (CuPy).

    Parameters
    ----------
    seed : int
        Seeds ``numpy.random.default_rng``; the problem is a function of it (and of ``gpu``).
    gpu : bool, optional
        Draw within :data:`GPU` (larger sizes, a kernel family to force) instead of :data:`CPU`.

    Returns
    -------
    Problem
    """
    rng = np.random.default_rng(seed)
    limits = GPU if gpu else CPU
    kind = _pick(rng, KINDS)
    dtype = _pick(rng, DTYPE_WEIGHTS)
    family = ""
    if gpu:
        if DTYPES[dtype].itemsize == 2:
            family = _pick(rng, HALF_FAMILY_WEIGHTS)
        else:
            family = ("sm80" if seed % WIDE_SM80_SEEDS[0] == WIDE_SM80_SEEDS[1]
                      else "sm90" if dtype == "float32" and seed % WIDE_SM80_SEEDS[0] == FLOAT32_SM90_SEEDS
                      else "general")
    heads_k = int(rng.integers(1, limits.max_heads_k + 1))
    heads = heads_k * int(rng.integers(1, limits.max_group + 1))
    headdim, headdim_v = _headdims(rng, limits, family in ("sm90", "sm80") and DTYPES[dtype].itemsize == 2)
    fields = {"seed": seed, "kind": kind, "dtype": dtype, "family": family, "heads": heads, "heads_k": heads_k,
              "headdim": headdim, "headdim_v": headdim_v, "layout": _pick(rng, LAYOUTS)}
    budget = limits.budget * (FLOAT64_BUDGET if dtype == "float64" else 1)
    sizes = {"dense": _dense_sizes, "varlen": _varlen_sizes, "kvcache": _kvcache_sizes}[kind]
    fields.update(sizes(rng, limits, budget, heads, headdim, headdim_v))
    longest = max(fields.get("seqlen_q", 0), fields.get("seqlen_k", 0), *fields.get("lengths_k", ()),
                  fields.get("capacity", 0))
    fields.update(_score_options(rng, longest))
    if kind == "dense" and min(fields["seqlen_q"], fields["seqlen_k"]) > 0 and rng.random() < 0.3:
        fields["block_mask"] = _block_mask(rng, fields["batch"], heads)
    if kind != "kvcache":
        fields["deterministic"] = bool(rng.random() < 0.5)
    if not gpu:
        # The training features (issue 23), drawn after everything else so that the problems of the fixed
        # set stay what they were; the GPU part gets them once its kernels are enabled.
        fields["sinks"] = bool(rng.random() < 0.25)
        if kind != "kvcache" and rng.random() < 0.25:
            fields["dropout_p"] = float(rng.choice((0.1, 0.5, round(float(rng.uniform(0.01, 0.9)), 3))))
    return Problem(**fields)


def _enough_rows(batch, rows_per_entry):
    """``batch``, or the smallest batch whose entries hold MIN_ROWS query rows in all."""
    return max(batch, -(-MIN_ROWS // rows_per_entry)) if rows_per_entry else batch


def _dense_sizes(rng, limits, budget, heads, headdim, headdim_v):
    """batch, seqlen_q and seqlen_k (equal now and then; either may be 0)."""
    batch = int(rng.integers(1, limits.max_batch + 1))
    longest = _longest(limits, budget, batch * heads * (headdim + headdim_v))
    seqlen_q = _length(rng, longest, limits.edges, zero=0.02)
    seqlen_k = seqlen_q if rng.random() < 0.3 else _length(rng, longest, limits.edges, zero=0.02)
    return {"batch": _enough_rows(batch, heads * seqlen_q), "seqlen_q": seqlen_q, "seqlen_k": seqlen_k}


def _varlen_sizes(rng, limits, budget, heads, headdim, headdim_v):
    """The packed sequences' lengths (some 0; the key lengths often the query lengths) and max_seqlen."""
    batch = int(rng.integers(1, limits.max_batch + 3))
    longest = _longest(limits, budget, batch * heads * (headdim + headdim_v))
    lengths_q = [_length(rng, longest, limits.edges, zero=0.1) for _ in range(batch)]
    while heads * sum(lengths_q) < MIN_ROWS:
        lengths_q.append(_length(rng, longest, limits.edges))
    lengths_q = tuple(lengths_q)
    if rng.random() < 0.3:
        lengths_k = lengths_q
    else:
        lengths_k = tuple(_length(rng, longest, limits.edges, zero=0.1) for _ in lengths_q)
    max_seqlen = None
    if rng.random() < 0.5:
        # The longest sequences, or more (the launch is sized for them; the values must not exceed them).
        slack = [0 if rng.random() < 0.7 else int(rng.integers(1, 20)) for _ in range(2)]
        max_seqlen = (max(lengths_q) + slack[0], max(lengths_k) + slack[1])
    return {"batch": len(lengths_q), "lengths_q": lengths_q, "lengths_k": lengths_k, "max_seqlen": max_seqlen}


def _kvcache_sizes(rng, limits, budget, heads, headdim, headdim_v):
    """The queries, the cache (dense or paged), its lengths, the new tokens, rotary and num_splits."""
    seqlen_q = 1 if rng.random() < 0.5 else int(rng.integers(2, limits.max_chunk + 1))
    batch = _enough_rows(int(rng.integers(1, limits.max_batch + 1)), heads * seqlen_q)
    longest = int(max(1, min(limits.max_capacity, budget / (batch * heads * seqlen_q * (headdim + headdim_v)))))
    page_size = 0 if rng.random() < 0.45 else int(rng.choice(limits.page_sizes))
    capacity = _length(rng, longest, limits.edges)
    if page_size:  # a paged cache holds whole pages
        capacity = -(-capacity // page_size) * page_size
    seqlen_new = 0
    if rng.random() < 0.65:
        seqlen_new = seqlen_q if rng.random() < 0.5 else int(rng.integers(1, max(seqlen_q, 4) + 1))
        seqlen_new = min(seqlen_new, capacity)
    room = capacity - seqlen_new
    form = _pick(rng, {"array": 0.6, "int": 0.25, "none": 0.15})
    if form == "array":
        # Edges (empty, full) now and then, else anywhere.
        lengths = tuple(int(rng.choice((0, room))) if rng.random() < 0.25 else int(rng.integers(0, room + 1))
                        for _ in range(batch))
    else:
        lengths = (int(rng.integers(0, room + 1)) if form == "int" else room,) * batch
    fields = {"batch": batch, "seqlen_q": seqlen_q, "page_size": page_size, "capacity": capacity,
              "seqlen_new": seqlen_new, "cache_seqlens": lengths, "seqlens_form": form,
              "batch_idx": bool(page_size == 0 and rng.random() < 0.3)}
    if seqlen_new and headdim >= 2 and rng.random() < 0.4:
        # Rotary embedding of the new keys (and the queries): all of an even head dim now and then,
        # usually its first columns only.
        fields["rotary_dim"] = headdim // 2 * 2 if rng.random() < 0.2 else 2 * int(rng.integers(1, headdim // 2 + 1))
        fields["rotary_interleaved"] = bool(rng.random() < 0.5)
    if limits is GPU and rng.random() < 0.3:
        fields["num_splits"] = int(rng.integers(1, 9))
    return fields


# ------------------------------------------------------------------------------------------ inputs


def _storage(x, layout):
    """New host memory that holds the values of ``x`` in ``layout`` (see :func:`_view`); never ``x``
    itself, so the oracle's copy stays as it was whatever the call does to its inputs."""
    if layout == "contiguous":
        return x.copy()
    if layout == "heads-major":
        return np.ascontiguousarray(x.transpose(_HEADS_MAJOR[x.ndim]))
    wide = np.full(x.shape[:-1] + (x.shape[-1] + int(layout.removeprefix("padded+")),), np.nan, x.dtype)
    wide[..., : x.shape[-1]] = x
    return wide


def _view(storage, layout, headdim):
    """The API-shaped array that ``storage`` (NumPy or CuPy) holds in ``layout``.

    "contiguous": C order. "heads-major": stored as (batch, heads, seqlen, dim) (packed: (heads, total,
    dim)) and passed as its transpose, as ``x.transpose(0, 2, 1, 3)`` of a (b, h, s, d) array.
    "padded+N": the first ``headdim`` columns of rows N elements wider, the padding NaN so that a kernel
    reading past a row poisons its result.
    """
    if layout == "contiguous":
        return storage
    if layout == "heads-major":
        return storage.transpose(_HEADS_MAJOR[storage.ndim])
    return storage[..., :headdim]


#: The axis order of a heads-major layout, by rank; each is its own inverse.
_HEADS_MAJOR = {4: (0, 2, 1, 3), 3: (1, 0, 2)}


def _placed(xp, x, layout):
    """The host array ``x`` on ``xp`` in ``layout``: the storage is built on the host and copied whole,
    so that no device kernel touches the input dtype before the call under test."""
    return _view(xp.asarray(_storage(x, layout)), layout, x.shape[-1])


def _slopes(xp, pr, rng):
    """Random positive float32 ALiBi slopes of the problem's shape, or None."""
    if not pr.alibi:
        return None
    shape = (pr.heads,) if pr.alibi == "heads" else (pr.batch, pr.heads)
    return xp.asarray(rng.uniform(0.0, 1.0, shape).astype(np.float32))


def _mask(xp, pr, rng):
    """The problem's cupyflash.BlockMask, or None; random layouts on ``xp``, the builders' on the host
    (the first GPU call copies those to the device)."""
    spec = pr.block_mask
    if spec is None:
        return None
    if isinstance(spec, Longformer):
        return cupyflash.BlockMask.longformer(pr.seqlen_q, pr.seqlen_k, block_size=spec.block,
                                              window_blocks=spec.window_blocks, global_blocks=spec.global_blocks)
    if isinstance(spec, BigBird):
        return cupyflash.BlockMask.bigbird(pr.seqlen_q, pr.seqlen_k, block_size=spec.block,
                                           window_blocks=spec.window_blocks, global_blocks=spec.global_blocks,
                                           random_blocks=spec.random_blocks, heads=spec.heads, seed=pr.seed)
    shape = spec.lead + (-(-pr.seqlen_q // spec.block[0]), -(-pr.seqlen_k // spec.block[1]))
    layout = random_layout(shape, spec.density, int(rng.integers(2**31)))
    if spec.empty_row:
        layout[..., int(rng.integers(shape[2])), :] = False
    return cupyflash.BlockMask.from_dense(xp.asarray(layout), spec.block)


def _options(xp, pr, rng):
    """The mask, score and training keyword arguments of the problem's call."""
    options = {"causal": pr.causal, "window_size": pr.window_size, "softcap": pr.softcap,
               "softmax_scale": pr.softmax_scale, "alibi_slopes": _slopes(xp, pr, rng)}
    if pr.kind == "dense":
        options["block_mask"] = _mask(xp, pr, rng)
    if pr.sinks:
        sinks = rng.normal(0, 3, pr.heads).astype(np.float32)
        if rng.random() < 0.3:
            sinks[int(rng.integers(pr.heads))] = -np.inf
        options["sinks"] = xp.asarray(sinks)
    if pr.dropout_p:
        options.update(dropout_p=pr.dropout_p, dropout_seed=pr.seed, dropout_offset=pr.seed % 7)
    return options


# ----------------------------------------------------------------------------------------- running


class KnownRounding(AssertionError):
    """A gradient past the tolerance rule: the one failure KNOWN_FAILURES's seeds are expected to raise
    (their xfail takes this alone, so a wrong out or lse, a dtype or any exception of theirs still fails)."""


def _judge(got, ref, base, dtype):
    """The tolerance rule on every result of ``got`` (name -> array), after its dtype: the input's, and
    float32 (16-bit inputs) or float64 for lse, float32 for dsinks (whose plain error is taken as at
    least the oracle's dsinks_floor, as helpers._outputs does)."""
    for name, value in got.items():
        expected = (np.float32 if dtype.itemsize == 2 else np.float64) if name == "lse" else dtype
        expected = np.float32 if name == "dsinks" else expected
        assert value.dtype == expected, f"{name} has dtype {value.dtype}, expected {np.dtype(expected)}"
        factor = OUTPUT_FACTOR if name in ("out", "lse") else GRAD_FACTOR
        floor = ref["dsinks_floor"] if name == "dsinks" else 0.0
        try:
            assert_within_rule(name, value, ref[name], base[name], factor, floor)
        except AssertionError as error:
            if name in ("dq", "dk", "dv"):
                raise KnownRounding(str(error)) from error
            raise


def _backward_again(xp, first, backward):
    """On the GPU, the deterministic backward once more: every gradient must repeat bit for bit."""
    if xp is np:
        return
    for name, a, b in zip(("dq", "dk", "dv"), first, backward()):
        assert bool((a.view(np.uint8) == b.view(np.uint8)).all()), f"deterministic {name} differs between two runs"


def _run_dense(xp, pr, rng):
    """flash_attention and flash_attention_backward: out, lse, dq, dk, dv against the oracle."""
    dtype = DTYPES[pr.dtype]
    host = random_qkv(np, pr.batch, pr.seqlen_q, pr.seqlen_k, pr.heads, pr.heads_k, pr.headdim, pr.headdim_v, dtype,
                      int(rng.integers(2**31)), pr.scale)
    host += (random_normal(np, (pr.batch, pr.seqlen_q, pr.heads, pr.headdim_v), dtype, rng),)
    q, k, v, dout = (_placed(xp, x, pr.layout) for x in host)
    options = _options(xp, pr, rng)
    out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)

    def backward():
        return cupyflash.flash_attention_backward(dout, q, k, v, out, lse, deterministic=pr.deterministic, **options)

    grads = backward()
    got = dict(zip(("out", "lse", "dq", "dk", "dv", "dsinks"), (out, lse, *grads)))
    hq, hk, hv, hdout = host  # the oracle reads the host copies: the same values
    _judge(got, oracle(hq, hk, hv, dout=hdout, **options), plain(hq, hk, hv, dout=hdout, **options), dtype)
    if pr.deterministic:
        _backward_again(xp, grads, backward)


def _run_varlen(xp, pr, rng):
    """flash_attention_varlen and its backward: out, lse, dq, dk, dv against the oracle."""
    dtype = DTYPES[pr.dtype]
    total_q, total_k = sum(pr.lengths_q), sum(pr.lengths_k)
    shapes = ((total_q, pr.heads, pr.headdim), (total_k, pr.heads_k, pr.headdim), (total_k, pr.heads_k, pr.headdim_v))
    host = [random_normal(np, shape, dtype, rng, pr.scale) for shape in shapes]
    host.append(random_normal(np, (total_q, pr.heads, pr.headdim_v), dtype, rng))
    q, k, v, dout = (_placed(xp, x, pr.layout) for x in host)
    host_cu = tuple(packed_offsets(lengths) for lengths in (pr.lengths_q, pr.lengths_k))
    cu = tuple(xp.asarray(c) for c in host_cu)
    sizes = {} if pr.max_seqlen is None else dict(zip(("max_seqlen_q", "max_seqlen_k"), pr.max_seqlen))
    options = _options(xp, pr, rng)
    out, lse = cupyflash.flash_attention_varlen(q, k, v, *cu, return_lse=True, **sizes, **options)

    def backward():
        return cupyflash.flash_attention_varlen_backward(dout, q, k, v, out, lse, *cu, deterministic=pr.deterministic,
                                                         **sizes, **options)

    grads = backward()
    got = dict(zip(("out", "lse", "dq", "dk", "dv", "dsinks"), (out, lse, *grads)))
    hq, hk, hv, hdout = host  # the oracle reads the host copies (backward() keeps the device ones)
    ref = oracle(hq, hk, hv, dout=hdout, cu_seqlens=host_cu, **options)
    _judge(got, ref, plain(hq, hk, hv, dout=hdout, cu_seqlens=host_cu, **options), dtype)
    if pr.deterministic:
        _backward_again(xp, grads, backward)


def _kvcache_inputs(pr, rng):
    """Host arrays of a KV-cache call: (q, k_cache, v_cache) and the keyword arrays (k, v, the index
    arrays, rotary_cos/sin); a paged cache's pages are shuffled, with spare pages no entry uses."""
    dtype = DTYPES[pr.dtype]

    def normal(*shape):
        return random_normal(np, shape, dtype, rng, pr.scale)

    q = normal(pr.batch, pr.seqlen_q, pr.heads, pr.headdim)
    arrays = {}
    if pr.page_size:
        per_entry = pr.capacity // pr.page_size
        pages = pr.batch * per_entry + int(rng.integers(0, 4))
        arrays["block_table"] = rng.permutation(pages)[: pr.batch * per_entry].reshape(pr.batch, per_entry).astype(np.int32)
        entries, rows = pages, pr.page_size
    else:
        entries, rows = pr.batch + 2 if pr.batch_idx else pr.batch, pr.capacity
        if pr.batch_idx:
            arrays["cache_batch_idx"] = rng.permutation(entries)[: pr.batch].astype(np.int32)
    k_cache, v_cache = normal(entries, rows, pr.heads_k, pr.headdim), normal(entries, rows, pr.heads_k, pr.headdim_v)
    if pr.seqlen_new:
        arrays["k"] = normal(pr.batch, pr.seqlen_new, pr.heads_k, pr.headdim)
        arrays["v"] = normal(pr.batch, pr.seqlen_new, pr.heads_k, pr.headdim_v)
    if pr.rotary_dim:
        # RoPE's angles (base 10000), for a few positions more than the call needs: the cache's, and with
        # causal or a window the queries' (query i rotates at cache_seqlens + i).
        half = pr.rotary_dim // 2
        q_at_row = pr.causal or pr.window_size != (-1, -1)
        needed = max(pr.capacity, pr.capacity - pr.seqlen_new + (pr.seqlen_q if q_at_row else 1))
        positions = np.arange(needed + int(rng.integers(0, 5)))[:, None]
        angles = positions * 10000.0 ** (-np.arange(half) / half)[None, :]
        arrays["rotary_cos"], arrays["rotary_sin"] = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    return (q, k_cache, v_cache), arrays


def _run_kvcache(xp, pr, rng):
    """flash_attention_with_kvcache: out and lse against the oracle (reference.attention_with_kvcache, as
    in test_kvcache.py), and the caches' contents against the reference's."""
    dtype = DTYPES[pr.dtype]
    (host_q, *host_caches), host = _kvcache_inputs(pr, rng)
    q = _placed(xp, host_q, pr.layout)
    # The caches' storage is kept: the call writes into it, and its copy to the host shows what.
    storage = [xp.asarray(_storage(x, pr.layout)) for x in host_caches]
    k_cache, v_cache = (_view(x, pr.layout, c.shape[-1]) for x, c in zip(storage, host_caches))
    arrays = {name: _placed(xp, x, pr.layout) if name in ("k", "v") else xp.asarray(x) for name, x in host.items()}
    if pr.seqlens_form == "array":
        host["cache_seqlens"] = np.array(pr.cache_seqlens, np.int32)
        arrays["cache_seqlens"] = xp.asarray(host["cache_seqlens"])
    elif pr.seqlens_form == "int":
        host["cache_seqlens"] = arrays["cache_seqlens"] = pr.cache_seqlens[0]
    options = _options(xp, pr, rng)
    slopes, sinks = options["alibi_slopes"], options.get("sinks")
    host_options = dict(options, alibi_slopes=None if slopes is None else to_host(slopes))
    if sinks is not None:
        host_options["sinks"] = to_host(sinks)
    # Before the call, which writes into the caches; a float64 oracle cannot judge float64 results.
    wide = np.longdouble if dtype == np.float64 else None
    want = reference.attention_with_kvcache(host_q, *host_caches, **host, **host_options, compute_dtype=wide)
    base = reference.attention_with_kvcache(host_q, *host_caches, **host, **host_options, compute_dtype=dtype)
    call = dict(arrays, **options, num_splits=pr.num_splits, return_lse=True)
    out, lse = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **call)
    if xp is not np:
        # A second call of the layout runs the cached plan, appending the same tokens at the same
        # positions: it must reproduce the first bit for bit.
        again = cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **call)
        for name, a, b in zip(("out", "lse"), (out, lse), again):
            assert bool((a.view(np.uint8) == b.view(np.uint8)).all()), f"the planned call's {name} differs"
    assert out.shape == want[0].shape, f"out has shape {out.shape}, expected {want[0].shape}"
    _judge({"out": out, "lse": lse}, {"out": want[0], "lse": want[1]}, {"out": base[0], "lse": base[1]}, dtype)
    for name, memory, expected in zip(("k_cache", "v_cache"), storage, want[2:]):
        got = _view(to_host(memory), pr.layout, expected.shape[-1]).astype(np.float64)
        # Rotated keys are rounded once from float32 (the kernels) or float64 (the reference): one ulp.
        tolerance = np.spacing(np.abs(expected).astype(dtype)).astype(np.float64)
        wrong = np.abs(got - expected.astype(np.float64)) > tolerance
        assert not wrong.any(), f"{name} differs from the reference's at {np.argwhere(wrong)[:5].tolist()}"


def run(xp, pr):
    """Run problem ``pr`` on ``xp`` (NumPy or CuPy) and judge every result against the oracle.

    The inputs are drawn from ``numpy.random.default_rng`` seeded by the problem's seed, so a problem
    always runs on the same values.

    Raises
    ------
    AssertionError
        When a result breaks the tolerance rule or has a wrong dtype or shape, a cache's contents
        differ from the reference's, or (GPU) a deterministic backward or a planned KV-cache call does
        not repeat bit for bit.
    """
    rng = np.random.default_rng(seed_from("inputs", pr.seed))
    {"dense": _run_dense, "varlen": _run_varlen, "kvcache": _run_kvcache}[pr.kind](xp, pr, rng)


def _check(xp, pr, device):
    """:func:`run`, with any failure reported as an AssertionError that starts with the seed and the
    problem."""
    try:
        run(xp, pr)
    except Exception as error:
        replay = f"CUPYFLASH_RANDOM_SEED={pr.seed} python -m pytest tests/test_random.py::test_{device}"
        kind = KnownRounding if isinstance(error, KnownRounding) else AssertionError
        raise kind(f"seed {pr.seed} ({replay}): {pr}\n{type(error).__name__}: {error}") from error


# ------------------------------------------------------------------------------------------- cases


def _base():
    """The first seed: CUPYFLASH_RANDOM_BASE (an int, or "fresh" for a random one), else DEFAULT_BASE."""
    value = os.environ.get("CUPYFLASH_RANDOM_BASE", "")
    return secrets.randbelow(2**31) if value == "fresh" else int(value) if value else DEFAULT_BASE


BASE = _base()


def _seeds(count):
    """The seeds of a part: CUPYFLASH_RANDOM_SEED's list, else ``count`` from BASE."""
    chosen = os.environ.get("CUPYFLASH_RANDOM_SEED", "")
    if chosen:
        return [int(s) for s in chosen.split(",")]
    return range(BASE, BASE + count)


def _params(seeds, gpu):
    device = "gpu" if gpu else "cpu"
    params = []
    for seed in seeds:
        p = problem(seed, gpu)
        known = KNOWN_FAILURES.get((device, seed)) if BASE == DEFAULT_BASE else None
        # (CPU seeds: only a gradient past the rule; the GPU seeds' narrowing waits for a GPU run of it,
        # bench/runs/2026-12-08-s64/pending/gpu_tests_audit.patch)
        raises = KnownRounding if device == "cpu" else None
        marks = [pytest.mark.xfail(reason=known[0], strict=known[1], raises=raises)] if known else []
        params.append(pytest.param(p, id=f"{device}-{p.kind}-{p.seed}", marks=marks))
    return params


@pytest.mark.parametrize("pr", _params(_seeds(CPU_CASES), gpu=False))
def test_cpu(pr):
    _check(np, pr, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("pr", _params(_seeds(GPU_CASES), gpu=True))
def test_gpu(pr, monkeypatch):
    use_family(monkeypatch, pr.family)
    _check(cupy, pr, "gpu")


def _is(**fields):
    """The predicate "the problem has these field values"."""
    return lambda p: all(getattr(p, name) == value for name, value in fields.items())


#: What the fixed seeds must reach, as predicates of a Problem: a change of the generator that stops
#: drawing one of them fails here rather than silently narrowing the test.
FEATURES = {
    **{f"kind {kind}": _is(kind=kind) for kind in KINDS},
    **{f"dtype {dtype}": _is(dtype=dtype) for dtype in DTYPES},
    **{f"layout {layout}": _is(layout=layout) for layout in LAYOUTS},
    "GQA": lambda p: p.heads > p.heads_k > 1,
    "MQA": lambda p: p.heads > p.heads_k == 1,
    "headdim_v != headdim": lambda p: p.headdim_v != p.headdim,
    "seqlen_q > seqlen_k": lambda p: p.kind == "dense" and p.seqlen_q > p.seqlen_k,
    "seqlen_q < seqlen_k": lambda p: p.kind == "dense" and p.seqlen_q < p.seqlen_k,
    "empty sequence": lambda p: p.kind == "dense" and min(p.seqlen_q, p.seqlen_k) == 0,
    "causal": lambda p: p.causal,
    "window both sides": lambda p: min(p.window_size) > 0,
    "window (0, 0)": lambda p: p.window_size == (0, 0),
    "window left only": lambda p: p.window_size[0] >= 0 and p.window_size[1] == -1,
    "window right only": lambda p: p.window_size[0] == -1 and p.window_size[1] >= 0,
    "softcap": lambda p: p.softcap > 0,
    "alibi (heads,)": lambda p: p.alibi == "heads",
    "alibi (batch, heads)": lambda p: p.alibi == "batch",
    "random block mask": lambda p: isinstance(p.block_mask, RandomBlocks),
    "non-square blocks": lambda p: isinstance(p.block_mask, RandomBlocks) and p.block_mask.block[0] != p.block_mask.block[1],
    "blocks that do not divide": lambda p: isinstance(p.block_mask, RandomBlocks) and p.seqlen_k % p.block_mask.block[1],
    "a block row seeing nothing": lambda p: isinstance(p.block_mask, RandomBlocks) and p.block_mask.empty_row,
    "longformer": lambda p: isinstance(p.block_mask, Longformer),
    "bigbird": lambda p: isinstance(p.block_mask, BigBird),
    "negative softmax_scale": lambda p: p.softmax_scale is not None and p.softmax_scale < 0,
    "zero softmax_scale": lambda p: p.softmax_scale == 0,
    "input scale > 1": lambda p: p.scale > 1,
    "deterministic": lambda p: p.deterministic,
    "non-deterministic backward": lambda p: p.kind != "kvcache" and not p.deterministic,
    "varlen empty sequence": lambda p: p.kind == "varlen" and 0 in p.lengths_q + p.lengths_k,
    "varlen max_seqlen given": lambda p: p.kind == "varlen" and p.max_seqlen is not None,
    "varlen max_seqlen from the host": lambda p: p.kind == "varlen" and p.max_seqlen is None,
    "dense cache": lambda p: p.kind == "kvcache" and not p.page_size,
    "paged cache": lambda p: p.page_size > 0,
    "pages of 1": lambda p: p.page_size == 1,
    **{f"cache_seqlens {form}": _is(kind="kvcache", seqlens_form=form) for form in ("array", "int", "none")},
    "cache_batch_idx": lambda p: p.batch_idx,
    "decoding": lambda p: p.kind == "kvcache" and p.seqlen_q == 1,
    "chunk of queries": lambda p: p.kind == "kvcache" and p.seqlen_q > 1,
    "no new tokens": lambda p: p.kind == "kvcache" and not p.seqlen_new,
    "rotary interleaved": lambda p: p.rotary_dim and p.rotary_interleaved,
    "rotary halves": lambda p: p.rotary_dim and not p.rotary_interleaved,
    "rotary_dim < headdim": lambda p: 0 < p.rotary_dim < p.headdim,
}
GPU_FEATURES = {
    **{f"{dtype} on {family}": _is(dtype=dtype, family=family)
       for dtype in ("float16", "bfloat16") for family in HALF_FAMILY_WEIGHTS},
    **{f"{dtype} on {family}": _is(dtype=dtype, family=family) for dtype in ("float32", "float64")
       for family in ("sm80", "general")},
    "float32 on sm90": _is(dtype="float32", family="sm90"),
    "float32 or float64 on sm80 at head dims up to 128": lambda p: (p.family == "sm80" and p.dtype in ("float32", "float64")
                                                                    and max(p.headdim, p.headdim_v) <= 128),
    "odd head dim on the tensor cores": lambda p: p.family in ("sm90", "sm80") and p.headdim in ODD_HEADDIMS,
    "head dim 256 on the tensor cores": lambda p: p.family in ("sm90", "sm80") and max(p.headdim, p.headdim_v) == 256,
    "num_splits": lambda p: p.num_splits > 0,
    "long sequences": lambda p: p.kind == "dense" and min(p.seqlen_q, p.seqlen_k) > 300,
}


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_the_seeds_cover_every_feature(gpu):
    """The fixed seeds reach every feature of FEATURES (and the GPU's every family), and a problem is a
    function of its seed (what replaying needs)."""
    problems = [problem(seed, gpu) for seed in range(DEFAULT_BASE, DEFAULT_BASE + (GPU_CASES if gpu else CPU_CASES))]
    features = {**FEATURES, **GPU_FEATURES} if gpu else FEATURES
    missing = [name for name, has in features.items() if not any(has(p) for p in problems)]
    assert not missing, f"no {'GPU' if gpu else 'CPU'} case has: {', '.join(missing)}"
    assert problem(DEFAULT_BASE + 1, gpu) == problems[1]
