"""Benchmark cupyflash against plain CuPy attention, FlashAttention-2 and cuDNN (the last two through torch).

Run from the repository root (cupyflash installed, or ``PYTHONPATH=$PWD``)::

    python bench/bench.py            # full grid (48 rows) and the memory report
    python bench/bench.py --quick    # 8 rows, for a device session with little time
    python bench/bench.py --dry-run  # print the plan; touches no GPU

The grid is FlashAttention's benchmark grid: batch * seqlen = 16384 tokens and heads * headdim = 2048.
Each row times cupyflash (forward, backward and deterministic backward), plain CuPy attention
(forward) and, when torch with CUDA is importable, ``torch.nn.functional.scaled_dot_product_attention``
restricted to its FlashAttention-2 and its cuDNN backend (16-bit rows) or to its memory-efficient and
its math backend (float32 and float64 rows, TF32 off), forward and backward. Times are medians of
CUDA-event timings of calls enqueued back to back (``--per-call``: of calls made alone, host time
included); FLOPs follow FlashAttention's convention (:func:`harness.forward_flops`). ``bench/README.md``
describes the output.
"""

import argparse
import dataclasses
import functools
import importlib.util
import sys
import time
from pathlib import Path

import harness
import numpy

#: Tokens per row: batch * seqlen (FlashAttention's benchmark grid).
TOTAL_TOKENS = 16384
#: Model width per row: heads * headdim.
MODEL_DIM = 2048
#: Benchmarked dtypes (keys of harness.DTYPE_BYTES).
DTYPES = ("bf16", "fp16", "fp32", "fp64")
#: Rows of these dtypes are timed against torch's memory-efficient and math backends (the others against
#: FlashAttention-2 and cuDNN, which take 16-bit inputs only).
WIDE_DTYPES = ("fp32", "fp64")
#: The default grid.
FULL_GRID = {
    "dtypes": ("bf16", "fp16"),
    "headdims": (64, 128),
    "causal": (False, True),
    "seqlens": (512, 1024, 2048, 4096, 8192, 16384),
}
#: The ``--quick`` grid.
QUICK_GRID = {
    "dtypes": ("bf16",),
    "headdims": (64, 128),
    "causal": (False, True),
    "seqlens": (1024, 16384),
}
DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 20
DEFAULT_OUT = harness.REPO_ROOT / "bench" / "results"
#: Plain CuPy attention runs when its float32 score matrix is at most this fraction of free memory.
PLAIN_CUPY_MEMORY_FRACTION = 0.4
#: Bytes per element of the float32 score matrix of plain CuPy attention.
SCORE_BYTES = 4
#: The memory report's problem: one forward and backward, non-causal.
MEMORY_PROBLEM = {"batch": 1, "seqlen": 65536, "heads": 16, "headdim": 128, "dtype": "bf16", "causal": False}
#: Plain CuPy attention's memory is measured at the largest of these that fits.
PLAIN_CUPY_MEMORY_SEQLENS = (65536, 32768, 16384, 8192, 4096, 2048, 1024)
#: CuPy (14.2) has no bfloat16 matmul ("data type 'E' not understood"): plain CuPy runs float16 only,
#: and its memory baseline uses float16 (same bytes per element as the bf16 problem).
PLAIN_CUPY_DTYPES = ("fp16", "fp32")
PLAIN_CUPY_MEMORY_DTYPE = "fp16"
#: Seqlen of the small untimed call that compiles the memory report's kernels outside its pool.
COMPILE_SEQLEN = 256
#: Seed of the input generator; each row and array draws fresh values.
SEED = 0
GIB = 2**30

