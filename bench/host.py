"""Host time of a cupyflash call (issue 19's targets), beside torch SDPA's on the same shapes.

Run from the repository root (cupyflash installed, or ``PYTHONPATH=$PWD``)::

    python bench/host.py                    # every row, cupyflash and (with torch) SDPA flash and cuDNN
    python bench/host.py --json host.json   # also write every loop's time
    python bench/host.py --profile bwd      # cProfile of --calls calls of one row, driver calls per call
    python bench/host.py --breakdown        # the layers and operations of the decode calls, each timed
    python bench/host.py --dry-run          # the rows, shapes and targets; needs no GPU

What is measured: the wall time per call of a loop of ``--calls`` (500) calls whose GPU work is a few
microseconds, synchronized once at the end (:func:`harness.host_loop`), so the loop is bound by the host:
the median over ``--repeats`` loops, after one untimed call (compilation) and :data:`WARMUP` more. Next
to it, ``gpu`` is the device time per call (the median of :data:`GPU_CALLS` calls queued back to back
behind a spin kernel, :func:`harness.time_queued`): where it comes near the host time, the loop measured
the device, and the row says so. Every row uses only the public API (``flash_attention``,
``flash_attention_backward``, ``flash_attention_varlen``, ``flash_attention_with_kvcache``), so the same
script measures any version. Inputs are fresh standard-normal bf16 arrays.

torch rows (SDPA restricted to its FLASH_ATTENTION and CUDNN_ATTENTION backends, the context entered
once around the loop) are timed the same way: forward rows on zero-copy (batch, heads, seqlen, headdim)
views, the backward row through autograd (``out.backward(dout, retain_graph=True)``, gradients reset to
None before each call), the decode row with ``enable_gqa=True`` on the 4000 keys in the cache.
"""

import argparse
import contextlib
import cProfile
import dataclasses
import io
import pstats
import re
import sys
from pathlib import Path
from typing import Optional

import harness
import numpy

#: Calls per timed loop, loops (median), and untimed calls after the first.
CALLS = 500
REPEATS = 5
WARMUP = 50
#: Calls queued behind the spin kernel for the device time per call.
GPU_CALLS = 100
#: A row whose device time per call is above this fraction of its host time is marked: the loop measured
#: the device, not the host.
GPU_BOUND_FRACTION = 0.8
#: Functions printed per sort order by --profile.
PROFILE_TOP = 25
#: The decode rows: batch 1, a cache of DECODE_CAPACITY keys holding DECODE_FILLED, GQA HEADS / HEADS_K.
DECODE_CAPACITY, DECODE_FILLED, DECODE_PAGE = 4096, 4000, 16
#: Query (and new) tokens of the prefill row.
PREFILL_QUERIES = 64
HEADS, HEADS_K, HEADDIM = 32, 8, 128
SEED = 0
#: Systems in table order: cupyflash and the torch SDPA backends (keys of harness.TORCH_BACKENDS).
SYSTEMS = {"cupyflash": "cupyflash", "torch_fa2": "torch flash", "torch_cudnn": "torch cuDNN"}


