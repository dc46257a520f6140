"""A/B of kernel time between two source trees of cupyflash, in one run (issue 19: no kernel slower by more
than 2%).

Run from the repository root::

    mkdir -p .ab/old && git archive fe723d8 cupyflash kernels_cu | tar -x -C .ab/old
    python bench/ab.py --old .ab/old --new . --json ab.json     # 38 rows, 3 rounds
    python bench/ab.py --old .ab/old --new . --quick            # 6 rows, a smoke test
    python bench/ab.py --dry-run                                # the rows and how they run; no GPU

A tree is a directory holding ``cupyflash/`` and ``kernels_cu/``. Each version runs in processes of its
own (``PYTHONPATH`` = its tree; ``CUPY_CACHE_DIR`` = a cache directory of its own under ``--cache``, kept
across rounds and runs, so only the first use compiles). The rows use the public API only, plus
``CUPYFLASH_FAMILY`` (``sm80`` for the rows of the mma.sync family, ``general`` for the float32 and float64
rows), set when their process starts, so both versions run the same family whenever they read it.

How a run goes:

1. **Compile pass.** Every row runs once in each version, untimed, in parallel processes (one per version
   and group of rows that share kernels), so NVRTC's compiles overlap instead of adding up.
2. **Rounds.** The versions alternate, old then new, for ``--rounds`` rounds, one process per version
   and family each time. Per row and round: fresh standard-normal inputs allocated once, outside the
   timing (several sets, rotated, as many as span three times L2, at most 8), one untimed call, warm-up
   calls, then enough calls for about :data:`TARGET_MS` of kernel time, queued back to back behind a spin
   kernel and each timed with CUDA events (:func:`harness.time_queued`): the device time of each call,
   every kernel it launches included, with no gap for the host. The round's number is the median.
3. **Report.** Per row, the median over rounds of those medians, new / old, the spread of each version
   between rounds ((max - min) / median, so noise shows), the rate (TFLOP/s on the visible pairs, or TB/s
   of K and V read for decoding), and how far apart the two versions' outputs are (a fixed sample of the
   output of the same inputs). Rows where new is slower than old by more than 2% are flagged; the last line
   names the slowest row.

A row that raises, crashes its process or hangs (no progress for :data:`ROW_TIMEOUT_S` seconds) is
reported as an error of that version and the run goes on, in a new process for the rows after it.
"""

import argparse
import concurrent.futures
import dataclasses
import fnmatch
import hashlib
import itertools
import json
import math
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import harness
import numpy

#: Kernel time to aim for per row and round, and the bounds on the number of timed calls.
TARGET_MS = 50.0
MIN_CALLS, MAX_CALLS = 10, 200
#: Untimed calls after the first, and calls timed to size the timed run.
WARMUP = 3
ESTIMATE_CALLS = 3
DEFAULT_ROUNDS = 3
#: new / old above this flags a row.
SLOWER = 1.02
#: Outputs of the two versions on the same inputs: a sample of this many values, and the relative
#: difference ||new - old|| / ||old|| above which the row is flagged (bf16 results of two summation
#: orders differ by about 1e-3 to 1e-2).
SAMPLES = 1024
MISMATCH = 0.05
#: Input sets: enough that they fill L2 three times, at most this many.
L2_FILLS = 3
MAX_INPUT_SETS = 8
#: A worker whose progress file has not grown for this long is killed (the compile pass: COMPILE_ROW_TIMEOUT_S).
ROW_TIMEOUT_S = 60
COMPILE_ROW_TIMEOUT_S = 180
POLL_S = 0.5
#: New processes started for the rows after a crash, a hang or a lost device, per run of a worker. A row
#: during which its process died or hung is not run again in that version.
MAX_RESTARTS = 8
#: Worker exit status after a row left the device unusable (the rows after it need a new process), and
#: after cupyflash came from another tree than asked (no row can run).
EXIT_DEVICE_LOST = 3
EXIT_WRONG_TREE = 4
#: Lines of a failed worker's log kept in the error.
LOG_TAIL_LINES = 4
DEFAULT_CACHE = harness.REPO_ROOT / "bench" / "results" / "ab-cache"
VERSIONS = ("old", "new")
SEED = 0
#: Block size of the block-sparse row's layout.
BLOCK = (128, 128)


# ----------------------------------------------------------------------------------------------- rows