#: System keys, in table order, with their display names.
SYSTEMS = {
    "cupyflash": "cupyflash",
    "cupy": "plain CuPy",
    "torch_fa2": "torch SDPA FlashAttention-2",
    "torch_cudnn": "torch SDPA cuDNN",
    "torch_efficient": "torch SDPA memory-efficient",
    "torch_math": "torch SDPA math",
}
#: The torch systems (keys of harness.TORCH_BACKENDS) of 16-bit rows and of WIDE_DTYPES rows.
TORCH_SYSTEMS = ("torch_fa2", "torch_cudnn")
WIDE_TORCH_SYSTEMS = ("torch_efficient", "torch_math")
#: Short names in the progress lines and the final table.
SHORT_NAMES = {"cupyflash": "cupyflash", "cupy": "CuPy", "torch_fa2": "FA2", "torch_cudnn": "cuDNN",
               "torch_efficient": "eff", "torch_math": "math"}


# ----------------------------------------------------------------------------------------------- grid


@dataclasses.dataclass(frozen=True)
class Row:
    """One problem of the grid: q, k, v, dout of shape (batch, seqlen, heads, headdim)."""

    dtype: str
    headdim: int
    causal: bool
    seqlen: int
    batch: int
    heads: int

    @property
    def shape(self):
        """Shape (batch, seqlen, heads, headdim) of q, k, v and dout."""
        return (self.batch, self.seqlen, self.heads, self.headdim)

    @property
    def flops_fwd(self):
        """Forward FLOPs, see :func:`harness.forward_flops`."""
        return harness.forward_flops(self.batch, self.heads, self.seqlen, self.seqlen, self.headdim, self.causal)

    @property
    def flops_bwd(self):
        """Backward FLOPs: 2.5 times the forward's."""
        return harness.backward_flops(self.flops_fwd)

    @property
    def score_bytes(self):
        """Bytes of plain CuPy attention's float32 score matrix, batch * heads * seqlen^2 * 4."""
        return self.batch * self.heads * self.seqlen * self.seqlen * SCORE_BYTES

    def describe(self):
        """Short text, e.g. ``bf16 d64 causal s2048 b8 h32``."""
        mask = "causal" if self.causal else "full"
        return f"{self.dtype} d{self.headdim} {mask} s{self.seqlen} b{self.batch} h{self.heads}"

    def to_json(self):
        """The row's sizes and FLOPs as a JSON-ready dict."""
        return {**dataclasses.asdict(self), "flops_fwd": self.flops_fwd, "flops_bwd": self.flops_bwd}