@dataclasses.dataclass(frozen=True)
class Row:
    """One timed call.

    ``kind``: ``fwd`` and ``bwd`` (q, k, v, dout of ``shape`` (batch, seqlen, heads, headdim), causal),
    ``varlen`` (the packed sequences of ``lengths``, causal, with the heads and headdim of ``shape``), ``decode``
    (``queries`` query tokens against the KV cache, appending as many when ``append``, paged when
    ``page_size``). ``target_us`` None: a row measured for the record, with no target.
    """

    key: str
    label: str
    kind: str
    target_us: Optional[float]
    shape: tuple = (1, 128, 8, 64)
    deterministic: bool = False
    lengths: tuple = None
    append: bool = False
    page_size: int = 0
    queries: int = 1
    #: torch SDPA runs this row too.
    peers: bool = False

    def to_json(self):
        """The row's definition as a JSON-ready dict."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(self).items()}


ROWS = (
    Row("fwd", "forward (1, 128, 8, 64) causal", "fwd", 25, peers=True),
    Row("fwd_512", "forward (2, 512, 16, 128) causal", "fwd", 25, shape=(2, 512, 16, 128), peers=True),
    Row("bwd", "backward (1, 128, 8, 64) causal", "bwd", 40, peers=True),
    Row("bwd_det", "backward, deterministic", "bwd", 40, deterministic=True),
    Row("varlen", "varlen forward 128,77,100,31 causal", "varlen", 30, lengths=(128, 77, 100, 31)),
    Row("decode_append", "decode step, dense cache, append 1", "decode", 15, append=True),
    Row("decode", "decode, dense cache, no append", "decode", 15, peers=True),
    Row("decode_paged", f"decode step, pages of {DECODE_PAGE}, append 1", "decode", 15, append=True,
        page_size=DECODE_PAGE),
    # More query rows per kv head than the decode kernel takes: the general path, whose forward plan a
    # call builds and runs once.
    Row("prefill", f"prefill chunk of {PREFILL_QUERIES}, dense cache", "decode", None, append=True,
        queries=PREFILL_QUERIES),
)
ROW_KEYS = tuple(row.key for row in ROWS)


def shape_text(row):
    """The shapes of a row's call, for the plan."""
    if row.kind == "varlen":
        return (f"q, k, v ({sum(row.lengths)}, {row.shape[2]}, {row.shape[3]}), cu_seqlens int32 "
                f"({len(row.lengths) + 1},), max_seqlen {max(row.lengths)}")
    if row.kind == "decode":
        cache = ((DECODE_CAPACITY // row.page_size, row.page_size) if row.page_size else (1, DECODE_CAPACITY))
        return (f"q (1, {row.queries}, {HEADS}, {HEADDIM}), caches {(*cache, HEADS_K, HEADDIM)}, cache_seqlens "
                f"int32 [{DECODE_FILLED}]" + (f", k, v (1, {row.queries}, {HEADS_K}, {HEADDIM})" if row.append else "")
                + (f", block_table (1, {DECODE_CAPACITY // row.page_size})" if row.page_size else ""))
    return f"q, k, v, dout {row.shape}"


# --------------------------------------------------------------------------------------------- calls


def cupyflash_call(row):
    """The zero-argument cupyflash call of a row; its inputs (and a backward's forward) are made here."""
    import cupy

    import cupyflash

    bf16 = harness.dtype("bf16")
    if row.kind in ("fwd", "bwd"):
        q, k, v, dout = harness.make_inputs(row.shape, bf16, SEED)
        if row.kind == "fwd":
            return lambda: cupyflash.flash_attention(q, k, v, causal=True)
        out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
        return lambda: cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True,
                                                          deterministic=row.deterministic)
    if row.kind == "varlen":
        q, k, v = harness.make_inputs((sum(row.lengths), *row.shape[2:]), bf16, SEED, count=3)
        cu_seqlens = cupy.asarray(numpy.concatenate([[0], numpy.cumsum(row.lengths)]).astype(numpy.int32))
        longest = max(row.lengths)
        return lambda: cupyflash.flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen_q=longest,
                                                        max_seqlen_k=longest, causal=True)
    args, kwargs = decode_arguments(row)
    return lambda: cupyflash.flash_attention_with_kvcache(*args, **kwargs)


def decode_arguments(row):
    """(q, k_cache, v_cache) and the keyword arguments of a decode row's call."""
    import cupy

    bf16 = harness.dtype("bf16")
    if row.page_size:
        pages = DECODE_CAPACITY // row.page_size
        cache_shape = (pages, row.page_size, HEADS_K, HEADDIM)
        table = cupy.asarray(numpy.random.default_rng(SEED).permutation(pages).astype(numpy.int32)[None])
    else:
        cache_shape, table = (1, DECODE_CAPACITY, HEADS_K, HEADDIM), None
    (q,) = harness.make_inputs((1, row.queries, HEADS, HEADDIM), bf16, SEED, count=1)
    k_cache, v_cache = harness.make_inputs(cache_shape, bf16, SEED + 1, count=2)
    new_shape = (1, row.queries, HEADS_K, HEADDIM)
    k_new, v_new = harness.make_inputs(new_shape, bf16, SEED + 2, count=2) if row.append else (None, None)
    # The call does not move cache_seqlens, so every call appends at the same position.
    lengths = cupy.full((1,), DECODE_FILLED, numpy.int32)
    return (q, k_cache, v_cache), {"k": k_new, "v": v_new, "cache_seqlens": lengths, "block_table": table}


def torch_call(row, peers):
    """The zero-argument torch SDPA call of a row (the backend is chosen around the loop)."""
    torch = peers.torch
    if row.kind == "decode":
        kv_shape = (1, HEADS_K, DECODE_FILLED, HEADDIM)
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
                   for shape in ((1, HEADS, 1, HEADDIM), kv_shape, kv_shape))
        return lambda: peers.sdpa(q, k, v, enable_gqa=True)
    q, k, v, dout = harness.make_inputs(row.shape, harness.dtype("bf16"), SEED)
    if row.kind == "fwd":
        qt, kt, vt = (harness.heads_second(torch.from_dlpack(x)) for x in (q, k, v))
        return lambda: peers.sdpa(qt, kt, vt, is_causal=True)
    leaves = [torch.from_dlpack(x).requires_grad_() for x in (q, k, v)]
    out = peers.sdpa(*(harness.heads_second(leaf) for leaf in leaves), is_causal=True)
    dout_t = harness.heads_second(torch.from_dlpack(dout))

    def backward():
        for leaf in leaves:
            leaf.grad = None
        out.backward(dout_t, retain_graph=True)

    return backward


