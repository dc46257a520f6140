"""Benchmark score and mask functions written in Python (issue 24) against the built-ins, dense attention
and FlexAttention, in one run.

Run from the repository root::

    python bench/mods.py              # 5 rows at seqlen 16384, forward and backward, with FlexAttention
    python bench/mods.py --quick      # the same rows at seqlen 4096
    python bench/mods.py --dry-run    # print the plan (rows, functions, FLOPs, targets); no GPU

Rows (bf16, head dim 128, 16 heads, batch 1):

- ``softcap``: the score_mod ``30 * tanh(s / 30)`` against the built-in ``softcap=30``;
- ``alibi``: the score_mod ``s - 2^(-8 (h + 1) / 16) * |i - j|`` (slopes from the head: no buffer)
  against the built-in ``alibi_slopes`` with the same slopes;
- ``document``: causal attention within 8 documents of random lengths, a BlockMask from the mask_mod
  ``doc[b, i] == doc[b, j]`` (128 x 128 blocks, built on the device), against dense causal attention,
  TFLOP/s counted on each one's visible pairs; the lengths are multiples of seqlen / 32, so every
  block is full or empty and the kernels never evaluate the function;
- ``ragged``: the same documents with each boundary moved by up to seqlen / 64 either way, so the
  blocks on the boundaries are partial and the kernels evaluate the mask_mod on them;
- ``relbias``: a T5 relative bias ``s + table[h, clip(j - i + 128, 0, 256)]`` with the gradient of its
  float32 (16, 257) table, against plain attention.

Each row's cupyflash calls are timed beside their reference (cupyflash too) and FlexAttention with the same
function (``torch.compile``'d once per row; its block mask from ``create_block_mask``, outside the
timing), then the BlockMask build of the document mask alone (median of the calls, each after a
synchronize, until its layout is on the device). The issue's targets: score_mods within 5% of the
built-ins (at least 0.95x), the document mask at least 0.85x dense causal and 2x FlexAttention, the
relative bias with its table gradient at least 0.8x plain attention, the BlockMask under 1 ms.

Only NumPy is imported at module level: ``--dry-run`` needs no GPU.
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import harness
import numpy

HEADS = 16
HEADDIM = 128
DTYPE = "bf16"
SEQLEN = 16384
QUICK_SEQLEN = 4096
CAP = 30.0
DOCUMENTS = 8
BLOCK_SIZE = (128, 128)
BUCKETS = 257  # relative positions -128 .. 128
SEED = 0
DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 20
DEFAULT_OUT = harness.REPO_ROOT / "bench" / "results" / "mods"
#: The issue's targets: (cupyflash over the reference, cupyflash over FlexAttention) per row.
TARGETS = {"softcap": (0.95, None), "alibi": (0.95, None), "document": (0.85, 2.0), "ragged": (0.85, 2.0),
           "relbias": (0.8, None)}
#: The rows whose BlockMask is a document mask (Row.documents).
DOCUMENT_ROWS = ("document", "ragged")
#: BlockMask.from_mask_mod of the document mask at seqlen 16k: at most this many ms.
BLOCK_MASK_TARGET_MS = 1.0


@dataclasses.dataclass(frozen=True)
class Row:
    """One problem: cupyflash's function form against its ``reference`` (a cupyflash built-in call)."""

    key: str
    label: str
    reference: str
    seqlen: int
    causal: bool = False

    def documents(self):
        """int32 (1, seqlen) document ids: 8 documents of random lengths, multiples of 1/32 of the sequence;
        the ragged row's boundaries each moved by fewer than seqlen / 64 positions (so no document is
        empty)."""
        rng = numpy.random.default_rng(SEED)
        cuts = numpy.sort(rng.choice(numpy.arange(1, 32), DOCUMENTS - 1, replace=False)) * self.seqlen // 32
        shifts = rng.integers(-(self.seqlen // 64) + 1, self.seqlen // 64, DOCUMENTS - 1)
        if self.key == "ragged":
            cuts = cuts + shifts
        return numpy.repeat(numpy.arange(DOCUMENTS, dtype=numpy.int32),
                            numpy.diff(numpy.concatenate([[0], cuts, [self.seqlen]])))[None, :]

    def visible_pairs(self, reference=False):
        """(query, key) pairs the function form (or its reference) computes, summed over heads."""
        if self.key in DOCUMENT_ROWS:
            if reference:
                return HEADS * harness.window_pairs(self.seqlen, self.seqlen, -1, 0)
            lengths = numpy.bincount(self.documents()[0]).astype(numpy.int64)
            return HEADS * int((lengths * (lengths + 1) // 2).sum())
        return HEADS * harness.window_pairs(self.seqlen, self.seqlen, -1, 0 if self.causal else -1)

    def flops(self, direction, reference=False):
        forward = harness.pair_flops(self.visible_pairs(reference), HEADDIM)
        return harness.backward_flops(forward) if direction == "bwd" else forward


def build_rows(quick, keys=None):
    """The rows (``keys``: those of TARGETS to keep, default all)."""
    seqlen = QUICK_SEQLEN if quick else SEQLEN
    rows = [
        Row("softcap", f"softcap {CAP:g} as a score_mod", "softcap=", seqlen),
        Row("alibi", "ALiBi as a score_mod (slopes from h)", "alibi_slopes=", seqlen),
        Row("document", f"{DOCUMENTS} documents, causal (from_mask_mod)", "dense causal", seqlen, causal=True),
        Row("ragged", f"{DOCUMENTS} documents, boundaries inside blocks, causal", "dense causal", seqlen, causal=True),
        Row("relbias", f"T5 bias table ({HEADS}, {BUCKETS}) with its gradient", "plain", seqlen),
    ]
    return [row for row in rows if keys is None or row.key in keys]


def slopes():
    """ALiBi's slopes 2^(-8 (h + 1) / heads), float32 (heads,)."""
    return numpy.exp2(-8.0 * numpy.arange(1, HEADS + 1) / HEADS).astype(numpy.float32)


# ------------------------------------------------------------------------------------------ the functions


def score_mod_of(row):
    """cupyflash's score_mod of a row (None for the document rows)."""
    from cupyflash import mods

    if row.key == "softcap":
        return lambda s, b, h, q, k: CAP * mods.tanh(s / CAP)
    if row.key == "alibi":
        return lambda s, b, h, q, k: s - mods.exp2(-8.0 * (h + 1) / HEADS) * mods.abs(q - k)
    if row.key == "relbias":
        return lambda s, b, h, q, k, table: s + table[h, mods.clip(k - q + 128, 0, BUCKETS - 1)]
    return None


def same_document(b, h, q_idx, kv_idx, doc):
    return doc[b, q_idx] == doc[b, kv_idx]


def cupyflash_calls(row, table):
    """{"ours": (forward, backward), "reference": (forward, backward)} of cupyflash for a row; forward(q, k,
    v, lse) and backward(dout, q, k, v, out, lse). The document rows' BlockMask is built here."""
    import cupy

    import cupyflash

    def calls(**options):
        def forward(q, k, v, lse=False):
            return cupyflash.flash_attention(q, k, v, causal=row.causal, return_lse=lse, **options)

        def backward(dout, q, k, v, out, lse):
            return cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=row.causal, **options)

        return forward, backward

    if row.key in DOCUMENT_ROWS:
        doc = cupy.asarray(row.documents())
        mask = cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, row.seqlen, row.seqlen, BLOCK_SIZE, (doc,))
        return {"ours": calls(block_mask=mask), "reference": calls()}
    ours = {"score_mod": score_mod_of(row)}
    if row.key == "relbias":
        ours["score_mod_buffers"] = (table,)
    reference = {"softcap": {"softcap": CAP}, "alibi": {"alibi_slopes": cupy.asarray(slopes())}}.get(row.key, {})
    return {"ours": calls(**ours), "reference": calls(**reference)}


def flex_functions(row, torch, table):
    """FlexAttention's (score_mod, mask_mod) of a row, on torch tensors."""
    if row.key == "softcap":
        return (lambda s, b, h, q, k: CAP * torch.tanh(s / CAP)), None
    if row.key == "alibi":
        sl = torch.from_numpy(slopes()).cuda()
        return (lambda s, b, h, q, k: s - sl[h] * (q - k).abs()), None
    if row.key == "relbias":
        return (lambda s, b, h, q, k: s + table[h, (k - q + 128).clamp(0, BUCKETS - 1)]), None
    doc = torch.from_numpy(row.documents()).cuda()
    return None, (lambda b, h, q, k: (doc[b, q] == doc[b, k]) & (k <= q))


# ---------------------------------------------------------------------------------------------- timing


def bench_cupyflash(row, inputs, settings, forward, backward, reference):
    q, k, v, dout = inputs

    def make_backward():
        out, lse = forward(q, k, v, lse=True)
        return lambda: backward(dout, q, k, v, out, lse)

    results = {"fwd": harness.measure(lambda: (lambda: forward(q, k, v)), row.flops("fwd", reference), settings)}
    if settings.backward:
        results["bwd"] = harness.measure(make_backward, row.flops("bwd", reference), settings)
    return results


def bench_row(row, inputs, table, settings, peers, rounds):
    """cupyflash's function form, its reference and FlexAttention on one row, ``rounds`` times in a new
    order each round (harness.balanced_order: the card's clocks follow what ran just before), each
    measurement the median of its rounds' medians (harness.combine_rounds)."""
    calls = cupyflash_calls(row, table)
    systems = {"ours": lambda: bench_cupyflash(row, inputs, settings, *calls["ours"], False),
               "reference": lambda: bench_cupyflash(row, inputs, settings, *calls["reference"], True)}
    if peers is not None and peers.flex is not None:
        def flex():
            try:
                return bench_flex(peers, row, inputs + (table,), settings)
            except Exception as exc:  # noqa: BLE001 (a peer that cannot run shows n/a)
                return {d: harness.failed(exc) for d in ("fwd", "bwd")}

        systems["flex"] = flex
    return harness.run_rounds(systems, rounds, peers.torch if peers is not None else None)


def bench_flex(peers, row, inputs, settings):
    """FlexAttention with the row's functions; the relative bias's backward takes the table's gradient."""
    torch = peers.torch.torch
    table = torch.from_dlpack(inputs[4]).clone().requires_grad_()
    score_mod, mask_mod = flex_functions(row, torch, table)
    block_mask = None
    if mask_mod is not None:
        block_mask = peers.create_block_mask(mask_mod, 1, None, row.seqlen, row.seqlen, device="cuda",
                                             BLOCK_SIZE=BLOCK_SIZE[0])

    def attention(q, k, v, score_mod=score_mod):
        return peers.flex(q, k, v, score_mod=score_mod, block_mask=block_mask)

    if row.key != "relbias":
        return harness.time_torch(peers.torch, attention, harness.heads_second, inputs[:4], row.flops("fwd"),
                                  row.flops("bwd"), settings)
    q, k, v, dout = inputs[:4]
    constant, _ = flex_functions(row, torch, table.detach())  # the forward alone builds no graph

    def make_forward():
        qt, kt, vt = (harness.heads_second(torch.from_dlpack(x)) for x in (q, k, v))
        return lambda: attention(qt, kt, vt, constant)

    def make_backward():
        leaves = [torch.from_dlpack(x).requires_grad_() for x in (q, k, v)]
        out = attention(*(harness.heads_second(leaf) for leaf in leaves))
        dout_t = harness.heads_second(torch.from_dlpack(dout))

        def backward():
            for leaf in leaves + [table]:
                leaf.grad = None
            out.backward(dout_t, retain_graph=True)

        return backward

    results = {"fwd": harness.measure(make_forward, row.flops("fwd"), settings, peers.torch.clock)}
    if settings.backward:
        results["bwd"] = harness.measure(make_backward, row.flops("bwd"), settings, peers.torch.clock)
    return results


def block_mask_ms(row, repeats):
    """Median ms of BlockMask.from_mask_mod for the document row, each call after a synchronize until its
    layout is complete (the first call, which compiles the kernel, untimed)."""
    import cupy

    import cupyflash

    doc = cupy.asarray(row.documents())

    def build():
        return cupyflash.BlockMask.from_mask_mod(same_document, 1, 1, row.seqlen, row.seqlen, BLOCK_SIZE, (doc,))

    return harness.median(harness.time_per_call(build, 1, repeats))


# ----------------------------------------------------------------------------------------------- report


def ratio(a, b):
    return None if a is None or b is None else a / b


def table_lines(rows, results, settings):
    """The table: per row and direction, cupyflash's TFLOP/s, its reference's, FlexAttention's, the ratios
    and the targets."""
    header = f"{'row':<10} {'dir':<4} {'ours':>7} {'ref':>7} {'x ref':>6} {'target':>6} {'Flex':>7} {'x Flex':>7} {'target':>6}"
    lines = [header]
    for row in rows:
        r = results[row.key]
        target_ref, target_flex = TARGETS[row.key]
        for direction in ("fwd", "bwd") if settings.backward else ("fwd",):
            ours = harness.tflops_of(r, "ours", direction)
            ref = harness.tflops_of(r, "reference", direction)
            flex = harness.tflops_of(r, "flex", direction)
            cells = [harness.rate_cell(r.get(s, {}).get(direction)) for s in ("ours", "reference", "flex")]
            x_ref, x_flex = ratio(ours, ref), ratio(ours, flex)
            lines.append(
                f"{row.key:<10} {direction:<4} {cells[0]:>7} {cells[1]:>7} "
                f"{'-' if x_ref is None else f'{x_ref:.2f}':>6} {target_ref:>6} {cells[2]:>7} "
                f"{'-' if x_flex is None else f'{x_flex:.2f}':>7} {target_flex or '-':>6}"
            )
    return lines


def plan_lines(rows, settings, rounds=1):
    in_rounds = f" in each of {rounds} rounds (balanced orders), the median of the rounds'" if rounds > 1 else ""
    lines = [f"{len(rows)} rows, {DTYPE} d{HEADDIM} h{HEADS} b1; {harness.warmup_text(settings)}, median of "
             f"{settings.repeats}{in_rounds}; {'forward and backward' if settings.backward else 'forward only'}; "
             f"peers: {'FlexAttention (torch)' if settings.peers else 'none (--no-peers)'}"]
    for row in rows:
        target_ref, target_flex = TARGETS[row.key]
        flex = f", >= {target_flex}x Flex" if target_flex else ""
        lines.append(f"  {row.key:<9} s{row.seqlen}: {row.label} vs {row.reference}; {harness.si(row.flops('fwd'))} "
                     f"FLOP fwd ({harness.si(row.flops('fwd', True))} reference); target >= {target_ref}x{flex}")
    lines.append(f"  BlockMask.from_mask_mod of the document mask ({BLOCK_SIZE[0]}x{BLOCK_SIZE[1]} blocks): "
                 f"target < {BLOCK_MASK_TARGET_MS} ms")
    return lines


# ------------------------------------------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Benchmark score and mask functions (issue 24) against the "
                                     "built-ins, dense attention and FlexAttention.")
    harness.add_timing_options(parser, DEFAULT_REPEATS, DEFAULT_WARMUP)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default bench/results/mods)")
    parser.add_argument("--no-peers", action="store_true", help="time cupyflash only (no torch)")
    parser.add_argument("--no-backward", action="store_true", help="time forward passes only")
    parser.add_argument("--quick", action="store_true", help=f"seqlen {QUICK_SEQLEN} instead of {SEQLEN}")
    parser.add_argument("--rows", type=lambda text: text.split(","), default=None,
                        help=f"comma-separated rows to run (default all: {','.join(TARGETS)})")
    parser.add_argument("--rounds", type=harness.positive_int, default=1,
                        help="time each row's systems this many times, in a balanced order that changes each round; each "
                        "figure is the median of the rounds' medians (default 1)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit without touching the GPU")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.rows or ()) - set(TARGETS))
    if unknown:
        parser.error(f"unknown rows {unknown}: expected some of {sorted(TARGETS)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    rows = build_rows(args.quick, args.rows)
    settings = harness.Settings(args.warmup, args.repeats, not args.no_backward, not args.no_peers,
                                "per-call" if args.per_call else "back-to-back")
    if args.dry_run:
        print("\n".join(plan_lines(rows, settings, args.rounds)))
        return 0
    harness.require_gpu("mods.py", "--dry-run prints the plan without one.")
    import cupy

    peers, flex, create_block_mask, description = None, None, None, "peers: not run (--no-peers)"
    if settings.peers:
        torch_peers, description = harness.load_torch()
        if torch_peers is not None:
            flex, create_block_mask, line = harness.load_flex(torch_peers)
            description += "\n" + line
            peers = argparse.Namespace(torch=torch_peers, flex=flex, create_block_mask=create_block_mask)
    args.out.mkdir(parents=True, exist_ok=True)
    settings_record = {**dataclasses.asdict(settings), "rounds": args.rounds}
    document = {"environment": harness.environment(description), "settings": settings_record,
                "flops": harness.VISIBLE_FLOP_CONVENTION, "targets": TARGETS, "rows": {}}
    print("\n".join(plan_lines(rows, settings, args.rounds)))
    print(description, flush=True)
    results = {}
    for number, row in enumerate(rows):
        start = time.perf_counter()
        shape = (1, row.seqlen, HEADS, HEADDIM)
        inputs = harness.make_inputs(shape, harness.dtype(DTYPE), SEED + number)
        table = cupy.random.RandomState(SEED).standard_normal((HEADS, BUCKETS), dtype=numpy.float32)
        r = bench_row(row, inputs, table, settings, peers, args.rounds)
        results[row.key] = r
        document["rows"][row.key] = {"label": row.label, "reference": row.reference, "seqlen": row.seqlen,
                                     "results": r, "seconds": time.perf_counter() - start}
        harness.write_json(args.out / "results.json", document)
        del inputs
        harness.release_cached_memory(peers.torch if peers is not None else None)
        print(f"[{number + 1}/{len(rows)}] {row.key} done in {time.perf_counter() - start:.1f} s", flush=True)
    lines = table_lines(rows, results, settings)
    # The BlockMask build is the document row's (--rows without it times none).
    document_row = next((r for r in rows if r.key == "document"), None)
    if document_row is not None:
        build_ms = block_mask_ms(document_row, settings.repeats)
        document["block_mask_ms"] = build_ms
        harness.write_json(args.out / "results.json", document)
        lines.append(f"BlockMask.from_mask_mod, {document_row.seqlen} x {document_row.seqlen}: {build_ms:.3f} ms "
                     f"(target < {BLOCK_MASK_TARGET_MS} ms)")
    (args.out / "table.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