def build_grid(dtypes, headdims, causal, seqlens):
    """Rows of the grid in table order (dtype, headdim, causal, seqlen): ``batch = TOTAL_TOKENS // seqlen``
    and ``heads = MODEL_DIM // headdim``, each at least 1; seqlen_q = seqlen_k."""
    return [
        Row(dtype, headdim, is_causal, seqlen, max(1, TOTAL_TOKENS // seqlen), max(1, MODEL_DIM // headdim))
        for dtype in dtypes
        for headdim in headdims
        for is_causal in causal
        for seqlen in seqlens
    ]


# -------------------------------------------------------------------------------------------- systems


def plain_cupy_attention(q, k, v, causal):
    """Attention as a CuPy user writes it; the score matrix lives in device memory.

    Parameters
    ----------
    q : cupy.ndarray, shape (batch, seqlen_q, heads, headdim)
        Queries.
    k, v : cupy.ndarray, shape (batch, seqlen_k, heads, headdim)
        Keys and values (as many heads as q).
    causal : bool
        Masks key j > query i + seqlen_k - seqlen_q with -inf (bottom-right aligned, as cupyflash). A
        row that sees no key becomes NaN; the grid has seqlen_q = seqlen_k, where none does.

    Returns
    -------
    cupy.ndarray, shape (batch, seqlen_q, heads, headdim), dtype of q
        ``q k^T`` by cupy.matmul in the input dtype on (batch, heads, seqlen, headdim) views, scaled
        by 1/sqrt(headdim) and softmaxed in float32 (in place), cast back, times v.
    """
    import cupy

    qt, kt, vt = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    scores = cupy.matmul(qt, kt.transpose(0, 1, 3, 2))
    probs = scores.astype(numpy.float32)
    del scores
    probs *= numpy.float32(1.0 / numpy.sqrt(q.shape[-1]))
    if causal:
        seqlen_q, seqlen_k = probs.shape[-2:]
        hidden = cupy.arange(seqlen_k)[None, :] > cupy.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
        probs += cupy.where(hidden, numpy.float32(-numpy.inf), numpy.float32(0))
    probs -= probs.max(axis=-1, keepdims=True)
    cupy.exp(probs, out=probs)
    probs /= probs.sum(axis=-1, keepdims=True)
    return cupy.matmul(probs.astype(q.dtype), vt).transpose(0, 2, 1, 3)


def bench_cupyflash(row, inputs, settings):
    """cupyflash forward (without lse) and backward (from a forward with lse run before timing)."""
    import cupyflash

    q, k, v, dout = inputs

    # precision= for float32 rows (--precision); every other dtype takes the default.
    options = {"causal": row.causal, "precision": settings_precision(row, settings)}

    def make_forward():
        return lambda: cupyflash.flash_attention(q, k, v, **options)

    def make_backward(deterministic):
        out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
        return lambda: cupyflash.flash_attention_backward(dout, q, k, v, out, lse, deterministic=deterministic, **options)

    results = {"fwd": harness.measure(make_forward, row.flops_fwd, settings)}
    if settings.backward:
        results["bwd"] = harness.measure(lambda: make_backward(False), row.flops_bwd, settings)
        results["bwd_det"] = harness.measure(lambda: make_backward(True), row.flops_bwd, settings)
    return results


def settings_precision(row, settings):
    """cupyflash's precision= for a row: --precision for float32 rows, "highest" for the others."""
    return settings.precision if row.dtype == "fp32" else "highest"


def bench_plain_cupy(row, inputs, settings):
    """Plain CuPy attention, forward only; skipped when its score matrix would crowd the device."""
    import cupy

    q, k, v, _ = inputs
    if row.dtype not in PLAIN_CUPY_DTYPES:
        return {"fwd": harness.skipped(f"CuPy has no {row.dtype} matmul")}
    free_bytes = cupy.cuda.runtime.memGetInfo()[0]
    if row.score_bytes > PLAIN_CUPY_MEMORY_FRACTION * free_bytes:
        return {
            "fwd": harness.skipped(
                f"score matrix {row.score_bytes / GIB:.1f} GiB > {PLAIN_CUPY_MEMORY_FRACTION:.0%} "
                f"of free memory ({free_bytes / GIB:.1f} GiB)"
            )
        }
    return {"fwd": harness.measure(lambda: (lambda: plain_cupy_attention(q, k, v, row.causal)), row.flops_fwd, settings)}


def bench_row(row, seed, settings, peers, rounds=1):
    """Every system on one row: fresh inputs shared by all, cached memory released between systems;
    ``rounds`` times, in a new order each round (harness.balanced_order), each measurement the
    median of its rounds' medians (harness.combine_rounds).

    Returns
    -------
    dict
        System key -> {"fwd": measurement, "bwd": measurement}; the torch systems are present only
        when torch runs, "bwd" only when the backward pass is timed.
    """
    inputs = harness.make_inputs(row.shape, harness.dtype(row.dtype), seed)
    systems = {"cupyflash": lambda: bench_cupyflash(row, inputs, settings)}
    if settings.peers:
        systems["cupy"] = lambda: bench_plain_cupy(row, inputs, settings)
        if peers is not None:
            for system in WIDE_TORCH_SYSTEMS if row.dtype in WIDE_DTYPES else TORCH_SYSTEMS:
                systems[system] = functools.partial(harness.time_sdpa, peers, system, inputs, row.causal,
                                                    row.flops_fwd, row.flops_bwd, settings)
    results = harness.run_rounds(systems, rounds, peers)
    harness.release_cached_memory(peers)
    return results


# --------------------------------------------------------------------------------------------- memory


def pool_usage(compute):
    """Device memory of ``compute()`` taken from a fresh memory pool.

    Parameters
    ----------
    compute : callable
        Returns a dict name -> cupy.ndarray of the arrays the API returned.

    Returns
    -------
    pool_bytes : int
        ``pool.total_bytes()`` after the calls: every byte the pool acquired, an upper bound of the peak.
    returned : dict
        name -> nbytes of each returned array.
    """
    import cupy

    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        arrays = compute()
        harness.synchronize()
    pool_bytes = pool.total_bytes()
    returned = {name: int(array.nbytes) for name, array in arrays.items()}
    del arrays
    pool.free_all_blocks()
    return int(pool_bytes), returned


def memory_entry(seqlen, pool_bytes, returned):
    """JSON-ready memory measurement: pool bytes, returned bytes, and the extra in between."""
    returned_bytes = sum(returned.values())
    return {
        "seqlen": seqlen,
        "pool_bytes": pool_bytes,
        "returned_bytes": returned_bytes,
        "returned": returned,
        "extra_bytes": pool_bytes - returned_bytes,
    }


def memory_shape(seqlen):
    """(batch, seqlen, heads, headdim) of the memory report's problem at ``seqlen``."""
    return (MEMORY_PROBLEM["batch"], seqlen, MEMORY_PROBLEM["heads"], MEMORY_PROBLEM["headdim"])


def cupyflash_memory():
    """Peak extra memory of one cupyflash forward and backward on :data:`MEMORY_PROBLEM`.

    A small call with the same dtype, head dim and mask compiles the kernels first, outside the pool.
    """
    import cupyflash

    causal, dtype = MEMORY_PROBLEM["causal"], harness.dtype(MEMORY_PROBLEM["dtype"])

    def forward_backward(q, k, v, dout):
        out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
        dq, dk, dv = cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal)
        return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}

    try:
        forward_backward(*harness.make_inputs(memory_shape(COMPILE_SEQLEN), dtype, SEED))
        inputs = harness.make_inputs(memory_shape(MEMORY_PROBLEM["seqlen"]), dtype, SEED + 1)
        return memory_entry(MEMORY_PROBLEM["seqlen"], *pool_usage(lambda: forward_backward(*inputs)))
    except Exception as exc:  # noqa: BLE001 (reported next to the other numbers instead of ending the run)
        return harness.failed(exc)