def system_call(row, system, peers):
    """(call, context) of a row and system: the context (torch's sdpa_kernel) is entered around the loops."""
    if system == "cupyflash":
        return cupyflash_call(row), contextlib.nullcontext()
    backend = peers.backends[system]
    if backend is None:
        raise RuntimeError(f"this torch has no SDPBackend.{harness.TORCH_BACKENDS[system]}")
    return torch_call(row, peers), peers.sdpa_kernel([backend])


# ------------------------------------------------------------------------------------------ measuring


def measure(row, system, peers, calls, repeats):
    """Host us per call (median over loops, and every loop's) and device us per call, or the error."""
    try:
        call, context = system_call(row, system, peers)
        with context:
            call()
            for _ in range(WARMUP):
                call()
            loops = [harness.host_loop(call, calls) * 1e6 for _ in range(repeats)]
            gpu = harness.time_queued(call, GPU_CALLS, harness.host_ms_per_call(call))
    except Exception as exc:  # noqa: BLE001 (a call that raises is reported, the other rows go on)
        return harness.failed(exc)
    return {"us": harness.median(loops), "loops_us": loops, "gpu_us": harness.median(gpu) * 1e3}


def systems_of(row, peers):
    """cupyflash, and the torch systems where the row has peers and torch runs."""
    return ["cupyflash"] + ([s for s in SYSTEMS if s != "cupyflash"] if row.peers and peers is not None else [])


def profile(row, calls):
    """cProfile of ``calls`` cupyflash calls of a row (after the warm-up): the top functions by tottime and
    by cumulative time, then the calls per call of every CuPy and ctypes function among them (the driver's
    launches appear as ``cupy.cuda.driver`` functions). Returns the printed lines."""
    call = cupyflash_call(row)
    for _ in range(1 + WARMUP):
        call()
    profiler = cProfile.Profile()
    harness.synchronize()
    profiler.enable()
    for _ in range(calls):
        call()
    harness.synchronize()
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    top = {}
    for order in ("tottime", "cumulative"):
        print(f"--- {row.label}: {calls} calls, top {PROFILE_TOP} by {order}", file=stream)
        stats.sort_stats(order).print_stats(PROFILE_TOP)
        top.update(dict.fromkeys(stats.fcn_list[:PROFILE_TOP]))
    lines = stream.getvalue().splitlines()
    return lines + ["", f"CuPy and ctypes functions of those lists, calls per call ({calls} calls):",
                    *driver_call_lines(stats.stats, top, calls)]


