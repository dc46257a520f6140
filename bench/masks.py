"""Benchmark cupyflash's masked and variable-length attention against dense attention and torch's peers.

Run from the repository root::

    python bench/masks.py                 # 7 rows, cupyflash and (with torch) FlexAttention and FA2
    python bench/masks.py --quick         # 6 rows (no 25% block-sparse row)
    python bench/masks.py --dry-run       # print the plan (rows, shapes, visible pairs, FLOPs); no GPU

Rows (bf16, headdim 128, 16 query heads = 16 kv heads): dense and causal at seqlen 16384, a sliding window
(1024, 0), block-sparse layouts of 128x128 blocks at 10% and 25% density, dense at seqlen 1024 (batch 16)
and 64 packed sequences of random length 128..2048 (``flash_attention_varlen``). FLOPs are counted on the
visible area only (see :func:`Row.visible_pairs`), so a mask that skips its hidden blocks perfectly runs at
the TFLOP/s of dense attention; the ``vs dense`` ratio measures how close it gets. ``bench/README.md``
describes the output.

Only NumPy is imported at module level: ``--dry-run`` needs no GPU. Timing, inputs, the torch peers and the
environment record are the harness's (``bench/harness.py``), shared with ``bench.py``.
"""

import argparse
import contextlib
import dataclasses
import importlib.util
import math
import sys
import time
from pathlib import Path

import harness
import numpy

#: The problem of every row.
DTYPE = "bf16"
HEADDIM = 128
HEADS = 16
#: seqlen of the long rows (batch 1) and of the short dense row (batch SHORT_BATCH).
LONG_SEQLEN = 16384
SHORT_SEQLEN = 1024
SHORT_BATCH = 16
#: The sliding-window row's window_size (left, right).
WINDOW = (1024, 0)
#: Block size of the block-sparse layouts, and their densities (probability that a block is set).
BLOCK_SIZE = (128, 128)
DENSITIES = (0.10, 0.25)
#: The varlen row: this many sequences, lengths uniform in [low, high] (both included).
VARLEN_COUNT = 64
VARLEN_LENGTHS = (128, 2048)
#: Seed of the layouts, the lengths (numpy.random.default_rng) and the inputs (seed + row number).
SEED = 0
#: The issue's target for the masked rows: TFLOP/s at least this fraction of dense attention's.
TARGET_RATIO = 0.9
DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 20
DEFAULT_OUT = harness.REPO_ROOT / "bench" / "results" / "masks"
#: A peer's output farther than this (max abs difference, bf16) from cupyflash's is flagged in the notes.
DIFF_WARN = 0.05

#: torch device of the peers' masks and offsets (the current CUDA device, which harness.load_torch sets).
TORCH_DEVICE = "cuda"
#: System keys, in table order, with their short names.
SYSTEMS = {"cupyflash": "cupyflash", "flex": "Flex", "fa2": "FA2"}
DIRECTIONS = ("fwd", "bwd")


# ----------------------------------------------------------------------------------------------- rows