def plain_cupy_pool_usage(seqlen):
    """:func:`pool_usage` of one plain CuPy attention forward on the memory report's problem at ``seqlen``."""
    q, k, v, _ = harness.make_inputs(memory_shape(seqlen), harness.dtype(PLAIN_CUPY_MEMORY_DTYPE), SEED + 2)
    return pool_usage(lambda: {"out": plain_cupy_attention(q, k, v, MEMORY_PROBLEM["causal"])})


def plain_cupy_memory():
    """Extra memory of plain CuPy attention's forward at the largest seqlen that fits (one call each)."""
    import cupy

    out_of_memory = []
    for seqlen in PLAIN_CUPY_MEMORY_SEQLENS:
        entry = None
        try:
            entry = {**memory_entry(seqlen, *plain_cupy_pool_usage(seqlen)), "out_of_memory_at": out_of_memory}
        except cupy.cuda.memory.OutOfMemoryError:
            out_of_memory.append(seqlen)
        except Exception as exc:  # noqa: BLE001 (reported next to the other numbers instead of ending the run)
            entry = harness.failed(exc)
        harness.release_cached_memory()
        if entry is not None:
            return entry
    return {"error": f"out of memory at every seqlen in {PLAIN_CUPY_MEMORY_SEQLENS}"}


def memory_report(peers, with_plain_cupy):
    """Measure cupyflash's memory (and plain CuPy's); the report for results.json and :func:`memory_lines`."""
    harness.release_cached_memory(peers)
    report = {"problem": MEMORY_PROBLEM, "cupyflash": cupyflash_memory()}
    if with_plain_cupy:
        harness.release_cached_memory(peers)
        report["cupy"] = plain_cupy_memory()
    harness.release_cached_memory(peers)
    return report


