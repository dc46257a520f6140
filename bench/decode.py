"""Benchmark of cupyflash.flash_attention_with_kvcache (issue 11's targets) beside torch's attention.

Run from the repository root::

    python bench/decode.py               # decode rows, paged rows, chunked prefill, call times
    python bench/decode.py --quick       # fewer repetitions

Decode: one query token per sequence, 32 query heads sharing 8 kv heads, head dim 128, bf16, the cache
full (cache_seqlens = context); bandwidth = K and V bytes read / time (the measure of ../shared/PEERS.md;
device copy ceiling 4.24 TB/s on the H200). Paged rows use a random page order. Chunked prefill: 512
new queries (causal) against a 32k cache, TFLOP/s on the visible pairs, beside cupyflash's dense
forward of the same shapes. Call times: batch 1, 4k context, from Python (calls per second of a loop
that synchronizes once) and as CUDA graph replays. Times are medians of CUDA-event timings.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import cupy
import ml_dtypes
import numpy

REPO_ROOT = Path(__file__).resolve().parent.parent
try:
    import cupyflash
except ImportError:
    sys.path.insert(0, str(REPO_ROOT))
    import cupyflash

HEADS, HEADS_K, HEADDIM = 32, 8, 128
DECODE_ROWS = ((1, 131072), (8, 32768), (64, 4096))
BF16 = numpy.dtype(ml_dtypes.bfloat16)


def median_ms(fn, repeats, warmup=3, inner=10):
    """Median over ``repeats`` of the time per call of ``inner`` back-to-back calls (a decoding loop:
    the host prepares the next call while the GPU runs the last one)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / inner)
    return float(numpy.median(times))


def random(shape, rng):
    return cupy.asarray(rng.standard_normal(shape, dtype=numpy.float32)).astype(BF16)