@dataclasses.dataclass(frozen=True)
class Row:
    """One benchmarked problem.

    ``kind`` is ``dense`` (``window`` (-1, -1)), ``causal`` (``window`` (-1, 0), called with
    ``causal=True``), ``window``, ``block`` (``layout``) or ``varlen`` (``lengths``). All but varlen have
    q, k, v, dout of shape (batch, seqlen, heads, headdim) with seqlen_q = seqlen_k.
    """

    key: str
    label: str
    kind: str
    batch: int
    seqlen: int
    window: tuple = (-1, -1)
    density: float = None
    layout: numpy.ndarray = dataclasses.field(default=None, compare=False, repr=False)
    lengths: tuple = None
    reference: str = None
    target: float = None
    heads: int = HEADS
    headdim: int = HEADDIM
    dtype: str = DTYPE

    # ------------------------------------------------------------------------------------ sizes

    @property
    def total(self):
        """Packed tokens of the varlen row (batch * seqlen otherwise)."""
        return int(sum(self.lengths)) if self.kind == "varlen" else self.batch * self.seqlen

    @property
    def max_seqlen(self):
        """Longest sequence: max_seqlen_q = max_seqlen_k of the varlen calls."""
        return int(max(self.lengths)) if self.kind == "varlen" else self.seqlen

    @property
    def cu_seqlens(self):
        """int32 offsets (batch + 1,) of the varlen row, on the host."""
        return numpy.concatenate([[0], numpy.cumsum(self.lengths)]).astype(numpy.int32)

    @property
    def shape(self):
        """Shape of q, k, v and dout: (total, heads, headdim) for varlen, else (batch, seqlen, heads, headdim)."""
        if self.kind == "varlen":
            return (self.total, self.heads, self.headdim)
        return (self.batch, self.seqlen, self.heads, self.headdim)

    # ------------------------------------------------------------------------------------ FLOPs

    @property
    def visible_pairs(self):
        """Visible (query, key) pairs summed over batch and heads, counted exactly on the host."""
        if self.kind == "varlen":
            return self.heads * sum(int(n) * int(n) for n in self.lengths)
        if self.kind == "block":
            return harness.block_pairs(self.layout, BLOCK_SIZE, self.seqlen, self.seqlen, self.batch, self.heads)
        return self.batch * self.heads * harness.window_pairs(self.seqlen, self.seqlen, *self.window)

    @property
    def area(self):
        """Pairs of the unmasked problem: batch * heads * seqlen^2, or heads * total^2 for the packed varlen
        row (FlexAttention's view of it: one sequence of ``total`` tokens)."""
        if self.kind == "varlen":
            return self.heads * self.total * self.total
        return self.batch * self.heads * self.seqlen * self.seqlen

    @property
    def flops_fwd(self):
        """Forward FLOPs on the visible area: 4 * headdim per visible pair."""
        return harness.pair_flops(self.visible_pairs, self.headdim)

    @property
    def flops_bwd(self):
        """Backward FLOPs: 2.5 times the forward's."""
        return harness.backward_flops(self.flops_fwd)

    @property
    def causal(self):
        """For torch SDPA (dense rows only)."""
        return self.kind == "causal"

    def shape_text(self):
        if self.kind == "varlen":
            return f"({self.total}, {self.heads}, {self.headdim})"
        return str(self.shape)

    def seqlen_text(self):
        """The table's seqlen cell: the length, or the range of the varlen lengths."""
        if self.kind == "varlen":
            return f"{min(self.lengths)}-{max(self.lengths)}"
        return str(self.seqlen)

    def mask_text(self):
        """One line describing the mask, for the plan."""
        if self.kind == "dense":
            return "no mask"
        if self.kind == "causal":
            return "causal=True: query i sees keys j <= i"
        if self.kind == "window":
            left, right = self.window
            return f"window_size={self.window}: query i sees keys j in [i - {left}, i + {right}]"
        if self.kind == "block":
            per_head = self.layout.reshape(self.layout.shape[1], -1).sum(axis=1)
            return (
                f"layout {self.layout.shape} of {BLOCK_SIZE[0]}x{BLOCK_SIZE[1]} blocks, random p = "
                f"{self.density:.2f} + diagonal: {self.layout.mean():.2%} set ({per_head.min()}-{per_head.max()}/head)"
            )
        lengths = numpy.asarray(self.lengths)
        return (
            f"lengths U[{VARLEN_LENGTHS[0]}, {VARLEN_LENGTHS[1]}]: min {lengths.min()}, mean {lengths.mean():.0f}, "
            f"max {lengths.max()}; cu_seqlens int32 ({len(lengths) + 1},); max_seqlen_q = max_seqlen_k = "
            f"{self.max_seqlen}"
        )

    def to_json(self):
        """Sizes, mask and FLOPs as a JSON-ready dict."""
        entry = {
            "key": self.key,
            "label": self.label,
            "kind": self.kind,
            "dtype": self.dtype,
            "headdim": self.headdim,
            "heads": self.heads,
            "heads_k": self.heads,
            "shape": list(self.shape),
            "visible_pairs": self.visible_pairs,
            "visible_fraction": self.visible_pairs / self.area,
            "flops_fwd": self.flops_fwd,
            "flops_bwd": self.flops_bwd,
            "reference": self.reference,
            "target": self.target,
        }
        if self.kind == "varlen":
            entry.update(
                batch=len(self.lengths),
                lengths=[int(n) for n in self.lengths],
                total=self.total,
                max_seqlen=self.max_seqlen,
                causal=False,
            )
        else:
            entry.update(batch=self.batch, seqlen=self.seqlen, window_size=list(self.window),
                         causal=self.kind == "causal")
        if self.kind == "block":
            entry.update(
                block_size=list(BLOCK_SIZE),
                density_requested=self.density,
                density=float(self.layout.mean()),
                layout_shape=list(self.layout.shape),
                layout_seed=SEED,
            )
        return entry