def memory_lines(report):
    """Text lines of a memory report."""
    p = report["problem"]
    lines = [
        (f"memory ({p['dtype']}, batch {p['batch']}, heads {p['heads']}, headdim {p['headdim']}, "
         f"{'causal' if p['causal'] else 'non-causal'}; fresh cupy.cuda.MemoryPool, inputs outside it):")
    ]
    labels = {"cupyflash": "cupyflash fwd+bwd", "cupy": f"plain CuPy fwd ({PLAIN_CUPY_MEMORY_DTYPE})"}
    for system, label in labels.items():
        entry = report.get(system)
        if entry is None:
            continue
        if "error" in entry:
            lines.append(f"  {label}: n/a ({entry['error'][:harness.ERROR_CHARS_PROGRESS]})")
            continue
        oom = entry.get("out_of_memory_at")
        oom_text = f" ({', '.join(map(str, oom))}: out of memory)" if oom else ""
        lines.append(
            f"  {label}, seqlen {entry['seqlen']}{oom_text}: pool {entry['pool_bytes'] / GIB:.3f} GiB; "
            f"returned {'+'.join(entry['returned'])} {entry['returned_bytes'] / GIB:.3f} GiB; "
            f"extra {entry['extra_bytes'] / GIB:.3f} GiB"
        )
    return lines


# ------------------------------------------------------------------------------------------ reporting


def cell(results, system, direction):
    """Table cell: TFLOP/s, ``n/a`` (raised), ``skip`` (not attempted) or ``-`` (not run)."""
    return harness.rate_cell(results.get(system, {}).get(direction))


def ratio_cell(results, peer, direction):
    """cupyflash TFLOP/s over a peer's, or ``-``."""
    ours, theirs = harness.tflops_of(results, "cupyflash", direction), harness.tflops_of(results, peer, direction)
    return f"{ours / theirs:.2f}" if ours is not None and theirs else "-"


def progress_line(index, total, row, results, seconds):
    """One line per finished row: each system's times and TFLOP/s."""
    parts = [
        f"{SHORT_NAMES[system]} {', '.join(harness.progress_text(d, e) for d, e in by_direction.items())}"
        for system, by_direction in results.items()
    ]
    return f"[{index:>2}/{total}] {row.describe():<30} | {' | '.join(parts)} ({seconds:.1f} s)"


def tflops_column(system, direction, width):
    """A table column of one system's TFLOP/s: (header, width, cell function)."""
    return (direction, width, lambda row, results: cell(results, system, direction))


def ratio_column(peer, direction, width):
    """A table column of cupyflash's TFLOP/s over a peer's: (header, width, cell function)."""
    return (direction, width, lambda row, results: ratio_cell(results, peer, direction))


#: The final table: groups of columns, each (group header, columns of (header, width, cell function)).
TABLE_GROUPS = (
    (
        "",
        (
            ("dtype", 5, lambda row, results: row.dtype),
            ("hd", 3, lambda row, results: str(row.headdim)),
            ("causal", 6, lambda row, results: "yes" if row.causal else "no"),
            ("seqlen", 6, lambda row, results: str(row.seqlen)),
            ("batch", 5, lambda row, results: str(row.batch)),
        ),
    ),
    (
        "cupyflash",
        (
            tflops_column("cupyflash", "fwd", 6),
            tflops_column("cupyflash", "bwd", 6),
            ("det", 6, lambda row, results: cell(results, "cupyflash", "bwd_det")),
        ),
    ),
    ("CuPy", (tflops_column("cupy", "fwd", 6),)),
    ("FA2", (tflops_column("torch_fa2", "fwd", 6), tflops_column("torch_fa2", "bwd", 6))),
    ("cuDNN", (tflops_column("torch_cudnn", "fwd", 6), tflops_column("torch_cudnn", "bwd", 6))),
    ("flash/FA2", (ratio_column("torch_fa2", "fwd", 5), ratio_column("torch_fa2", "bwd", 5))),
    ("flash/cuDNN", (ratio_column("torch_cudnn", "fwd", 5), ratio_column("torch_cudnn", "bwd", 5))),
)
#: The table of WIDE_DTYPES rows: the same, against torch's memory-efficient and math backends.
WIDE_TABLE_GROUPS = (
    *TABLE_GROUPS[:3],
    ("eff", (tflops_column("torch_efficient", "fwd", 6), tflops_column("torch_efficient", "bwd", 6))),
    ("math", (tflops_column("torch_math", "fwd", 6), tflops_column("torch_math", "bwd", 6))),
    ("flash/eff", (ratio_column("torch_efficient", "fwd", 5), ratio_column("torch_efficient", "bwd", 5))),
    ("flash/math", (ratio_column("torch_math", "fwd", 5), ratio_column("torch_math", "bwd", 5))),
)