def breakdown(row, calls, repeats):
    """Where a decode call's host time goes: the public call, then each layer beneath it called directly
    with the same arrays (the key, the plan lookup, the decode plan, its generated run), the run again
    with its graph calls stubbed out, and the single operations a run is made of. Returns the printed
    lines (us per call, median of ``repeats`` loops of ``calls``)."""
    import cupy
    from cupy.cuda import runtime

    import cupyflash
    from cupyflash import _keys, _kvcache, _plan

    (q, k_cache, v_cache), kw = decode_arguments(row)
    for _ in range(3):  # a plan's second run generates its run and makes its graph
        cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **kw)
    positional = (q, k_cache, v_cache, kw["k"], kw["v"], kw["cache_seqlens"], None, kw["block_table"], None, None,
                  True, False, (-1, -1), 0.0, None, None, 0, False)
    key = _keys.kvcache(*positional)
    decode = _kvcache.PLANS.get(key)
    if decode is None:
        return [f"{row.key}: the call left no plan"]
    inputs = (q, k_cache, v_cache, kw["k"], kw["v"], kw["cache_seqlens"], None, kw["block_table"], None, None, None,
              None)
    plan = decode.plan
    stubbed = dict(plan.namespace)
    set_params = _plan._graph_driver()["cuGraphExecKernelNodeSetParams"]
    for name, value in plan.namespace.items():
        if value is set_params:
            stubbed[name] = lambda *args: 0
    stubbed["graph_launch"] = lambda *args: None
    exec(compile(plan.source, "<stubbed plan>", "exec"), stubbed)  # noqa: S102 (the plan's own source)
    stubbed_run = stubbed["run"]
    stream = cupy.cuda.get_current_stream()
    node = plan._graph.nodes[0] if plan._graph is not None else None
    memory = cupy.cuda.alloc(plan._nbytes)
    shape, dtype = tuple(q.shape), q.dtype
    pieces = {
        "public call": lambda: cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **kw),
        "_kvcache.attention (positional)": lambda: _kvcache.attention(*positional),
        "key": lambda: _keys.kvcache(*positional),
        "PLANS.get(key)": lambda: _kvcache.PLANS.get(key),
        "DecodePlan(...)": lambda: decode(*inputs),
        "plan.run": lambda: plan.run(*inputs),
        "plan.run, graph calls stubbed": lambda: stubbed_run(*inputs),
        "get_current_stream().ptr": lambda: stream.ptr,
        "streamIsCapturing": lambda: runtime.streamIsCapturing(stream.ptr),
        "x.data.ptr": lambda: q.data.ptr,
        f"alloc({plan._nbytes})": lambda: cupy.cuda.alloc(plan._nbytes),
        "ndarray(shape, dtype, memptr)": lambda: cupy.ndarray(shape, dtype, memory),
        "cuGraphExecKernelNodeSetParams": (lambda: set_params(*node)) if node else None,
        f"graph launch ({len(plan._launches)} kernels)": (
            lambda: runtime.graphLaunch(plan._graph.exec.value, stream.ptr)) if node else None,
    }
    lines = [f"--- {row.label}: host us per call, median of {repeats} loops of {calls}; the plan has "
             f"{len(plan._launches)} kernel(s), {decode.splits} split(s)"]
    for name, call in pieces.items():
        if call is None:
            continue
        for _ in range(WARMUP):
            call()
        loops = [harness.host_loop(call, calls) * 1e6 for _ in range(repeats)]
        lines.append(f"  {name:<36} {harness.median(loops):7.2f}")
    return lines


#: Names of CuPy's and ctypes' functions in a profile: ``cupy/...py`` and ``cupy_backends/...`` files,
#: ``cupy.`` built-ins and methods (e.g. ``<built-in method cupy.cuda.driver.launchKernel>``), not cupyflash's.
CUPY_OR_CTYPES = re.compile(r"(?<![A-Za-z0-9_])(cupy(_backends)?[./]|ctypes)")


def driver_call_lines(stats, functions, calls):
    """``calls per call  function`` for every CuPy or ctypes function of ``functions`` (pstats keys, in
    ``stats``, a pstats.Stats.stats dict), most called first."""
    counted = [(stats[key][1] / calls, pstats.func_std_string(key)) for key in functions
               if CUPY_OR_CTYPES.search(pstats.func_std_string(key))]
    return [f"{per_call:>8.2f}  {name}" for per_call, name in sorted(counted, key=lambda item: (-item[0], item[1]))]


# ------------------------------------------------------------------------------------------ reporting


def host_cells(entry, target_us=None):
    """The cells (us, gpu[, ratio]) of one measurement: '-' when not run, 'n/a' when it raised; ratio = us
    over the target, '*' above it."""
    width = 3 if target_us is not None else 2
    if entry is None:
        return ["-"] * width
    if "error" in entry:
        return ["n/a"] * width
    cells = [f"{entry['us']:.1f}", f"{entry['gpu_us']:.1f}"]
    if target_us is not None:
        ratio = entry["us"] / target_us
        cells.append(f"{ratio:.2f}" + ("*" if ratio > 1 else ""))
    return cells


def table_lines(rows, results, calls, repeats):
    """The final table: us per call of each system, cupyflash's target and ratio, then which targets were met."""
    headers = ["row", "cupyflash", "gpu", "target", "ratio", "torch flash", "gpu", "torch cuDNN", "gpu"]
    widths = [-38, 9, 6, 6, 6, 11, 6, 11, 6]
    body = []
    for row in rows:
        by_system = results.get(row.key, {})
        ours = by_system.get("cupyflash")
        cells = host_cells(ours, row.target_us) if row.target_us is not None else [*host_cells(ours), "-"]
        target = f"{row.target_us:g}" if row.target_us is not None else "-"
        body.append([row.label, cells[0], cells[1], target, cells[2],
                     *host_cells(by_system.get("torch_fa2")), *host_cells(by_system.get("torch_cudnn"))])
    lines = [
        (f"Host time per call, us: median of {repeats} loops of {calls} calls, one synchronize per loop. gpu: device "
         "us per call (queued back to back). ratio: cupyflash over the target (issue 19), * above it."),
        *harness.text_table(headers, body, widths),
    ]
    checked = [(row, results.get(row.key, {}).get("cupyflash")) for row in rows]
    targeted = [(row, entry) for row, entry in checked if row.target_us is not None]
    met = [row for row, entry in targeted if entry and "us" in entry and entry["us"] <= row.target_us]
    lines.append(f"targets met: {len(met)} of {len(targeted)}")
    for row, entry in checked:
        if entry is None or "error" in entry:
            reason = "not run" if entry is None else entry["error"][:harness.ERROR_CHARS_PROGRESS]
            lines.append(f"  {row.key}: n/a ({reason})")
        elif entry["gpu_us"] > GPU_BOUND_FRACTION * entry["us"]:
            lines.append(f"  {row.key}: device time {entry['gpu_us']:.1f} us is near the host time: the loop "
                         "measured the device")
    return lines