def build_rows(quick):
    """The rows in table order; ``quick`` leaves out the 25% block-sparse row."""
    q_blocks = math.ceil(LONG_SEQLEN / BLOCK_SIZE[0])
    k_blocks = math.ceil(LONG_SEQLEN / BLOCK_SIZE[1])
    rows = [
        Row("dense", "dense", "dense", 1, LONG_SEQLEN),
        Row("causal", "dense causal", "causal", 1, LONG_SEQLEN, window=(-1, 0), reference="dense"),
        Row("window", f"window {WINDOW}", "window", 1, LONG_SEQLEN, window=WINDOW, reference="dense",
            target=TARGET_RATIO),
    ]
    for density in DENSITIES:
        if quick and density != DENSITIES[0]:
            continue
        rows.append(
            Row(f"block{round(density * 100)}", f"block-sparse {density:.0%}", "block", 1, LONG_SEQLEN,
                density=density, layout=harness.random_block_layout(density, SEED, HEADS, q_blocks, k_blocks), reference="dense",
                target=TARGET_RATIO)
        )
    lengths = harness.varlen_lengths(VARLEN_COUNT, *VARLEN_LENGTHS, SEED)
    rows += [
        Row("dense1024", f"dense {SHORT_SEQLEN}", "dense", SHORT_BATCH, SHORT_SEQLEN),
        Row("varlen", f"varlen {VARLEN_COUNT} x U({VARLEN_LENGTHS[0]}, {VARLEN_LENGTHS[1]})", "varlen",
            VARLEN_COUNT, max(lengths), lengths=lengths, reference="dense1024", target=TARGET_RATIO),
    ]
    return rows


# ---------------------------------------------------------------------------------------------- plan


def peer_plan(settings):
    """Lines saying what the peers will be, without importing torch."""
    if not settings.peers:
        return ["peers: not run (--no-peers)"]
    has_torch = importlib.util.find_spec("torch") is not None
    has_fa = importlib.util.find_spec("flash_attn") is not None
    torch_state = "torch found; CUDA checked at run time" if has_torch else "no torch here: Flex and FA2 show -"
    return [
        f"peers ({torch_state}):",
        "  Flex: torch.compile(flex_attention, dynamic=False), one callable for all rows; create_block_mask per row",
        "        (causal, sliding window, layout lookup, document mask over the packed varlen sequence)",
        "  FA2: torch SDPA FLASH_ATTENTION backend on the dense rows; window and varlen "
        + ("through the flash_attn package (found)" if has_fa else "n/a (not in SDPA; no flash_attn package)"),
    ]


def plan_lines(rows, settings, out_dir):
    """The --dry-run output: settings, peers and every row with its shape, mask, visible pairs and FLOPs."""
    directions = "fwd+bwd" if settings.backward else "fwd"
    lines = [
        (f"plan (dry run, no GPU touched): {len(rows)} rows, {directions}; {harness.warmup_text(settings)}, median of "
         f"{settings.repeats} {'per-call' if settings.timing == 'per-call' else 'CUDA-event'} timings"),
        f"results in {out_dir}",
        (f"all rows: {DTYPE}, headdim {HEADDIM}, {HEADS} query heads = {HEADS} kv heads, standard-normal inputs "
         f"(seed {SEED} + row number)"),
        f"FLOPs: {harness.VISIBLE_FLOP_CONVENTION}",
        f"vs dense: TFLOP/s over that of the reference row; target >= {TARGET_RATIO} where marked",
        *peer_plan(settings),
        "",
        (f"{'#':>2} {'row':<24} {'q, k, v, dout shape':>22} {'visible pairs':>14} {'of area':>8} "
         f"{'fwd GFLOP':>10} {'bwd GFLOP':>10} {'vs':>9} {'target':>6}"),
    ]
    for index, row in enumerate(rows, 1):
        lines.append(
            f"{index:>2} {row.label:<24} {row.shape_text():>22} {row.visible_pairs:>14,} "
            f"{row.visible_pairs / row.area:>8.2%} {row.flops_fwd / 1e9:>10.1f} "
            f"{f'{row.flops_bwd / 1e9:.1f}' if settings.backward else '-':>10} {row.reference or '-':>9} "
            f"{'>= ' + str(row.target) if row.target else '-':>6}"
        )
        lines.append(f"   {row.mask_text()}")
    lines.append("'of area': visible pairs over batch * heads * seqlen^2 (varlen: heads * total^2, the packed "
                 "sequence FlexAttention sees)")
    return lines


# -------------------------------------------------------------------------------------------- running