def timing_text(settings):
    """``median of 20 CUDA-event timings`` (or ``per-call timings``)."""
    kind = "per-call" if settings.timing == "per-call" else "CUDA-event"
    return f"median of {settings.repeats} {kind} timings"


def table_lines(rows, all_results, settings):
    """The final table: one line per row, TFLOP/s of each system and cupyflash's ratios to the peers; the
    WIDE_DTYPES rows in a second table against their peers."""
    pairs = list(zip(rows, all_results))
    narrow = [pair for pair in pairs if pair[0].dtype not in WIDE_DTYPES]
    wide = [pair for pair in pairs if pair[0].dtype in WIDE_DTYPES]
    lines = [
        (f"TFLOP/s, {timing_text(settings)}. FLOPs: forward 4*b*h*s_q*s_k*d "
         f"(halved when causal), backward {harness.BACKWARD_FLOP_FACTOR}x forward."),
        ("flash/<peer>: cupyflash's TFLOP/s over that system's (eff, math: torch SDPA's memory-efficient and math "
         "backends, TF32 off). n/a: raised, skip: not attempted (reasons in results.json), -: not run."),
    ]
    if narrow:
        lines += harness.grouped_table(TABLE_GROUPS, narrow)
    if wide:
        lines += ([""] if narrow else []) + harness.grouped_table(WIDE_TABLE_GROUPS, wide)
    return lines


def plan_lines(rows, settings, run_memory, out_dir):
    """The --dry-run output: systems, settings and every planned row with its shape and FLOPs."""
    torch_state = "torch found; CUDA checked at run time" if importlib.util.find_spec("torch") else "no torch: skipped"
    systems = ["cupyflash fwd" + ("+bwd" if settings.backward else "")]
    if settings.peers:
        systems.append("plain CuPy fwd")
        torch_keys = [key for key in TORCH_SYSTEMS if any(row.dtype not in WIDE_DTYPES for row in rows)]
        torch_keys += [key for key in WIDE_TORCH_SYSTEMS if any(row.dtype in WIDE_DTYPES for row in rows)]
        systems += [f"{SYSTEMS[key]} fwd" + ("+bwd" if settings.backward else "") for key in torch_keys]
    lines = [
        (f"plan (dry run, no GPU touched): {len(rows)} rows; {harness.warmup_text(settings)}, {timing_text(settings)}; "
         f"results in {out_dir}"),
        f"systems: {', '.join(systems)}" + (f" ({torch_state})" if settings.peers else ""),
        f"FLOPs: {harness.FLOP_CONVENTION}",
        (f"{'#':>3} {'dtype':>5} {'hd':>4} {'causal':>6} {'seqlen':>6} {'batch':>5} {'heads':>5} "
         f"{'q, k, v, dout shape':>22} {'fwd GFLOP':>10} {'bwd GFLOP':>10} {'CuPy scores GiB':>16}"),
    ]
    for index, row in enumerate(rows, 1):
        lines.append(
            f"{index:>3} {row.dtype:>5} {row.headdim:>4} {'yes' if row.causal else 'no':>6} {row.seqlen:>6} "
            f"{row.batch:>5} {row.heads:>5} {row.shape!s:>22} {row.flops_fwd / 1e9:>10.1f} "
            f"{row.flops_bwd / 1e9:>10.1f} {row.score_bytes / GIB:>16.2f}"
        )
    if run_memory:
        p = MEMORY_PROBLEM
        lines.append(
            f"memory report: cupyflash fwd+bwd at {p['dtype']} batch {p['batch']} seqlen {p['seqlen']} heads "
            f"{p['heads']} headdim {p['headdim']} causal {p['causal']}"
            + (f"; plain CuPy fwd at the largest seqlen of {PLAIN_CUPY_MEMORY_SEQLENS} that fits" if settings.peers else "")
        )
    else:
        lines.append("memory report: not run (add --memory)")
    return lines