@dataclasses.dataclass(frozen=True)
class Row:
    """One timed call.

    ``op``: ``fwd`` or ``bwd`` (attention of q (batch, seqlen, heads, headdim) and k, v with ``heads_k``
    heads; packed sequences of ``lengths`` for varlen), ``decode`` (one query token per sequence against a
    full cache of ``context`` keys, dense or paged) or ``prefill`` (``seqlen`` causal queries against a
    full cache). ``group`` gathers rows that share kernels for the compile pass; ``family`` is the
    ``CUPYFLASH_FAMILY`` of the row's process ("" for the default dispatch).
    """

    key: str
    op: str
    group: str
    dtype: str = "bf16"
    batch: int = 4
    seqlen: int = 4096
    heads: int = 16
    heads_k: int = 0
    headdim: int = 128
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    density: float = 0.0
    lengths: tuple = ()
    deterministic: bool = False
    context: int = 0
    page_size: int = 0
    family: str = ""

    @property
    def kv_heads(self):
        """Heads of k and v (heads_k, or heads when 0)."""
        return self.heads_k or self.heads

    @property
    def label(self):
        """Short description, e.g. ``fwd bf16 d128 s4096 b4 h16 causal``."""
        heads = f"h{self.heads}" + (f"/{self.heads_k}" if self.heads_k else "")
        if self.op == "decode":
            paged = f" paged {self.page_size}" if self.page_size else " dense"
            return f"decode {self.dtype} b{self.batch} x {self.context} {heads} d{self.headdim}{paged}"
        if self.op == "prefill":
            return f"prefill {self.dtype} {self.seqlen} x {self.context} {heads} d{self.headdim} causal"
        size = (f"varlen {len(self.lengths)} x {min(self.lengths)}-{max(self.lengths)}" if self.lengths
                else f"s{self.seqlen} b{self.batch}")
        parts = [self.family, self.op, self.dtype, f"d{self.headdim}", size, heads]
        parts += ["causal"] * self.causal + [f"window({self.window[0]},{self.window[1]})"] * (self.window != (-1, -1))
        parts += [f"block {self.density:.0%}"] * bool(self.density) + [f"softcap {self.softcap:g}"] * bool(self.softcap)
        parts += ["alibi"] * self.alibi + ["det"] * self.deterministic
        return " ".join(part for part in parts if part)

    @property
    def seed(self):
        """Seed of the row's inputs: the same in every process and version."""
        return zlib.crc32(self.key.encode()) % 2**31

    def layout(self):
        """The block-sparse row's layout (1, heads, q_blocks, k_blocks), from a fixed seed."""
        blocks = math.ceil(self.seqlen / BLOCK[0])
        return harness.random_block_layout(self.density, SEED, self.heads, blocks, blocks)

    @property
    def visible_pairs(self):
        """Visible (query, key) pairs summed over batch and heads (queries of one head count once per head)."""
        window = (self.window[0], 0 if self.causal else self.window[1])
        if self.op == "prefill":
            return self.batch * self.heads * harness.window_pairs(self.seqlen, self.context, -1, 0)
        if self.lengths:
            return self.heads * harness.varlen_pairs(self.lengths, window)
        if self.density:
            return harness.block_pairs(self.layout(), BLOCK, self.seqlen, self.seqlen, self.batch, self.heads)
        return self.batch * self.heads * harness.window_pairs(self.seqlen, self.seqlen, *window)

    @property
    def work(self):
        """(amount, unit) per call: FLOPs on the visible pairs (backward 2.5x), or bytes of K and V read."""
        if self.op == "decode":
            return self.batch * self.context * self.kv_heads * self.headdim * 2 * harness.DTYPE_BYTES[self.dtype], "B"
        flops = harness.pair_flops(self.visible_pairs, self.headdim)
        return (harness.backward_flops(flops) if self.op == "bwd" else flops), "FLOP"

    def rate_text(self, ms):
        """``612 TF/s`` or ``3.98 TB/s`` at ``ms`` per call."""
        amount, unit = self.work
        rate = amount / ms / 1e9
        return f"{rate:.2f} TB/s" if unit == "B" else f"{rate:.0f} TF/s"