@dataclasses.dataclass
class Peers:
    """What runs next to cupyflash: harness.TorchPeers plus FlexAttention and the flash_attn package."""

    torch: object  # harness.TorchPeers or None
    flex: object  # the torch.compile'd flex_attention, or None
    create_block_mask: object
    flash_attn: object  # the flash_attn module, or None
    description: list  # header lines: versions, or why a peer does not run


def load_peers(settings):
    """torch (harness.load_torch), FlexAttention compiled once, and flash_attn if importable."""
    if not settings.peers:
        return Peers(None, None, None, None, ["peers: not run (--no-peers); Flex and FA2 show -"])
    torch_peers, torch_text = harness.load_torch()
    if torch_peers is None:
        return Peers(None, None, None, None, [f"peers: {torch_text}; Flex and FA2 show -"])
    flex, create_block_mask, flex_line = harness.load_flex(torch_peers)
    flash_attn, fa_line = harness.load_flash_attn()
    return Peers(torch_peers, flex, create_block_mask, flash_attn, [f"peers: {torch_text}", flex_line, fa_line])


def cupyflash_calls(row):
    """(forward(q, k, v, lse=False), backward(dout, q, k, v, out, lse)) of cupyflash for one row.

    The BlockMask and cu_seqlens are built here, once, outside the timing; the varlen calls get both
    max_seqlen so they never copy cu_seqlens to the host.
    """
    import cupy

    import cupyflash

    if row.kind == "varlen":
        cu_seqlens = cupy.asarray(row.cu_seqlens)
        lengths = {"max_seqlen_q": row.max_seqlen, "max_seqlen_k": row.max_seqlen}

        def forward(q, k, v, lse=False):
            return cupyflash.flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, return_lse=lse, **lengths)

        def backward(dout, q, k, v, out, lse):
            return cupyflash.flash_attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens,
                                                             **lengths)

        return forward, backward

    if row.kind == "causal":
        options = {"causal": True}
    elif row.kind == "window":
        options = {"window_size": row.window}
    elif row.kind == "block":
        options = {"block_mask": cupyflash.BlockMask.from_dense(cupy.asarray(row.layout), block_size=BLOCK_SIZE)}
    else:
        options = {}

    def forward(q, k, v, lse=False):
        return cupyflash.flash_attention(q, k, v, return_lse=lse, **options)

    def backward(dout, q, k, v, out, lse):
        return cupyflash.flash_attention_backward(dout, q, k, v, out, lse, **options)

    return forward, backward


def bench_cupyflash(row, inputs, settings, forward, backward):
    """cupyflash forward (no lse) and backward (out and lse from an untimed forward)."""
    q, k, v, dout = inputs

    def make_backward():
        out, lse = forward(q, k, v, lse=True)
        return lambda: backward(dout, q, k, v, out, lse)

    results = {"fwd": harness.measure(lambda: (lambda: forward(q, k, v)), row.flops_fwd, settings)}
    if settings.backward:
        results["bwd"] = harness.measure(make_backward, row.flops_bwd, settings)
    return results


def bench_torch_function(peers, row, inputs, settings, attention, layout):
    """A torch attention function timed by :func:`harness.time_torch` (forward, and backward through
    ``out.backward(dout, retain_graph=True)``), and one untimed forward's output (None when it raised) for
    the comparison with cupyflash."""
    torch = peers.torch.torch
    results = harness.time_torch(peers.torch, attention, layout, inputs, row.flops_fwd, row.flops_bwd, settings)
    try:
        with torch.no_grad():
            out = attention(*(layout(torch.from_dlpack(x)) for x in inputs[:3]))
    except Exception:  # noqa: BLE001 (already recorded by the forward's measurement)
        out = None
    return results, out


def flex_layout(row):
    """torch view of a row's array in FlexAttention's (batch, heads, seqlen, headdim) layout."""
    if row.kind == "varlen":
        return lambda t: t.unsqueeze(0).transpose(1, 2)  # (total, heads, d) -> (1, heads, total, d)
    return harness.heads_second


def same_layout(t):
    """FlashAttention's own layouts: (batch, seqlen, heads, headdim) and packed (total, heads, headdim)."""
    return t