def plot(rows, all_results, settings, path):
    """TFLOP/s against seqlen, one subplot per (dtype, headdim, causal, direction), one line per system.

    Returns
    -------
    bool
        False when matplotlib is not importable (nothing is written).
    """
    plt = harness.pyplot()
    if plt is None:
        return False
    directions = ("fwd", "bwd") if settings.backward else ("fwd",)
    panel_rows = list(dict.fromkeys((row.dtype, row.headdim) for row in rows))
    panel_cols = [(causal, d) for causal in dict.fromkeys(row.causal for row in rows) for d in directions]
    figure, axes = plt.subplots(
        len(panel_rows), len(panel_cols), figsize=(4.5 * len(panel_cols), 3.2 * len(panel_rows)), squeeze=False
    )
    for i, (dtype, headdim) in enumerate(panel_rows):
        for j, (causal, direction) in enumerate(panel_cols):
            ax = axes[i][j]
            selected = [
                (row.seqlen, results)
                for row, results in zip(rows, all_results)
                if (row.dtype, row.headdim, row.causal) == (dtype, headdim, causal)
            ]
            for color, (system, label) in enumerate(SYSTEMS.items()):
                points = [(s, harness.tflops_of(res, system, direction)) for s, res in selected]
                points = [(s, t) for s, t in points if t is not None]
                if points:
                    ax.plot(*zip(*points), marker="o", color=f"C{color}", label=label)
            seqlens = [s for s, _ in selected]
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
            ax.set_xticks(seqlens, [str(s) for s in seqlens])
            ax.set_title(f"{dtype} headdim {headdim} {'causal' if causal else 'non-causal'} {direction}", fontsize=9)
            ax.set_xlabel(f"seqlen (batch = {TOTAL_TOKENS} / seqlen)", fontsize=8)
            ax.set_ylabel("TFLOP/s", fontsize=8)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    figure.legend(list(handles.values()), list(handles), loc="lower center", ncol=max(1, len(handles)), fontsize=9)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


# ----------------------------------------------------------------------------------------------- main


def causal_flag(text):
    """Convert an option item 0 or 1 to a bool (ValueError otherwise)."""
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


def parse_args(argv):
    """Command-line options; axis options left out are None (filled from the full or quick grid)."""
    parser = argparse.ArgumentParser(
        description="Benchmark cupyflash against plain CuPy attention and torch SDPA (FlashAttention-2, cuDNN).",
    )
    parser.add_argument("--dtypes", type=lambda t: harness.parse_list(t, str, DTYPES), help="e.g. bf16,fp16 (also fp32, fp64)")
    parser.add_argument("--headdims", type=lambda t: harness.parse_list(t, harness.positive_int), help="e.g. 64,128")
    parser.add_argument("--causal", type=lambda t: harness.parse_list(t, causal_flag), help="0, 1 or 0,1")
    parser.add_argument(
        "--seqlens", type=lambda t: harness.parse_list(t, harness.positive_int),
        help="e.g. 1024,16384 (batch = 16384 // seqlen)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small grid: bf16, headdim 64,128, causal 0,1, seqlen 1024,16384 (axis options still override)",
    )
    parser.add_argument("--no-backward", action="store_true", help="time forward passes only")
    parser.add_argument("--no-peers", action="store_true", help="time cupyflash only (no plain CuPy, no torch)")
    parser.add_argument("--precision", choices=("highest", "tf32"), default="highest",
                        help="cupyflash's precision= on float32 rows (default highest)")
    parser.add_argument("--memory", action="store_true", help="add the memory report (on by default for the full grid)")
    harness.add_timing_options(parser, DEFAULT_REPEATS, DEFAULT_WARMUP)
    parser.add_argument("--rounds", type=harness.positive_int, default=1,
                        help="time each row's systems this many times, in a balanced order that changes each round; each "
                        "figure is the median of the rounds' medians (default 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default bench/results)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit without touching the GPU")
    return parser.parse_args(argv)