def attention_rows():
    """Hopper forward and backward (default dispatch on an H200), the sm80 family and the general family
    (forced with CUPYFLASH_FAMILY, so each row measures the same family in both versions)."""
    lengths = harness.varlen_lengths(16, 256, 2048, SEED)
    rows = []
    for headdim in (64, 128, 256):
        for causal in (False, True):
            rows.append(Row(f"fwd_d{headdim}{'_causal' * causal}", "fwd", "sm90_fwd", headdim=headdim,
                            heads=2048 // headdim, causal=causal))
    rows += [
        Row("fwd_fp16_d128", "fwd", "sm90_fwd", dtype="fp16"),
        Row("fwd_d64_s1024", "fwd", "sm90_fwd", headdim=64, heads=32, batch=16, seqlen=1024),
        Row("fwd_d128_s1024", "fwd", "sm90_fwd", batch=16, seqlen=1024),
        Row("fwd_d64_causal_s1024", "fwd", "sm90_fwd_masks", headdim=64, heads=32, batch=16, seqlen=1024,
            causal=True),
        Row("fwd_d128_causal_s1024", "fwd", "sm90_fwd_masks", batch=32, seqlen=1024, causal=True),
        Row("fwd_d256_causal_s1024", "fwd", "sm90_fwd_masks", headdim=256, heads=8, batch=16, seqlen=1024,
            causal=True),
        Row("fwd_d128_s16k", "fwd", "sm90_fwd", batch=1, seqlen=16384),
        Row("fwd_window", "fwd", "sm90_fwd_masks", seqlen=8192, window=(1024, 0)),
        Row("fwd_block25", "fwd", "sm90_fwd_masks", batch=2, seqlen=8192, density=0.25),
        Row("fwd_varlen", "fwd", "sm90_fwd_masks", lengths=lengths),
        Row("fwd_softcap", "fwd", "sm90_fwd_mods", softcap=30.0),
        Row("fwd_alibi", "fwd", "sm90_fwd_mods", alibi=True),
        Row("fwd_gqa", "fwd", "sm90_fwd_masks", batch=2, heads=32, heads_k=8),
    ]
    for headdim in (64, 128):
        for causal in (False, True):
            rows.append(Row(f"bwd_d{headdim}{'_causal' * causal}", "bwd", "sm90_bwd", headdim=headdim,
                            heads=2048 // headdim, causal=causal))
    rows += [
        Row("bwd_d128_causal_det", "bwd", "sm90_bwd", causal=True, deterministic=True),
        Row("bwd_d128_causal_window", "bwd", "sm90_bwd", causal=True, window=(1024, 0)),
        Row("bwd_varlen", "bwd", "sm90_bwd", lengths=lengths),
    ]
    for op in ("fwd", "bwd"):
        rows += [Row(f"sm80_{op}_d{d}_causal", op, f"sm80_{op}", headdim=d, heads=2048 // d, causal=True, family="sm80")
                 for d in (64, 128, 256)]
    rows += [Row(f"general_{op}_{dtype}", op, "general", dtype=dtype, batch=1, seqlen=2048, heads=8, headdim=64,
                 causal=True, family="general") for dtype in ("fp32", "fp64") for op in ("fwd", "bwd")]
    return rows


def kvcache_rows():
    """Decoding (GQA 32/8, d128, bf16, full caches) dense, paged and with many splits; chunked prefill."""
    gqa = {"heads": 32, "heads_k": 8, "group": "kvcache"}
    return [
        Row("decode_b8_32k", "decode", batch=8, context=32768, **gqa),
        Row("decode_b8_32k_paged16", "decode", batch=8, context=32768, page_size=16, **gqa),
        Row("decode_b1_131k", "decode", batch=1, context=131072, **gqa),
        Row("prefill_512_32k", "prefill", batch=1, seqlen=512, context=32768, causal=True, **gqa),
    ]


ROWS = attention_rows() + kvcache_rows()
ROWS_BY_KEY = {row.key: row for row in ROWS}
#: The --quick rows: one of each kind.
QUICK = ("fwd_d128_causal", "fwd_varlen", "bwd_d128_causal", "sm80_fwd_d128_causal", "general_fwd_fp32", "decode_b8_32k")


def select_rows(quick, patterns):
    """The rows of the run: all or the --quick ones, narrowed to keys matching any of ``patterns``
    (fnmatch); ValueError names a pattern that matches none."""
    rows = [ROWS_BY_KEY[key] for key in QUICK] if quick else list(ROWS)
    if not patterns:
        return rows
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(row.key, pattern) for row in rows):
            raise ValueError(f"--rows: {pattern!r} matches no row (keys: {', '.join(row.key for row in rows)})")
    return [row for row in rows if any(fnmatch.fnmatchcase(row.key, p) for p in patterns)]


def alibi_slopes(heads):
    """ALiBi's slopes for ``heads`` heads: 2^(-8 (h + 1) / heads), float32."""
    return (2.0 ** (-8.0 * numpy.arange(1, heads + 1) / heads)).astype(numpy.float32)


# ------------------------------------------------------------------------------------------- the calls


def attention_call(row, seed):
    """(call, input bytes) of a forward or backward row, on fresh inputs; a backward's forward runs here."""
    import cupy

    import cupyflash

    dtype = harness.dtype(row.dtype)
    options = {"causal": row.causal}
    if row.window != (-1, -1):
        options["window_size"] = row.window
    if row.softcap:
        options["softcap"] = row.softcap
    if row.alibi:
        options["alibi_slopes"] = cupy.asarray(alibi_slopes(row.heads))
    if row.density:
        options["block_mask"] = cupyflash.BlockMask.from_dense(cupy.asarray(row.layout()), block_size=BLOCK)
    backward_options = {"deterministic": True} if row.deterministic else {}
    if row.lengths:
        total = sum(row.lengths)
        q, dout = harness.make_inputs((total, row.heads, row.headdim), dtype, seed, count=2)
        k, v = harness.make_inputs((total, row.kv_heads, row.headdim), dtype, seed + 1, count=2)
        cu_seqlens = cupy.asarray(numpy.concatenate([[0], numpy.cumsum(row.lengths)]).astype(numpy.int32))
        packed = {"max_seqlen_q": max(row.lengths), "max_seqlen_k": max(row.lengths)}

        def forward(lse=False):
            return cupyflash.flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, return_lse=lse, **packed, **options)

        def backward(out, lse):
            return cupyflash.flash_attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens, **packed,
                                                             **options, **backward_options)
    else:
        q, dout = harness.make_inputs((row.batch, row.seqlen, row.heads, row.headdim), dtype, seed, count=2)
        k, v = harness.make_inputs((row.batch, row.seqlen, row.kv_heads, row.headdim), dtype, seed + 1, count=2)

        def forward(lse=False):
            return cupyflash.flash_attention(q, k, v, return_lse=lse, **options)

        def backward(out, lse):
            return cupyflash.flash_attention_backward(dout, q, k, v, out, lse, **options, **backward_options)

    if row.op == "fwd":
        return forward, sum(x.nbytes for x in (q, k, v))
    out, lse = forward(lse=True)
    return (lambda: backward(out, lse)), sum(x.nbytes for x in (q, k, v, dout, out, lse))


def kvcache_call(row, seed):
    """(call, input bytes) of a decode or chunked-prefill row: full caches (pages in random order)."""
    import cupy

    import cupyflash

    dtype = harness.dtype(row.dtype)
    seqlen_q = 1 if row.op == "decode" else row.seqlen
    (q,) = harness.make_inputs((row.batch, seqlen_q, row.heads, row.headdim), dtype, seed, count=1)
    if row.page_size:
        pages = row.batch * row.context // row.page_size
        cache_shape = (pages, row.page_size, row.kv_heads, row.headdim)
        order = numpy.random.default_rng(seed).permutation(pages).astype(numpy.int32)
        options = {"block_table": cupy.asarray(order.reshape(row.batch, -1))}
    else:
        cache_shape, options = (row.batch, row.context, row.kv_heads, row.headdim), {}
    k_cache, v_cache = harness.make_inputs(cache_shape, dtype, seed + 1, count=2)
    if row.op == "decode":
        options["cache_seqlens"] = cupy.full((row.batch,), row.context, numpy.int32)
    else:  # the chunk is the last seqlen_q positions of the cache
        options.update(cache_seqlens=row.context, causal=True)
    return (lambda: cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **options)), q.nbytes + 2 * k_cache.nbytes


def make_call(row, index):
    """(call, input bytes) of a row on input set ``index`` (set 0 is the same in every process)."""
    make = kvcache_call if row.op in ("decode", "prefill") else attention_call
    return make(row, row.seed + 7919 * index)


def input_set_count(set_bytes, l2_bytes):
    """Input sets to rotate so that they fill L2 :data:`L2_FILLS` times, at most :data:`MAX_INPUT_SETS`."""
    return min(MAX_INPUT_SETS, max(1, math.ceil(L2_FILLS * l2_bytes / max(set_bytes, 1))))


def timed_calls(estimate_ms):
    """Calls to time for about :data:`TARGET_MS` of kernel time, within [MIN_CALLS, MAX_CALLS]."""
    if not estimate_ms > 0:
        return MAX_CALLS
    return min(MAX_CALLS, max(MIN_CALLS, round(TARGET_MS / estimate_ms)))


def output_sample(out):
    """:data:`SAMPLES` values of a call's output (of each of dq, dk, dv for a backward) at fixed
    positions, as float64 host values: both versions sample the same positions. The values are gathered
    as raw bits (an unsigned view of their size) and read on the host, so no device kernel needs the
    dtype (bf16 included)."""
    import cupy

    arrays = out if isinstance(out, (tuple, list)) else (out,)
    values = []
    for index, array in enumerate(arrays):
        flat = array.ravel()
        count = min(flat.size, SAMPLES // len(arrays))
        positions = cupy.asarray(numpy.random.default_rng(SEED + index).integers(0, flat.size, count))
        bits = cupy.asnumpy(flat.view(f"u{flat.dtype.itemsize}")[positions])
        values += bits.view(flat.dtype).astype(numpy.float64).tolist()
    return values


def run_row(row, mode):
    """Measure one row in this process (``mode`` "compile": the first call only); a JSON-ready dict."""
    import cupy

    try:
        first, set_bytes = make_call(row, 0)
        harness.synchronize()
        start = time.perf_counter()
        out = first()
        harness.synchronize()
        entry = {"first_call_s": time.perf_counter() - start}
        if mode == "compile":
            return entry
        entry["sample"] = output_sample(out)
        del out
        l2_bytes = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id).get("l2CacheSize", 0)
        calls = [first] + [make_call(row, i)[0] for i in range(1, input_set_count(set_bytes, l2_bytes))]
        entry["sets"] = len(calls)
        rotation = itertools.cycle(calls)

        def call():
            return next(rotation)()

        for _ in range(WARMUP):
            call()
        host_ms = harness.host_ms_per_call(call)
        estimate = harness.median(harness.time_queued(call, ESTIMATE_CALLS, host_ms))
        times = harness.time_queued(call, timed_calls(estimate), host_ms)
        return {**entry, "median_ms": harness.median(times), "times_ms": times, "host_ms": host_ms}
    except Exception as exc:  # noqa: BLE001 (a row that raises is reported, the run goes on)
        return harness.failed(exc)


def device_usable():
    """False when the device no longer synchronizes (a kernel fault): the next rows need a new process."""
    try:
        harness.release_cached_memory()
    except Exception:  # noqa: BLE001 (any error here means the context is gone)
        return False
    return True


def worker_main(mode, tree, progress_path, keys):
    """A worker process: run ``keys`` in this version and append one JSON event per line to ``progress_path``
    (``env``, then ``start`` and ``result`` per row; ``fatal`` when cupyflash is not the tree's)."""
    harness.require_gpu("ab.py worker")
    import cupyflash

    with open(progress_path, "a") as progress:

        def emit(**event):
            progress.write(json.dumps(event) + "\n")
            progress.flush()

        imported = Path(cupyflash.__file__).resolve()
        if Path(tree).resolve() not in imported.parents:
            emit(event="fatal", error=f"cupyflash was imported from {imported.parent}, not from the tree {tree}")
            return EXIT_WRONG_TREE
        environment = harness.environment(None)
        del environment["command"], environment["torch"]
        emit(event="env", family=os.environ.get("CUPYFLASH_FAMILY", ""),
             cupy_cache_dir=os.environ.get("CUPY_CACHE_DIR"), **environment)
        for key in keys:
            emit(event="start", row=key)
            entry = run_row(ROWS_BY_KEY[key], mode)
            emit(event="result", row=key, **entry)
            if "error" in entry and not device_usable():
                return EXIT_DEVICE_LOST
            harness.release_cached_memory()
    return 0


# ------------------------------------------------------------------------------------------ the parent


@dataclasses.dataclass(frozen=True)
class Version:
    """A source tree and the CuPy cache directory of its processes."""

    name: str
    tree: Path
    cache: Path

    def environment(self, family):
        """The environment of this version's processes: its tree first on PYTHONPATH (entries that hold
        another cupyflash dropped), its cache directory, and CUPYFLASH_FAMILY set or removed."""
        env = dict(os.environ)
        others = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                  if p and not (Path(p) / "cupyflash" / "__init__.py").exists()]
        env["PYTHONPATH"] = os.pathsep.join([str(self.tree), *others])
        env["CUPY_CACHE_DIR"] = str(self.cache)
        if family:
            env["CUPYFLASH_FAMILY"] = family
        else:
            env.pop("CUPYFLASH_FAMILY", None)
        return env