def flex_mask_mod(row, torch):
    """FlexAttention's mask_mod equivalent to the row's mask and its (B, H, Q_LEN, KV_LEN), or None (dense).

    seqlen_q = seqlen_k in every row, so the bottom-right aligned masks of cupyflash have the diagonal at
    kv_idx = q_idx.
    """
    if row.kind == "dense":
        return None
    if row.kind == "causal":

        def causal_mask(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx

        return causal_mask, (None, None, row.seqlen, row.seqlen)
    if row.kind == "window":
        left, right = row.window
        if left < 0 or right != 0:
            raise ValueError(f"only windows (left >= 0, 0) have a Flex mask here, got {row.window}")

        def sliding_window_mask(b, h, q_idx, kv_idx):
            return (q_idx - kv_idx <= left) & (kv_idx <= q_idx)

        return sliding_window_mask, (None, None, row.seqlen, row.seqlen)
    if row.kind == "block":
        layout = torch.from_numpy(row.layout[0].copy()).to(TORCH_DEVICE)  # (heads, q_blocks, k_blocks), bool
        block_q, block_k = BLOCK_SIZE

        def block_layout_mask(b, h, q_idx, kv_idx):
            return layout[h, q_idx // block_q, kv_idx // block_k]

        return block_layout_mask, (None, row.heads, row.seqlen, row.seqlen)
    document = torch.from_numpy(numpy.repeat(numpy.arange(len(row.lengths)), row.lengths)).to(TORCH_DEVICE)

    def document_mask(b, h, q_idx, kv_idx):
        return document[q_idx] == document[kv_idx]

    return document_mask, (None, None, row.total, row.total)


def make_flex_block_mask(peers, row):
    """create_block_mask for a row, once, outside the timing; returns (BlockMask or None, info dict)."""
    torch = peers.torch.torch
    spec = flex_mask_mod(row, torch)
    if spec is None:
        return None, {"block_mask": None}
    mask_mod, (batch, heads, q_len, kv_len) = spec
    start = time.perf_counter()
    arguments = {"B": batch, "H": heads, "Q_LEN": q_len, "KV_LEN": kv_len, "device": TORCH_DEVICE,
                 "BLOCK_SIZE": BLOCK_SIZE[0]}
    try:
        block_mask = peers.create_block_mask(mask_mod, _compile=True, **arguments)
    except TypeError:  # a torch whose create_block_mask has no _compile
        block_mask = peers.create_block_mask(mask_mod, **arguments)
    if TORCH_DEVICE == "cuda":
        torch.cuda.synchronize()
    info = {"block_mask": mask_mod.__name__, "create_block_mask_s": time.perf_counter() - start}
    with contextlib.suppress(Exception):  # informative only
        info["flex_sparsity_percent"] = float(block_mask.sparsity())
    return block_mask, info


def bench_flex(peers, row, inputs, settings):
    """FlexAttention with the row's mask; returns (results, out, info)."""
    try:
        block_mask, info = make_flex_block_mask(peers, row)
    except Exception as exc:  # noqa: BLE001 (the mask could not be built: n/a for both directions)
        entry = harness.failed(exc)
        return {d: entry for d in directions_of(settings)}, None, {"block_mask_error": entry["error"]}
    results, out = bench_torch_function(
        peers, row, inputs, settings, lambda q, k, v: peers.flex(q, k, v, block_mask=block_mask), flex_layout(row)
    )
    return results, out, info


def bench_fa2(peers, row, inputs, settings):
    """FlashAttention-2: SDPA's FLASH_ATTENTION backend on the dense rows, the flash_attn package (when
    importable) on the window and varlen rows. Returns (results, out or None, info)."""
    torch = peers.torch.torch
    if row.kind in ("dense", "causal"):
        results = harness.time_sdpa(peers.torch, "torch_fa2", inputs, row.causal, row.flops_fwd, row.flops_bwd, settings)
        return results, None, {"via": "torch SDPA, sdpa_kernel([SDPBackend.FLASH_ATTENTION])"}
    fa = peers.flash_attn
    if row.kind == "block":
        cell = "n/a (no block mask in FA2)"
        reason = "FlashAttention-2 has no block-sparse mask"
    elif fa is None:
        what = "window" if row.kind == "window" else "varlen"
        cell = f"n/a (no {what} in SDPA)"
        reason = f"torch SDPA has no {'window_size' if what == 'window' else 'variable-length'} argument, and the " \
                 "flash_attn package is not importable"
    elif row.kind == "window":
        results, out = bench_torch_function(
            peers, row, inputs, settings, lambda q, k, v: fa.flash_attn_func(q, k, v, window_size=row.window),
            same_layout,
        )
        return results, out, {"via": f"flash_attn.flash_attn_func(window_size={row.window})"}
    else:
        cu_seqlens = torch.from_numpy(row.cu_seqlens).to(TORCH_DEVICE)
        results, out = bench_torch_function(
            peers, row, inputs, settings,
            lambda q, k, v: fa.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, row.max_seqlen, row.max_seqlen),
            same_layout,
        )
        return results, out, {"via": "flash_attn.flash_attn_varlen_func"}
    entry = {"skipped": reason, "cell": cell}
    return {d: entry for d in directions_of(settings)}, None, {"via": None}


def directions_of(settings):
    """The timed directions: fwd, and bwd unless --no-backward."""
    return DIRECTIONS if settings.backward else DIRECTIONS[:1]


def max_abs_diff(torch, peer_out, ours, layout):
    """max |peer - cupyflash| over the output, in float32, in the peer's layout."""
    reference = layout(torch.from_dlpack(ours)).float()
    return float((peer_out.float() - reference).abs().max())


def bench_row(row, number, settings, peers):
    """Every system on one row: fresh inputs shared by all, cached memory released between systems.

    Returns
    -------
    results : dict
        System key -> {"fwd": measurement, "bwd": measurement}.
    info : dict
        Per peer: how it ran (Flex's mask, FA2's route) and its max abs difference from cupyflash's output.
    """
    torch_peers = peers.torch
    inputs = harness.make_inputs(row.shape, harness.dtype(row.dtype), SEED + number)
    harness.release_cached_memory(torch_peers)
    forward, backward = cupyflash_calls(row)
    results = {"cupyflash": bench_cupyflash(row, inputs, settings, forward, backward)}
    info = {}
    if torch_peers is not None:
        torch = torch_peers.torch
        try:
            ours = forward(*inputs[:3])
        except Exception:  # noqa: BLE001 (cupyflash's n/a is recorded already)
            ours = None
        systems = [("flex", bench_flex, flex_layout(row))] if peers.flex is not None else []
        systems.append(("fa2", bench_fa2, same_layout))
        for system, run, layout in systems:
            harness.release_cached_memory(torch_peers)
            results[system], out, info[system] = run(peers, row, inputs, settings)
            if out is not None and ours is not None:
                try:
                    info[system]["max_abs_diff_vs_cupyflash"] = max_abs_diff(torch, out, ours, layout)
                except Exception as exc:  # noqa: BLE001 (informative only)
                    info[system]["max_abs_diff_vs_cupyflash"] = harness.one_line(exc)[:harness.ERROR_CHARS_JSON]
            del out
        del ours
    harness.release_cached_memory(torch_peers)
    return results, info


# ------------------------------------------------------------------------------------------ reporting


def cell(results, system, direction):
    """TFLOP/s, ``n/a`` (raised or unsupported), ``skip`` or ``-`` (not run)."""
    return harness.rate_cell((results or {}).get(system, {}).get(direction))


def ratio(row, results, by_key, direction):
    """cupyflash's TFLOP/s on this row over that on its reference row, or None."""
    if row.reference is None:
        return None
    ours = harness.tflops_of(results, "cupyflash", direction)
    dense = harness.tflops_of(by_key.get(row.reference), "cupyflash", direction)
    return ours / dense if ours is not None and dense else None


def ratio_cell(row, results, by_key, references, direction):
    """The ``vs dense`` cell: the ratio (``*`` when below the row's target), ``ref`` on a reference row."""
    if row.reference is None:
        return "ref" if row.key in references else "-"
    value = ratio(row, results, by_key, direction)
    if value is None:
        return "-"
    missed = row.target is not None and value < row.target
    return f"{value:.2f}" + ("*" if missed else "")


def group_note(results, system):
    """A note that replaces a system's cells (e.g. ``n/a (no window in SDPA)``), or None."""
    entries = list((results or {}).get(system, {}).values())
    notes = {entry.get("cell") for entry in entries}
    return notes.pop() if entries and len(notes) == 1 and None not in notes else None


def table_groups(by_key, references):
    """The final table's groups of columns: (header, columns of (header, width, cell function)); a negative
    width left-aligns."""
    return (
        ("", (
            ("row", -24, lambda row, res: row.label),
            ("seqlen", 8, lambda row, res: row.seqlen_text()),
            ("visible", 7, lambda row, res: harness.si(row.visible_pairs)),
        )),
        ("cupyflash", (
            ("fwd", 6, lambda row, res: cell(res, "cupyflash", "fwd")),
            ("bwd", 6, lambda row, res: cell(res, "cupyflash", "bwd")),
        )),
        ("vs dense", (
            ("fwd", 5, lambda row, res: ratio_cell(row, res, by_key, references, "fwd")),
            ("bwd", 5, lambda row, res: ratio_cell(row, res, by_key, references, "bwd")),
        )),
        ("Flex", (
            ("fwd", 6, lambda row, res: cell(res, "flex", "fwd")),
            ("bwd", 6, lambda row, res: cell(res, "flex", "bwd")),
        )),
        ("FA2", (
            ("fwd", 6, lambda row, res: cell(res, "fa2", "fwd")),
            ("bwd", 6, lambda row, res: cell(res, "fa2", "bwd")),
        )),
    )


#: The table group of each peer system, whose cells a note may replace.
SYSTEM_OF_GROUP = {"cupyflash": "cupyflash", "Flex": "flex", "FA2": "fa2"}


def table_lines(rows, all_results, settings, peer_lines):
    """The final table: TFLOP/s per system and direction, cupyflash's ratio to dense attention."""
    by_key = {row.key: res for row, res in zip(rows, all_results)}
    groups = table_groups(by_key, {row.reference for row in rows})
    timings = "per-call timings" if settings.timing == "per-call" else "timings"
    return [
        (f"TFLOP/s on the visible area (forward 4 * headdim * visible pairs, backward {harness.BACKWARD_FLOP_FACTOR}x), "
         f"median of {settings.repeats} {timings};"),
        (f"{DTYPE}, headdim {HEADDIM}, {HEADS} heads. vs dense: cupyflash's TFLOP/s over the `dense` row's "
         f"(`dense {SHORT_SEQLEN}` for varlen);"),
        f"* below the target {TARGET_RATIO}. n/a: raised or unsupported, -: not run (reasons in results.json).",
        *peer_lines,
        *harness.grouped_table(groups, list(zip(rows, all_results)),
                               note=lambda label, row, res: group_note(res, SYSTEM_OF_GROUP.get(label))),
        *target_lines(rows, by_key, settings),
    ]


def target_checks(rows, by_key, settings):
    """(row, direction, ratio or None, met) for every row with a target and every timed direction."""
    return [
        (row, direction, value, value is not None and value >= row.target)
        for row in rows
        if row.target is not None
        for direction in directions_of(settings)
        for value in (ratio(row, by_key.get(row.key), by_key, direction),)
    ]


def target_lines(rows, by_key, settings):
    """Which targeted rows reach TARGET_RATIO of dense attention's TFLOP/s: a count, then one line per row."""
    checks = target_checks(rows, by_key, settings)
    if not checks:
        return []
    met = sum(ok for *_, ok in checks)
    lines = [f"targets (cupyflash vs dense >= {TARGET_RATIO}): {met} of {len(checks)} met"]
    for row in dict.fromkeys(row for row, *_ in checks):
        parts = [
            f"{direction} {'-' if value is None else f'{value:.2f}'} {'ok' if ok else 'MISSED'}"
            for checked, direction, value, ok in checks
            if checked is row
        ]
        lines.append(f"  {row.label}: {', '.join(parts)}")
    return lines


def progress_line(number, total, row, results, by_key, seconds):
    """One line per finished row: each system's times and TFLOP/s, and cupyflash's ratio to its reference."""
    parts = []
    for system, by_direction in results.items():
        note = group_note(results, system)
        if note is not None:
            parts.append(f"{SYSTEMS[system]} {note}")
            continue
        parts.append(f"{SYSTEMS[system]} {', '.join(harness.progress_text(d, e) for d, e in by_direction.items())}")
        if system == "cupyflash" and row.reference is not None:
            ratios = [ratio(row, results, by_key, d) for d in by_direction]
            parts.append("vs dense " + ", ".join("-" if r is None else f"{r:.2f}" for r in ratios))
    return f"[{number}/{total}] {row.label:<24} | {' | '.join(parts)} ({seconds:.1f} s)"


def note_lines(results, info):
    """Indented lines: why each n/a happened, and peers whose output differs from cupyflash's."""
    lines = harness.note_lines(results, SYSTEMS)
    for system, details in info.items():
        diff = details.get("max_abs_diff_vs_cupyflash")
        if isinstance(diff, float) and not diff <= DIFF_WARN:
            lines.append(f"    {SYSTEMS[system]}: output differs from cupyflash's by up to {diff:.3g} "
                         f"(> {DIFF_WARN}): check the mask")
        if "block_mask_error" in details:
            lines.append(f"    Flex: create_block_mask failed: {details['block_mask_error'][:harness.ERROR_CHARS_PROGRESS]}")
    return lines


def plot(rows, all_results, settings, path):
    """Bar chart of TFLOP/s per row, one bar per system, one panel per direction; False without matplotlib."""
    plt = harness.pyplot()
    if plt is None:
        return False
    directions = directions_of(settings)
    figure, axes = plt.subplots(1, len(directions), figsize=(6.5 * len(directions), 4.2), squeeze=False)
    positions = numpy.arange(len(rows))
    width = 0.8 / len(SYSTEMS)
    for ax, direction in zip(axes[0], directions):
        for index, (system, name) in enumerate(SYSTEMS.items()):
            values = [harness.tflops_of(results, system, direction) for results in all_results]
            heights = [0.0 if value is None else value for value in values]
            if not any(value is not None for value in values):
                continue
            ax.bar(positions + (index - (len(SYSTEMS) - 1) / 2) * width, heights, width, label=name,
                   color=f"C{index}")
        ax.set_xticks(positions, [row.label for row in rows], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("TFLOP/s (visible area)", fontsize=9)
        ax.set_title(f"{DTYPE} headdim {HEADDIM}, {HEADS} heads: {direction}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=8)
        ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


# ----------------------------------------------------------------------------------------------- main


def parse_args(argv):
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description="Benchmark cupyflash's masked (causal, window, block-sparse) and variable-length attention "
        "against dense attention, FlexAttention and FlashAttention-2.",
    )
    harness.add_timing_options(parser, DEFAULT_REPEATS, DEFAULT_WARMUP)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default bench/results/masks)")
    parser.add_argument("--no-peers", action="store_true", help="time cupyflash only (no torch)")
    parser.add_argument("--no-backward", action="store_true", help="time forward passes only")
    parser.add_argument("--quick", action="store_true", help="leave out the 25%% block-sparse row")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit without touching the GPU")
    return parser.parse_args(argv)


def main(argv=None):
    """Run the benchmark (or print its plan); returns the exit status."""
    args = parse_args(argv)
    rows = build_rows(args.quick)
    settings = harness.Settings(args.warmup, args.repeats, not args.no_backward, not args.no_peers,
                                "per-call" if args.per_call else "back-to-back")
    if args.dry_run:
        print("\n".join(plan_lines(rows, settings, args.out)))
        return 0
    harness.require_gpu("masks.py", "--dry-run prints the plan without one.")

    peers = load_peers(settings)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, plot_path, table_path = args.out / "results.json", args.out / "masks.png", args.out / "table.txt"
    torch_description = peers.description[0].removeprefix("peers: ")
    document = {
        "environment": harness.environment(torch_description),
        "peers": peers.description,
        "settings": {**dataclasses.asdict(settings), "quick": args.quick, "seed": SEED},
        "flops": harness.VISIBLE_FLOP_CONVENTION,
        "timing": harness.TIMINGS[settings.timing] + ", after one untimed call. Masks, cu_seqlens and Flex block "
        "masks are built before the untimed call",
        "ratio": f"vs dense: cupyflash TFLOP/s over the reference row's; target >= {TARGET_RATIO}",
        "systems": SYSTEMS,
        "rows": [],
        "targets": [],
    }
    env = document["environment"]
    revision = f" ({env['git']})" if env["git"] else ""
    print(f"cupyflash {env['cupyflash']}{revision} on {env['device']}; CuPy {env['cupy']}")
    print("\n".join(peers.description))
    per_call = " per-call timings" if settings.timing == "per-call" else ""
    print(f"{len(rows)} rows; {harness.warmup_text(settings)}, median of {settings.repeats}{per_call}; results in {args.out}",
          flush=True)

    all_results, by_key = [], {}
    run_start = time.perf_counter()
    for number, row in enumerate(rows, 1):
        start = time.perf_counter()
        results, info = bench_row(row, number, settings, peers)
        all_results.append(results)
        by_key[row.key] = results
        ratios = {d: ratio(row, results, by_key, d) for d in directions_of(settings)}
        document["rows"].append({**row.to_json(), "results": results, "vs_dense": ratios, "peers": info,
                                 "seconds": time.perf_counter() - start})
        harness.write_json(json_path, document)
        lines = [progress_line(number, len(rows), row, results, by_key, time.perf_counter() - start),
                 *note_lines(results, info)]
        print("\n".join(lines), flush=True)

    document["targets"] = [
        {"row": row.key, "direction": direction, "vs_dense": value, "target": row.target, "met": ok}
        for row, direction, value, ok in target_checks(rows, by_key, settings)
    ]
    document["seconds"] = time.perf_counter() - run_start
    harness.write_json(json_path, document)
    table = table_lines(rows, all_results, settings, peers.description)
    table_path.write_text("\n".join(table) + "\n")
    plotted = plot(rows, all_results, settings, plot_path)
    print(f"wrote {json_path}, {table_path}" + (f", {plot_path}" if plotted else " (no plot: matplotlib missing)"))
    print()
    print("\n".join(table), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
