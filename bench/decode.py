"""Benchmark of cupyflash.flash_attention_with_kvcache (issue 11's targets) beside torch's attention.

Run from the repository root (cupyflash installed, or ``PYTHONPATH=$PWD``)::

    python bench/decode.py               # decode rows, paged rows, chunked prefill, call times
    python bench/decode.py --quick       # fewer repetitions, no MLA general-path timings

Decode: one query token per sequence, 32 query heads sharing 8 kv heads, head dim 128, bf16, the cache
full (cache_seqlens = context); bandwidth = K and V bytes read / time (the measure of ../shared/PEERS.md;
device copy ceiling 4.24 TB/s on the H200). Paged rows use a random page order. Chunked prefill: 512
new queries (causal) against a 32k cache, TFLOP/s on the visible pairs, beside cupyflash's dense
forward of the same shapes. Call times: batch 1, 4k context, from Python (calls per second of a loop
that synchronizes once) and as CUDA graph replays. Cascade: 64 requests sharing an 8k prefix, attended
once for all (its keys in parts side by side) and merged, against decoding every whole cache. MLA
(issue 26): DeepSeek's latent cache (one kv head of 576 columns, v_cache the view of its first 512) in
pages of 64, batch 64 x 8192, 16 and 128 query heads: TB/s of cache bytes and TFLOP/s (2 x batch x heads x
context x (576 + 512)), beside the same call with a v_cache array of its own (the general path). e4m3
(issue 25): the decode row 8 x 32768 with q, K and V e4m3 (no descales: the planned path) against the
same row in bfloat16, as tokens per second (target 1.8x). Times are
medians of CUDA-event timings of groups of back-to-back calls (:func:`harness.time_grouped`).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import harness
import numpy

HEADS, HEADS_K, HEADDIM = 32, 8, 128
DECODE_ROWS = ((1, 131072), (8, 32768), (64, 4096))
#: Back-to-back calls per CUDA-event timing, and untimed calls first.
INNER_CALLS = 10
WARMUP = 3
#: Timings (medians) per row, and with --quick.
REPEATS, QUICK_REPEATS = 30, 10
#: The rows, in the order they run (--rows picks some).
ROWS = ("calls", "decode", "prefill", "cascade", "mla", "fp8")
#: The MLA rows: batch, context, page size, query heads (issue 26's targets: 3.3 TB/s at 16 heads, 550
#: TFLOP/s at 128).
MLA_BATCH, MLA_CONTEXT, MLA_PAGE, MLA_HEADS = 64, 8192, 64, (16, 128)
#: The call-time loop: calls timed, untimed calls first, batch 1 at this context.
CALLS, CALL_WARMUP, CALL_CONTEXT = 2000, 20, 4096
#: Device copy ceiling on the H200 (TB/s, bytes read + written), drawn on the plot.
COPY_CEILING = 4.24


def median_ms(call, repeats):
    """Median over ``repeats`` of the time per call of :data:`INNER_CALLS` back-to-back calls (a decoding
    loop: the host prepares the next call while the GPU runs the last one)."""
    return harness.median(harness.time_grouped(call, WARMUP, repeats, INNER_CALLS))


def random(shape, rng):
    """A standard-normal bf16 device array drawn from a NumPy generator."""
    import cupy

    return cupy.asarray(rng.standard_normal(shape, dtype=numpy.float32)).astype(harness.dtype("bf16"))


def decode_inputs(batch, context, page_size, rng):
    """q, the full K and V caches (dense, or pages of ``page_size`` in random order) and the call's options."""
    import cupy

    q = random((batch, 1, HEADS, HEADDIM), rng)
    if page_size:
        pages = batch * context // page_size
        shape = (pages, page_size, HEADS_K, HEADDIM)
        table = cupy.asarray(rng.permutation(pages).reshape(batch, context // page_size).astype(numpy.int32))
    else:
        shape, table = (batch, context, HEADS_K, HEADDIM), None
    k_cache, v_cache = random(shape, rng), random(shape, rng)
    lengths = cupy.full(batch, context, numpy.int32)
    return q, k_cache, v_cache, {"cache_seqlens": lengths, "block_table": table}


def torch_peers(peers, batch, context, repeats):
    """torch's FlashAttention-2 and cuDNN decode times (ms), None where a backend refuses the shape."""
    torch = peers.torch
    q = torch.randn(batch, HEADS, 1, HEADDIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, HEADS_K, context, HEADDIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    times = {}
    for name, system in (("fa2", "torch_fa2"), ("cudnn", "torch_cudnn")):
        try:
            with peers.sdpa_kernel([peers.backends[system]]):
                times[name] = median_ms(lambda q=q, k=k, v=v: peers.sdpa(q, k, v, enable_gqa=True), repeats)
        except Exception as exc:  # noqa: BLE001 (a backend that refuses the shape shows n/a)
            times[name] = None
            print(f"  torch {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
    del q, k, v
    torch.cuda.empty_cache()
    return times


def decode_rows(repeats, peers):
    """TB/s of K and V read per decode row: dense, pages of 16 and of 1, and the torch peers on a dense cache."""
    import cupyflash

    rows = []
    rng = numpy.random.default_rng(0)
    for batch, context in DECODE_ROWS:
        gbytes = batch * context * HEADS_K * HEADDIM * 2 * 2 / 1e9
        row = {"batch": batch, "context": context}
        for page_size in (0, 16, 1):
            q, k_cache, v_cache, options = decode_inputs(batch, context, page_size, rng)
            ms = median_ms(lambda q=q, k_cache=k_cache, v_cache=v_cache, options=options:
                           cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **options), repeats)
            row[f"page{page_size}" if page_size else "dense"] = gbytes / ms  # TB/s
            del q, k_cache, v_cache, options
            harness.release_cached_memory()
        if peers is not None:
            for name, ms in torch_peers(peers, batch, context, repeats).items():
                row[name] = gbytes / ms if ms else None
        rows.append(row)
    return rows


def prefill_row(repeats, seqlen_q=512, context=32768, page_sizes=(16, 64)):
    """TFLOP/s of a chunk of ``seqlen_q`` causal queries against a full cache, dense and paged (``page_sizes``,
    pages in a random order: issue 26's paged prefill, at least 0.95x the dense forward), beside
    flash_attention's."""
    import cupyflash

    rng = numpy.random.default_rng(1)
    q = random((1, seqlen_q, HEADS, HEADDIM), rng)
    k_cache, v_cache = random((1, context, HEADS_K, HEADDIM), rng), random((1, context, HEADS_K, HEADDIM), rng)
    # The chunk is the last seqlen_q positions: query i sees keys 0 .. context - seqlen_q + i.
    visible = seqlen_q * (context - seqlen_q) + seqlen_q * (seqlen_q + 1) / 2
    flops = 4 * HEADS * HEADDIM * visible
    cached = cupyflash.flash_attention_with_kvcache
    ms_cache = median_ms(lambda: cached(q, k_cache, v_cache, cache_seqlens=context, causal=True), repeats)
    ms_dense = median_ms(lambda: cupyflash.flash_attention(q, k_cache, v_cache, causal=True), repeats)
    row = {"seqlen_q": seqlen_q, "context": context, "kvcache": flops / ms_cache / 1e9,
           "dense_forward": flops / ms_dense / 1e9}
    for page_size in page_sizes:
        row[f"paged{page_size}"] = flops / _paged_prefill_ms(q, k_cache, v_cache, page_size, rng, repeats) / 1e9
    return row


def _paged_prefill_ms(q, k_cache, v_cache, page_size, rng, repeats):
    """Median ms of the chunk against the cache held in pages of ``page_size`` rows, in a random order."""
    import cupy

    import cupyflash

    context = k_cache.shape[1]
    pages = context // page_size
    order = cupy.asarray(rng.permutation(pages).astype(numpy.int32))
    pools = []
    for x in (k_cache, v_cache):
        pool = cupy.empty((pages, page_size) + x.shape[2:], x.dtype)
        pool[order] = x.reshape((pages, page_size) + x.shape[2:])
        pools.append(pool)
    return median_ms(lambda: cupyflash.flash_attention_with_kvcache(q, *pools, cache_seqlens=context,
                                                                    block_table=order[None, :], causal=True), repeats)


def cascade_row(repeats, requests=64, prefix=8192, own=512):
    """Issue 26's cascade row: ``requests`` decode tokens sharing a ``prefix``-key system prompt, each with
    ``own`` keys of its own. Shared: the prefix attended once for all (the requests' queries as one batch
    entry of ``requests`` rows, broadcast, not copied), its keys split into parts attended side by side
    (one batch entry each, enough of them that the work tiles cover the SMs: one walk of 64 key tiles per
    head left 100 of 132 idle, session 30) and merged (merge_attention_states_stacked over views of the
    results), each request's own keys by flash_attention_with_kvcache, the two merged; unshared: one decode
    call over every request's whole cache (prefix copies included). Milliseconds per step of each, of the
    shared step's three stages alone, and the speedup (target: at least 3x)."""
    import cupy

    import cupyflash

    rng = numpy.random.default_rng(2)
    q = random((requests, 1, HEADS, HEADDIM), rng)
    prefix_k, prefix_v = random((1, prefix, HEADS_K, HEADDIM), rng), random((1, prefix, HEADS_K, HEADDIM), rng)
    own_k, own_v = random((requests, own, HEADS_K, HEADDIM), rng), random((requests, own, HEADS_K, HEADDIM), rng)
    full_k = cupy.concatenate([cupy.broadcast_to(prefix_k, (requests, prefix, HEADS_K, HEADDIM)), own_k], axis=1)
    full_v = cupy.concatenate([cupy.broadcast_to(prefix_v, (requests, prefix, HEADS_K, HEADDIM)), own_v], axis=1)
    # Parts: the fewest powers of two whose work tiles (one per 128 queries and head) cover the SMs.
    tiles = -(-requests // 128) * HEADS
    splits = 1
    while splits * tiles < cupy.cuda.Device().attributes["MultiProcessorCount"] and prefix % (2 * splits) == 0:
        splits *= 2
    k_parts = prefix_k.reshape(splits, prefix // splits, HEADS_K, HEADDIM)
    v_parts = prefix_v.reshape(splits, prefix // splits, HEADS_K, HEADDIM)
    q_parts = cupy.broadcast_to(q.reshape(1, requests, HEADS, HEADDIM), (splits, requests, HEADS, HEADDIM))

    def prefix_parts():
        return cupyflash.flash_attention(q_parts, k_parts, v_parts, return_lse=True)

    def own_part():
        return cupyflash.flash_attention_with_kvcache(q, own_k, own_v, return_lse=True)

    out_p, lse_p = prefix_parts()
    own_out, own_lse = own_part()

    def merges(out_p=out_p, lse_p=lse_p, own_out=own_out, own_lse=own_lse):
        shared_out, shared_lse = cupyflash.merge_attention_states_stacked(
            out_p.reshape(splits, requests, 1, HEADS, HEADDIM), lse_p.transpose(0, 2, 1)[..., None])
        return cupyflash.merge_attention_states(shared_out, shared_lse, own_out, own_lse)

    def shared():
        return merges(*prefix_parts(), *own_part())

    ms = {name: median_ms(call, repeats) for name, call in
          (("shared_ms", shared), ("prefix_ms", prefix_parts), ("own_ms", own_part), ("merge_ms", merges))}
    ms_unshared = median_ms(lambda k=full_k, v=full_v: cupyflash.flash_attention_with_kvcache(q, k, v), repeats)
    del full_k, full_v
    harness.release_cached_memory()
    return {"requests": requests, "prefix": prefix, "own": own, "splits": splits, **ms,
            "unshared_ms": ms_unshared, "speedup": ms_unshared / ms["shared_ms"]}


def mla_rows(repeats, general=True):
    """Issue 26's MLA rows: per query-head count, TB/s of the latent cache read and TFLOP/s, of the call
    with v_cache the view (the MLA decode kernel where it takes the call) and, with ``general``, with
    v_cache a copy (the general path, 0.3-2.3 s a call; a few timings; --quick leaves it out)."""
    import cupy

    import cupyflash

    rng = numpy.random.default_rng(3)
    pages = MLA_BATCH * MLA_CONTEXT // MLA_PAGE
    latent = random((pages, MLA_PAGE, 1, 576), rng)
    table = cupy.asarray(rng.permutation(pages).reshape(MLA_BATCH, -1).astype(numpy.int32))
    seqlens = cupy.full((MLA_BATCH,), MLA_CONTEXT, dtype=numpy.int32)
    options = {"cache_seqlens": seqlens, "block_table": table, "softmax_scale": 576 ** -0.5}
    gbytes = MLA_BATCH * MLA_CONTEXT * 576 * 2 / 1e9
    rows = []
    for heads in MLA_HEADS:
        q = random((MLA_BATCH, 1, heads, 576), rng)
        gflop = 2 * MLA_BATCH * heads * MLA_CONTEXT * (576 + 512) / 1e9
        ms = median_ms(lambda q=q: cupyflash.flash_attention_with_kvcache(q, latent, latent[..., :512], **options), repeats)
        ms_general = None
        if general:
            v_copy = cupy.ascontiguousarray(latent[..., :512])
            ms_general = median_ms(lambda q=q, v=v_copy: cupyflash.flash_attention_with_kvcache(q, latent, v, **options), 3)
            del v_copy
            harness.release_cached_memory()
        # The general path reads V as an array of its own: 512 more columns of bytes than the view's.
        general_gbytes = MLA_BATCH * MLA_CONTEXT * (576 + 512) * 2 / 1e9
        rows.append({"heads": heads, "ms": ms, "tbs": gbytes / ms, "tflops": gflop / ms, "general_ms": ms_general,
                     "general_tbs": None if ms_general is None else general_gbytes / ms_general})
    return rows


def fp8_row(repeats, batch=8, context=32768):
    """Issue 25's e4m3 decode row: ms per step of the dense bf16 decode row and of the same with q, K and V
    e4m3, and tokens per second of e4m3 over bf16 (None where the e4m3 cache does not run on CuPy)."""
    import cupyflash

    rng = numpy.random.default_rng(4)
    q, k_cache, v_cache, options = decode_inputs(batch, context, 0, rng)
    bf16_ms = median_ms(lambda: cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **options), repeats)
    # quantize_fp8 on the GPU (its descales dropped: the timing needs e4m3 bytes, not their scale).
    q8, k8, v8 = (cupyflash.quantize_fp8(x)[0] for x in (q, k_cache, v_cache))
    try:
        e4m3_ms = median_ms(lambda: cupyflash.flash_attention_with_kvcache(q8, k8, v8, **options), repeats)
    except NotImplementedError:
        e4m3_ms = None
    return {"batch": batch, "context": context, "bf16_ms": bf16_ms, "e4m3_ms": e4m3_ms,
            "speedup": bf16_ms / e4m3_ms if e4m3_ms else None}


def call_times():
    """Microseconds per decode call (batch 1, :data:`CALL_CONTEXT` keys) from Python and per CUDA graph replay."""
    import cupy

    import cupyflash

    rng = numpy.random.default_rng(2)
    q, k_cache, v_cache, options = decode_inputs(1, CALL_CONTEXT, 0, rng)

    def call():
        return cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **options)

    harness.warm_up(call, CALL_WARMUP)
    per_call = harness.host_loop(call, CALLS) * 1e6
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = call()
        graph = stream.end_capture()
        harness.warm_up(lambda: graph.launch(stream), CALL_WARMUP)
        start = time.perf_counter()
        for _ in range(CALLS):
            graph.launch(stream)
        stream.synchronize()
    per_replay = (time.perf_counter() - start) / CALLS * 1e6
    del out
    return {"call_us": per_call, "graph_replay_us": per_replay}


def plot(results, path):
    """Bars of the decode rows (TB/s) beside the copy ceiling; False when matplotlib is missing."""
    plt = harness.pyplot()
    if plt is None:
        return False
    columns = (("dense", "cupyflash dense"), ("page16", "cupyflash paged 16"), ("page1", "cupyflash paged 1"),
               ("fa2", "torch FA2 (dense)"), ("cudnn", "cuDNN (dense)"))
    rows = results["decode"]
    figure, axes = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(columns)
    for c, (key, label) in enumerate(columns):
        values = [r.get(key) or 0.0 for r in rows]
        axes.bar([i + c * width for i in range(len(rows))], values, width, label=label)
    axes.axhline(COPY_CEILING, color="black", linestyle="--", linewidth=1, label=f"device copy {COPY_CEILING} TB/s")
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    axes.set_xticklabels([f"{r['batch']} x {r['context']}" for r in rows])
    axes.set_ylabel("K and V bytes read, TB/s")
    axes.set_title("Decode, GQA 32/8, head dim 128, bf16")
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def table_lines(results):
    """The decode table (markdown), the chunked-prefill, call-time and cascade lines, of the rows run."""

    def fmt(x):
        return "n/a" if x is None else f"{x:.2f}"

    lines = []
    if "decode" in results:
        lines += ["", "Decode, TB/s (K and V bytes / time), GQA 32/8, d128, bf16:",
                  "| batch x context | dense | paged 16 | paged 1 | torch FA2 | cuDNN |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['batch']} x {r['context']} | {fmt(r['dense'])} | {fmt(r['page16'])} | {fmt(r['page1'])} | "
                  f"{fmt(r.get('fa2'))} | {fmt(r.get('cudnn'))} |" for r in results["decode"]]
    lines.append("")
    if "prefill" in results:
        p = results["prefill"]
        lines.append(f"Chunked prefill {p['seqlen_q']} x {p['context']} causal, TFLOP/s: kvcache {p['kvcache']:.0f}, "
                     + "".join(f"paged {n[5:]} {x:.0f}, " for n, x in p.items() if n.startswith("paged"))
                     + f"dense forward {p['dense_forward']:.0f}")
    if "calls" in results:
        c = results["calls"]
        lines.append(f"Decode call (batch 1, 4k): {c['call_us']:.1f} us per call from Python, "
                     f"{c['graph_replay_us']:.1f} us per graph replay")
    if "cascade" in results:
        x = results["cascade"]
        lines.append(f"Cascade {x['requests']} x ({x['prefix']} shared in {x.get('splits', 1)} parts + {x['own']} own): "
                     f"{x['shared_ms']:.3f} ms shared, {x['unshared_ms']:.3f} ms unshared, {x['speedup']:.2f}x"
                     + (f" (alone: prefix parts {x['prefix_ms']:.3f}, own {x['own_ms']:.3f}, merges {x['merge_ms']:.3f} ms)"
                        if "merge_ms" in x else ""))
    if "fp8" in results:
        x = results["fp8"]
        e4m3 = "n/a" if x["e4m3_ms"] is None else f"{x['e4m3_ms']:.3f} ms, {x['speedup']:.2f}x the tokens per second"
        lines.append(f"e4m3 cache {x['batch']} x {x['context']} (GQA 32/8, d128): bf16 {x['bf16_ms']:.3f} ms, e4m3 {e4m3}")
    if "mla" in results:
        lines += ["", f"MLA decode, batch {MLA_BATCH} x {MLA_CONTEXT}, pages of {MLA_PAGE}, bf16:",
                  "| query heads | ms | TB/s | TFLOP/s | general path ms | TB/s |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['heads']} | {r['ms']:.3f} | {r['tbs']:.2f} | {r['tflops']:.0f} | "
                  + ("- | - |" if r["general_ms"] is None else f"{r['general_ms']:.3f} | {r['general_tbs']:.2f} |")
                  for r in results["mla"]]
    return lines


def main(argv=None):
    """Run the benchmark (or redraw a saved run); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REPEATS} timings per row instead of {REPEATS}")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=ROWS, help="which rows to run (default: all)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write a bar chart of the decode rows here (needs matplotlib)")
    parser.add_argument("--plot-from", type=Path, help="only plot the results of an earlier --json run (no GPU needed)")
    args = parser.parse_args(argv)
    if args.plot_from:
        if not plot(json.loads(args.plot_from.read_text()), args.plot or args.plot_from.with_suffix(".png")):
            print("no plot: matplotlib missing")
        return 0
    harness.require_gpu("decode.py", "--plot-from redraws a saved run without one.")
    repeats = QUICK_REPEATS if args.quick else REPEATS
    peers, _ = harness.load_torch()
    runs = {"calls": call_times, "decode": lambda: decode_rows(repeats, peers), "prefill": lambda: prefill_row(repeats),
            "cascade": lambda: cascade_row(repeats), "mla": lambda: mla_rows(repeats, general=not args.quick),
            "fp8": lambda: fp8_row(repeats)}
    results = {name: runs[name]() for name in ROWS if name in args.rows}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot and "decode" in results and not plot(results, args.plot):
        print("no plot: matplotlib missing")
    print("\n".join(table_lines(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