def decode_inputs(batch, context, page_size, rng):
    q = random((batch, 1, HEADS, HEADDIM), rng)
    if page_size:
        pages = batch * context // page_size
        shape = (pages, page_size, HEADS_K, HEADDIM)
        table = cupy.asarray(rng.permutation(pages).reshape(batch, context // page_size).astype(numpy.int32))
    else:
        shape, table = (batch, context, HEADS_K, HEADDIM), None
    k_cache, v_cache = random(shape, rng), random(shape, rng)
    lengths = cupy.full(batch, context, numpy.int32)
    return q, k_cache, v_cache, dict(cache_seqlens=lengths, block_table=table)


def torch_peers(batch, context, repeats):
    """torch's FlashAttention-2 and cuDNN decode times (ms), None where unavailable."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa
    except ImportError:
        return {}
    q = torch.randn(batch, HEADS, 1, HEADDIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, HEADS_K, context, HEADDIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    times = {}
    for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                times[name] = median_ms(lambda: sdpa(q, k, v, enable_gqa=True), repeats)
        except Exception as exc:  # a backend that refuses the shape
            times[name] = None
            print(f"  torch {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
    del q, k, v
    torch.cuda.empty_cache()
    return times


def decode_rows(repeats):
    rows = []
    rng = numpy.random.default_rng(0)
    for batch, context in DECODE_ROWS:
        gbytes = batch * context * HEADS_K * HEADDIM * 2 * 2 / 1e9
        row = {"batch": batch, "context": context}
        for page_size in (0, 16, 1):
            q, k_cache, v_cache, kw = decode_inputs(batch, context, page_size, rng)
            ms = median_ms(lambda: cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **kw), repeats)
            row[f"page{page_size}" if page_size else "dense"] = gbytes / ms  # TB/s
            del q, k_cache, v_cache, kw
            cupy.get_default_memory_pool().free_all_blocks()
        for name, ms in torch_peers(batch, context, repeats).items():
            row[name] = gbytes / ms if ms else None
        rows.append(row)
    return rows


def prefill_row(repeats, seqlen_q=512, context=32768):
    rng = numpy.random.default_rng(1)
    q = random((1, seqlen_q, HEADS, HEADDIM), rng)
    k_cache, v_cache = random((1, context, HEADS_K, HEADDIM), rng), random((1, context, HEADS_K, HEADDIM), rng)
    # The chunk is the last seqlen_q positions: query i sees keys 0 .. context - seqlen_q + i.
    visible = seqlen_q * (context - seqlen_q) + seqlen_q * (seqlen_q + 1) / 2
    flops = 4 * HEADS * HEADDIM * visible
    cached = cupyflash.flash_attention_with_kvcache
    ms_cache = median_ms(lambda: cached(q, k_cache, v_cache, cache_seqlens=context, causal=True), repeats)
    ms_dense = median_ms(lambda: cupyflash.flash_attention(q, k_cache, v_cache, causal=True), repeats)
    return {"seqlen_q": seqlen_q, "context": context, "kvcache": flops / ms_cache / 1e9,
            "dense_forward": flops / ms_dense / 1e9}


def call_times(calls=2000, context=4096):
    rng = numpy.random.default_rng(2)
    q, k_cache, v_cache, kw = decode_inputs(1, context, 0, rng)

    def call():
        return cupyflash.flash_attention_with_kvcache(q, k_cache, v_cache, **kw)

    for _ in range(20):
        call()
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    cupy.cuda.Device().synchronize()
    per_call = (time.perf_counter() - start) / calls * 1e6
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = call()
        graph = stream.end_capture()
        for _ in range(20):
            graph.launch(stream)
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            graph.launch(stream)
        stream.synchronize()
    per_replay = (time.perf_counter() - start) / calls * 1e6
    del out
    return {"call_us": per_call, "graph_replay_us": per_replay}


def plot(results, path):
    """Bars of the decode rows (TB/s) beside the copy ceiling; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    columns = (("dense", "cupyflash dense"), ("page16", "cupyflash paged 16"), ("page1", "cupyflash paged 1"),
               ("fa2", "torch FA2 (dense)"), ("cudnn", "cuDNN (dense)"))
    rows = results["decode"]
    figure, axes = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(columns)
    for c, (key, label) in enumerate(columns):
        values = [r.get(key) or 0.0 for r in rows]
        axes.bar([i + c * width for i in range(len(rows))], values, width, label=label)
    axes.axhline(4.24, color="black", linestyle="--", linewidth=1, label="device copy 4.24 TB/s")
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    axes.set_xticklabels([f"{r['batch']} x {r['context']}" for r in rows])
    axes.set_ylabel("K and V bytes read, TB/s")
    axes.set_title("Decode, GQA 32/8, head dim 128, bf16")
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--plot", type=Path, help="write a bar chart of the decode rows here (needs matplotlib)")
    parser.add_argument("--plot-from", type=Path, help="only plot the results of an earlier --json run")
    args = parser.parse_args()
    if args.plot_from:
        plot(json.loads(args.plot_from.read_text()), args.plot or args.plot_from.with_suffix(".png"))
        return
    repeats = 10 if args.quick else 30
    results = {"calls": call_times(), "decode": decode_rows(repeats), "prefill": prefill_row(repeats)}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot and not plot(results, args.plot):
        print("no plot: matplotlib missing")

    def fmt(x):
        return "n/a" if x is None else f"{x:.2f}"

    print("\nDecode, TB/s (K and V bytes / time), GQA 32/8, d128, bf16:")
    print("| batch x context | dense | paged 16 | paged 1 | torch FA2 | cuDNN |")
    print("|---|---|---|---|---|---|")
    for r in results["decode"]:
        print(f"| {r['batch']} x {r['context']} | {fmt(r['dense'])} | {fmt(r['page16'])} | {fmt(r['page1'])} | "
              f"{fmt(r.get('fa2'))} | {fmt(r.get('cudnn'))} |")
    p = results["prefill"]
    print(f"\nChunked prefill {p['seqlen_q']} x {p['context']} causal, TFLOP/s: kvcache {p['kvcache']:.0f}, "
          f"dense forward {p['dense_forward']:.0f}")
    c = results["calls"]
    print(f"Decode call (batch 1, 4k): {c['call_us']:.1f} us per call from Python, {c['graph_replay_us']:.1f} us "
          "per graph replay")


if __name__ == "__main__":
    main()