def read_events(path):
    """The JSON events a worker wrote (a line cut short by a crash is dropped)."""
    events = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return events


def log_tail(path):
    """The last lines of a worker's log, on one line."""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.exists() else []
    return " | ".join(lines[-LOG_TAIL_LINES:])[: harness.ERROR_CHARS_JSON]


def wait_or_kill(process, progress, timeout_s):
    """Wait for a worker; kill it when its progress file has not grown for ``timeout_s``. True if killed."""
    last_size, last_change = -1, time.monotonic()
    while True:
        try:
            process.wait(timeout=POLL_S)
            return False
        except subprocess.TimeoutExpired:
            size = progress.stat().st_size if progress.exists() else 0
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            elif time.monotonic() - last_change > timeout_s:
                process.kill()
                process.wait()
                return True


def worker_command(version, mode, progress, keys):
    """The command line of a worker process: this script with the hidden worker options."""
    return [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--tree", str(version.tree),
            "--progress", str(progress), "--rows", ",".join(keys)]


def run_worker(version, rows, mode, logs, tag):
    """Run ``rows`` (of one family) in processes of ``version``; a new process takes the rows after one
    that crashed, hung or lost its device, at most :data:`MAX_RESTARTS` times.

    Returns
    -------
    environment : dict or None
        What the first process reported (device, versions, paths).
    results : dict
        Row key -> the row's entry: :func:`run_row`'s, or {"error": ..., "broken": True} for a row during
        which the process died or hung (or that never ran because the process could not start).
    """
    family = rows[0].family
    timeout_s = COMPILE_ROW_TIMEOUT_S if mode == "compile" else ROW_TIMEOUT_S
    remaining, results, environment = [row.key for row in rows], {}, None
    for attempt in range(MAX_RESTARTS + 1):
        stem = f"{version.name}-{tag}-{attempt}"
        progress, log = logs / f"{stem}.jsonl", logs / f"{stem}.log"
        progress.unlink(missing_ok=True)
        with open(log, "w") as log_file:
            process = subprocess.Popen(worker_command(version, mode, progress, remaining),
                                       env=version.environment(family), stdout=log_file, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
            killed = wait_or_kill(process, progress, timeout_s)
        started, running = False, None
        for event in read_events(progress):
            if event["event"] == "env":
                environment = environment or {k: v for k, v in event.items() if k != "event"}
            elif event["event"] == "fatal":
                return environment, {**results, **{key: {"error": event["error"], "broken": True} for key in remaining}}
            elif event["event"] == "start":
                started, running = True, event["row"]
            elif event["event"] == "result":
                results[event["row"]] = {k: v for k, v in event.items() if k not in ("event", "row")}
                running = None
        remaining = [key for key in remaining if key not in results]
        if not remaining:
            break
        why = f"killed after {timeout_s} s without progress" if killed else f"exit status {process.returncode}"
        if not started:  # the process failed before its first row: a new one would too
            error = {"error": f"worker {why} before its first row: {log_tail(log)}", "broken": True}
            return environment, {**results, **{key: error for key in remaining}}
        if running is not None:
            results[running] = {"error": f"worker {why} during this row: {log_tail(log)}", "broken": True}
            remaining.remove(running)
        if not remaining:
            break
    for key in remaining:
        results[key] = {"error": f"not run: the worker failed {MAX_RESTARTS + 1} times (logs in {logs})", "broken": True}
    return environment, results


def families(rows):
    """The rows by CUPYFLASH_FAMILY (one process each), in row order."""
    return list(dict.fromkeys(row.family for row in rows))


def run_rounds(versions, rows, count, logs, after_each=None):
    """``count`` rounds of every version in turn (old, new), one process per version and family each;
    ``after_each(rounds, environments)`` is called after each version's round (to save what was measured).

    A row during which its process died or hung is not run again in that version (it would cost the same
    again); its error stays in its first entry.

    Returns
    -------
    rounds : dict
        Row key -> version -> the row's entries, one per round it ran in.
    environments : dict
        Version -> family -> what its first process reported.
    """
    rounds = {row.key: {name: [] for name in versions} for row in rows}
    environments = {name: {} for name in versions}
    broken = {name: set() for name in versions}
    for number in range(1, count + 1):
        for name, version in versions.items():
            round_start, failed = time.perf_counter(), 0
            for family in families(rows):
                todo = [row for row in rows if row.family == family and row.key not in broken[name]]
                if not todo:
                    continue
                environment, results = run_worker(version, todo, "time", logs, f"round{number}-{family or 'default'}")
                environments[name].setdefault(family or "default", environment)
                for key, entry in results.items():
                    rounds[key][name].append(entry)
                    failed += "error" in entry
                    if entry.get("broken"):
                        broken[name].add(key)
            print(f"round {number}/{count} {name}: {time.perf_counter() - round_start:.0f} s"
                  + (f", {failed} rows failed" if failed else ""), flush=True)
            if after_each is not None:
                after_each(rounds, environments)
    return rounds, environments


def compile_pass(versions, rows, logs):
    """Every row once in every version, untimed, one process per version and group, all at once."""
    groups = list(dict.fromkeys(row.group for row in rows))
    jobs = [(version, [row for row in rows if row.group == group], group) for version in versions.values()
            for group in groups]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = [(version.name, pool.submit(run_worker, version, group_rows, "compile", logs, f"compile-{group}"))
                   for version, group_rows, group in jobs]
        done = [(name, future.result()) for name, future in futures]
    results = {name: {} for name in versions}
    for name, (_, entries) in done:
        results[name].update(entries)
    return results


def tree_digest(tree):
    """SHA-256 over the paths and bytes of every file under ``tree``'s cupyflash/ and kernels_cu/ (caches left out)."""
    digest = hashlib.sha256()
    for folder in ("cupyflash", "kernels_cu"):
        for path in sorted((tree / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def tree_problem(tree):
    """Why ``tree`` is not a cupyflash source tree, or None."""
    if not (tree / "cupyflash" / "__init__.py").is_file():
        return f"{tree} has no cupyflash/__init__.py"
    if not (tree / "kernels_cu").is_dir():
        return f"{tree} has no kernels_cu/"
    return None


# ------------------------------------------------------------------------------------------- reporting


def spread(values):
    """(max - min) / median of a version's per-round medians, or None with fewer than two."""
    return (max(values) - min(values)) / harness.median(values) if len(values) > 1 else None


def sample_difference(old, new):
    """||new - old|| / ||old|| of two output samples (inf when a value is not finite), or None without both."""
    if not old or not new or len(old) != len(new):
        return None
    a, b = numpy.asarray(old), numpy.asarray(new)
    if not (numpy.isfinite(a).all() and numpy.isfinite(b).all()):
        return float("inf")
    norm = float(numpy.linalg.norm(a))
    return float(numpy.linalg.norm(b - a) / norm) if norm > 0 else float(numpy.linalg.norm(b - a))


def summarize(row, rounds):
    """A row's comparison from ``rounds[version]``, the list of its per-round entries.

    Returns
    -------
    dict
        Per version: ``ms`` (median of the per-round medians, or None), ``rounds_ms``, ``spread`` and the
        ``errors``; then ``ratio`` (new / old), ``slower`` (ratio > SLOWER), ``noisy`` (the difference is
        within a version's spread), ``difference`` (of the output samples) and ``mismatch``.
    """
    summary = {}
    for name in VERSIONS:
        entries = rounds.get(name, [])
        medians = [e["median_ms"] for e in entries if "median_ms" in e]
        errors = list(dict.fromkeys(e["error"] for e in entries if "error" in e))
        summary[name] = {"ms": harness.median(medians) if medians else None, "rounds_ms": medians,
                         "spread": spread(medians), "errors": errors}
    old, new = summary["old"]["ms"], summary["new"]["ms"]
    ratio = new / old if old and new else None
    spreads = [s for s in (summary["old"]["spread"], summary["new"]["spread"]) if s is not None]
    samples = {name: next((e["sample"] for e in rounds.get(name, []) if "sample" in e), None) for name in VERSIONS}
    difference = sample_difference(samples["old"], samples["new"])
    summary.update(
        ratio=ratio,
        slower=ratio is not None and ratio > SLOWER,
        noisy=ratio is not None and bool(spreads) and abs(ratio - 1) <= max(spreads),
        difference=difference,
        mismatch=difference is not None and not difference <= MISMATCH,
    )
    return summary


def percent(value):
    """``0.4%``, or ``-`` for None."""
    return "-" if value is None else f"{100 * value:.1f}%"


def flag_text(summary):
    """The flag cell: SLOWER (and noise), MISMATCH, or the errors' versions."""
    flags = []
    if summary["slower"]:
        flags.append("SLOWER" + (" (within noise)" if summary["noisy"] else ""))
    if summary["mismatch"]:
        flags.append("MISMATCH")
    flags += [f"{name} failed" for name in VERSIONS if summary[name]["ms"] is None]
    return ", ".join(flags)


def table_lines(rows, summaries, rounds_run):
    """The final table, the lists of flagged rows and errors, and last the slowest row."""
    headers = ["row", "old ms", "new ms", "new/old", "spread old", "new", "new rate", "out diff", "flag"]
    widths = [-46, 8, 8, 7, 10, 6, 10, 8, -24]
    body = []
    for row in rows:
        s = summaries[row.key]
        old, new = s["old"]["ms"], s["new"]["ms"]
        body.append([
            row.label,
            "n/a" if old is None else f"{old:.3f}",
            "n/a" if new is None else f"{new:.3f}",
            "-" if s["ratio"] is None else f"{s['ratio']:.3f}",
            percent(s["old"]["spread"]),
            percent(s["new"]["spread"]),
            "-" if new is None else row.rate_text(new),
            "-" if s["difference"] is None else f"{s['difference']:.1e}",
            flag_text(s),
        ])
    lines = [
        (f"Kernel time per call, ms: median over {rounds_run} rounds of each round's median (CUDA events, calls "
         f"queued back to back). spread: (max - min) / median over rounds. rate: TFLOP/s on the visible pairs or TB/s"),
        (f"of K and V read. out diff: ||new - old|| / ||old|| of a sample of the outputs. SLOWER: new/old > {SLOWER}; "
         f"MISMATCH: out diff > {MISMATCH}."),
        *harness.text_table(headers, body, widths),
    ]
    compared = [row for row in rows if summaries[row.key]["ratio"] is not None]
    slower = [row.key for row in compared if summaries[row.key]["slower"]]
    lines.append(f"rows slower by more than {100 * (SLOWER - 1):.0f}%: {len(slower)} of {len(compared)} compared"
                 + (f": {', '.join(slower)}" if slower else ""))
    mismatched = [row.key for row in rows if summaries[row.key]["mismatch"]]
    if mismatched:
        lines.append(f"outputs that differ between the versions: {', '.join(mismatched)}")
    for row in rows:
        for name in VERSIONS:
            for error in summaries[row.key][name]["errors"]:
                lines.append(f"  {row.key} ({name}): {error[:harness.ERROR_CHARS_PROGRESS]}")
    if compared:
        worst = max(compared, key=lambda row: summaries[row.key]["ratio"])
        s = summaries[worst.key]
        lines.append(f"slowest row: {worst.key} ({worst.label}): new/old {s['ratio']:.3f} (old {s['old']['ms']:.3f} ms, "
                     f"new {s['new']['ms']:.3f} ms; spread {percent(s['old']['spread'])} / {percent(s['new']['spread'])})")
    else:
        lines.append("slowest row: none (no row ran in both versions)")
    return lines


def plan_lines(rows, rounds):
    """The --dry-run output: every row with its group, family and work, and how the run goes."""
    lines = [f"plan (dry run, no GPU touched): {len(rows)} rows; a compile pass, then {rounds} rounds of old, new",
             f"{'key':<26} {'group':<15} {'family':<7} {'work':>12}  row"]
    for row in rows:
        amount, unit = row.work
        work = f"{amount / 1e9:.1f} G{unit}"
        lines.append(f"{row.key:<26} {row.group:<15} {row.family or 'default':<7} {work:>12}  {row.label}")
    groups, fams = list(dict.fromkeys(row.group for row in rows)), families(rows)
    lines.append(f"compile pass: {2 * len(groups)} processes at once ({len(groups)} groups x 2 versions); rounds: "
                 f"{len(fams)} process(es) per version and round (CUPYFLASH_FAMILY: "
                 f"{', '.join(f or 'unset' for f in fams)})")
    return lines


def record(args, versions, rows, compiled, rounds, environments, seconds):
    """The JSON record of a run so far: both versions' trees and environments, the settings, and per row its
    definition, the compile pass, every round's entry (the output samples left out) and the summary."""
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
        "versions": {name: {"tree": str(v.tree), "tree_sha256": tree_digest(v.tree), "cupy_cache_dir": str(v.cache),
                            "environment": environments.get(name)} for name, v in versions.items()},
        "settings": {"rounds": args.rounds, "target_ms": TARGET_MS, "calls": [MIN_CALLS, MAX_CALLS], "warmup": WARMUP,
                     "slower": SLOWER, "mismatch": MISMATCH, "samples": SAMPLES},
        "timing": "per row and round: the median of the device times of calls queued back to back behind a spin "
        "kernel, each between two CUDA events, after one untimed call and the warm-up; inputs allocated once, "
        "as many sets, rotated, as span three times L2 (at most 8)",
        "seconds": seconds,
        "rows": [{"key": row.key, "label": row.label, **{k: v for k, v in dataclasses.asdict(row).items() if k != "key"},
                  "work": row.work[0], "work_unit": row.work[1],
                  "compile": {name: compiled[name].get(row.key) for name in VERSIONS},
                  "rounds": {name: [{k: v for k, v in e.items() if k != "sample"} for e in rounds[row.key][name]]
                             for name in VERSIONS},
                  "summary": summarize(row, rounds[row.key])} for row in rows],
    }


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv):
    """Command-line options (and the hidden ones of a worker process)."""
    parser = argparse.ArgumentParser(
        description="A/B of kernel time between two cupyflash source trees (issue 19: no kernel more than 2% slower).")
    parser.add_argument("--old", type=Path, help="source tree of the old version (holds cupyflash/ and kernels_cu/)")
    parser.add_argument("--new", type=Path, help="source tree of the new version")
    parser.add_argument("--rounds", type=harness.positive_int, default=DEFAULT_ROUNDS,
                        help=f"rounds of old, new (default {DEFAULT_ROUNDS})")
    parser.add_argument("--json", type=Path, help="write both versions' per-round times and the environment here")
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK)} rows, one of each kind: a smoke test")
    parser.add_argument("--rows", type=lambda t: harness.parse_list(t, str),
                        help="only the rows whose keys match these comma-separated patterns (fnmatch, e.g. 'bwd_*')")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="CuPy cache directories (old/, new/) and worker logs (default bench/results/ab-cache); "
                        "kept, so a second run compiles nothing")
    parser.add_argument("--dry-run", action="store_true", help="print the rows and exit without touching the GPU")
    parser.add_argument("--worker", choices=("compile", "time"), help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.selected = select_rows(args.quick, args.rows)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.dry_run:
        if args.old is None or args.new is None:
            parser.error("--old and --new are required (or --dry-run)")
        for tree in (args.old, args.new):
            problem = tree_problem(tree)
            if problem:
                parser.error(problem)
    return args


def main(argv=None):
    """Run the A/B (or a worker, or print the plan); returns the exit status."""
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.tree, args.progress, args.rows)
    rows = args.selected
    if args.dry_run:
        print("\n".join(plan_lines(rows, args.rounds)))
        return 0
    harness.require_gpu("ab.py", "--dry-run prints the rows without one.", need_cupyflash=False)
    logs = args.cache / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    versions = {name: Version(name, tree.resolve(), (args.cache / name).resolve())
                for name, tree in zip(VERSIONS, (args.old, args.new))}
    start = time.perf_counter()
    print(f"{len(rows)} rows, {args.rounds} rounds; old {versions['old'].tree}, new {versions['new'].tree}; "
          f"caches and logs in {args.cache}", flush=True)
    compiled = compile_pass(versions, rows, logs)
    print(f"compile pass: {time.perf_counter() - start:.0f} s", flush=True)

    def save(rounds, environments):
        if args.json:
            harness.write_json(args.json, record(args, versions, rows, compiled, rounds, environments,
                                                 time.perf_counter() - start))

    rounds, _ = run_rounds(versions, rows, args.rounds, logs, after_each=save)
    print(f"total {time.perf_counter() - start:.0f} s" + (f"; wrote {args.json}" if args.json else ""))
    summaries = {row.key: summarize(row, rounds[row.key]) for row in rows}
    print()
    print("\n".join(table_lines(rows, summaries, args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