def resolve(args):
    """Grid rows, settings and whether to run the memory report, from parsed options."""
    base = QUICK_GRID if args.quick else FULL_GRID
    axes = {name: getattr(args, name) or base[name] for name in FULL_GRID}
    full_default = not args.quick and all(getattr(args, name) is None for name in FULL_GRID)
    settings = harness.Settings(args.warmup, args.repeats, not args.no_backward, not args.no_peers,
                                "per-call" if args.per_call else "back-to-back", args.precision)
    rows = build_grid(axes["dtypes"], axes["headdims"], axes["causal"], axes["seqlens"])
    return axes, rows, settings, args.memory or full_default


def main(argv=None):
    """Run the benchmark (or print its plan); returns the exit status."""
    args = parse_args(argv)
    axes, rows, settings, run_memory = resolve(args)
    if args.dry_run:
        print("\n".join(plan_lines(rows, settings, run_memory, args.out)))
        return 0
    harness.require_gpu("bench.py", "--dry-run prints the plan without one.")

    peers, torch_description = harness.load_torch() if settings.peers else (None, "not run (--no-peers)")
    if peers is not None and settings.precision == "tf32":
        # --precision tf32: the float32 peers' products at TF32 too (load_torch turns it off for "highest")
        peers.torch.backends.cuda.matmul.allow_tf32 = True
        peers.torch.backends.cudnn.allow_tf32 = True
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, plot_path, table_path = args.out / "results.json", args.out / "tflops.png", args.out / "table.txt"
    document = {
        "environment": harness.environment(torch_description),
        "grid": {**axes, "total_tokens": TOTAL_TOKENS, "model_dim": MODEL_DIM, "quick": args.quick},
        "settings": {**dataclasses.asdict(settings), "rounds": args.rounds},
        "flops": harness.FLOP_CONVENTION,
        "timing": harness.TIMINGS[settings.timing],
        "systems": SYSTEMS,
        "rows": [],
        "memory": None,
    }
    env = document["environment"]
    revision = f" ({env['git']})" if env["git"] else ""
    print(f"cupyflash {env['cupyflash']}{revision} on {env['device']}; CuPy {env['cupy']}; {torch_description}")
    per_call = " per-call timings" if settings.timing == "per-call" else ""
    rounds = f"; {args.rounds} rounds in balanced orders" if args.rounds > 1 else ""
    print(f"{len(rows)} rows; {harness.warmup_text(settings)}, median of {settings.repeats}{per_call}{rounds}; "
          f"results in {args.out}", flush=True)

    all_results = []
    for index, row in enumerate(rows, 1):
        start = time.perf_counter()
        results = bench_row(row, SEED + index, settings, peers, args.rounds)
        all_results.append(results)
        document["rows"].append({**row.to_json(), "results": results})
        harness.write_json(json_path, document)
        lines = [progress_line(index, len(rows), row, results, time.perf_counter() - start),
                 *harness.note_lines(results, SHORT_NAMES)]
        print("\n".join(lines), flush=True)

    memory_text = []
    if run_memory:
        document["memory"] = memory_report(peers, settings.peers)
        harness.write_json(json_path, document)
        memory_text = memory_lines(document["memory"])
        print("\n".join(memory_text), flush=True)

    table = table_lines(rows, all_results, settings)
    table_path.write_text("\n".join(memory_text + [""] + table if memory_text else table) + "\n")
    plotted = plot(rows, all_results, settings, plot_path)
    print(f"wrote {json_path}, {table_path}" + (f", {plot_path}" if plotted else " (no plot: matplotlib missing)"))
    print()
    print("\n".join(table), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