def plan_lines(rows, calls, repeats):
    """The --dry-run output: the measure and each row's call, shapes and target."""
    lines = [(f"plan (dry run, no GPU touched): {len(rows)} rows; median of {repeats} loops of {calls} calls "
              f"(one synchronize each) after {WARMUP} warm-up calls; device time of {GPU_CALLS} queued calls")]
    for row in rows:
        peers = "; torch SDPA flash and cuDNN too" if row.peers else ""
        target = f"target {row.target_us:g} us" if row.target_us is not None else "no target"
        lines.append(f"  {row.key:<14} {row.label:<38} {target}{peers}")
        lines.append(f"  {'':<14} {shape_text(row)}")
    return lines


# ----------------------------------------------------------------------------------------------- main


def parse_args(argv):
    """Command-line options."""
    parser = argparse.ArgumentParser(description="Host time per call of cupyflash (issue 19's targets) beside torch SDPA's.")
    parser.add_argument("--calls", type=harness.positive_int, default=CALLS, help=f"calls per timed loop (default {CALLS})")
    parser.add_argument("--repeats", type=harness.positive_int, default=REPEATS,
                        help=f"timed loops per row, median reported (default {REPEATS})")
    parser.add_argument("--json", type=Path, help="write every measurement and the environment here")
    parser.add_argument("--no-peers", action="store_true", help="time cupyflash only (no torch)")
    parser.add_argument("--profile", choices=ROW_KEYS, metavar="ROW",
                        help=f"cProfile --calls calls of one row instead ({', '.join(ROW_KEYS)})")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the layers and operations of the decode rows' calls instead")
    parser.add_argument("--dry-run", action="store_true", help="print the rows and exit without touching the GPU")
    return parser.parse_args(argv)


def main(argv=None):
    """Time the rows (or profile one, or print the plan); returns the exit status."""
    args = parse_args(argv)
    if args.dry_run:
        print("\n".join(plan_lines(ROWS, args.calls, args.repeats)))
        return 0
    harness.require_gpu("host.py", "--dry-run prints the rows without one.")
    if args.profile:
        print("\n".join(profile(next(row for row in ROWS if row.key == args.profile), args.calls)))
        return 0
    if args.breakdown:
        for row in ROWS:
            if row.kind == "decode":
                print("\n".join(breakdown(row, args.calls, args.repeats)), flush=True)
        return 0
    peers, torch_description = harness.load_torch() if not args.no_peers else (None, "not run (--no-peers)")
    env = harness.environment(torch_description)
    print(f"cupyflash {env['cupyflash']} ({env['cupyflash_path']}) on {env['device']}; CuPy {env['cupy']}; "
          f"{torch_description}", flush=True)
    results = {}
    for row in ROWS:
        results[row.key] = {}
        for system in systems_of(row, peers):
            entry = results[row.key][system] = measure(row, system, peers, args.calls, args.repeats)
            text = f"{entry['us']:.1f} us, gpu {entry['gpu_us']:.1f} us" if "us" in entry else f"n/a ({entry['error']})"
            print(f"  {row.key:<14} {SYSTEMS[system]:<12} {text}", flush=True)
        harness.release_cached_memory(peers)
    if args.json:
        harness.write_json(args.json, {
            "environment": env,
            "settings": {"calls": args.calls, "repeats": args.repeats, "warmup": WARMUP, "gpu_calls": GPU_CALLS},
            "measure": "host: wall time per call of a loop of `calls` calls synchronized once at the end, median over "
            "`repeats` loops; gpu_us: device time per call, median of `gpu_calls` calls queued back to back behind a "
            "spin kernel (CUDA events)",
            "rows": [{**row.to_json(), "results": results[row.key]} for row in ROWS],
        })
    print()
    print("\n".join(table_lines(ROWS, results, args.calls, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
