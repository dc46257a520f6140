"""Ring attention across the GPUs of one machine: the launcher of issue 12 (one process per GPU, the NCCL
unique id made by the parent and handed to the children), a check against single-GPU attention, and the
scaling benchmark.

Run from the repository root on a machine with N GPUs (cupyflash installed, or ``PYTHONPATH=$PWD``; CuPy's
NCCL comes from the nvidia-nccl wheel)::

    python bench/ring.py --gpus 2 --check      # ring == single-GPU flash_attention, causal and not
    python bench/ring.py --gpus 2              # scaling: 128k tokens, forward + backward, bf16, d128
    python bench/ring.py --gpus 8 --seqlen 1048576 --single-seqlen 131072   # issue 27: 1M tokens
    python bench/ring.py --gpus 8 --seqlen 1048576 --single-seqlen 131072 --heads 32 --heads-k 8   # GQA

Across machines the same ``worker`` runs under mpirun or Slurm: every process takes its rank and the
world size from the launcher's environment (OMPI_COMM_WORLD_RANK / SLURM_PROCID and their sizes), rank 0
makes ``cupy.cuda.nccl.get_unique_id()`` and shares it (an MPI broadcast, or a file on a shared disk),
and each process builds ``NcclCommunicator(world, unique_id, rank)`` on its local GPU; nothing else
changes, since NCCL carries the bytes between nodes.

Scaling measure: TFLOP/s of the whole problem (forward 4 * batch * heads * seqlen^2 * headdim, halved
when causal; backward 2.5x) on the ring against the GPUs' count times the single-GPU rate (the target: at
least 0.9x), and each rank's memory high-water mark during a ring forward and backward beyond its
inputs, in units of one shard of q. The single-GPU rate is that of the same problem, or with
``--single-seqlen`` of the problem at that length (the largest one GPU runs in reasonable time: a
million-token causal forward and backward takes minutes on one GPU).

Every rank draws only its own rows of the problem: the rows come in blocks of ``ROW_BLOCK``, each from a
generator seeded by (tensor, block), so the ranks' shards and rank 0's single-GPU problem (the check's)
are rows of one problem without any rank holding all of it (a million tokens of q, k, v and dout in
float32 would be 32 GB of host memory a rank).

The workers are started with multiprocessing's spawn: each is a new interpreter that gets the parent's
``sys.path`` (this directory first, then ``PYTHONPATH``) and environment, so it imports this file, the
harness and cupyflash from the same places as the parent.
"""

import argparse
import json
import multiprocessing
import queue
import sys
import warnings
from pathlib import Path

import harness
import numpy

#: Untimed calls before each timing.
WARMUP_CALLS = 2
#: Rows of the problem drawn by one generator (_rows).
ROW_BLOCK = 1024
#: (name, causal, layout, window_size) of the rings checked against one GPU; the scaling run times the
#: first two (the issue's target).
CONFIGS = [
    ("full", False, None, (-1, -1)),
    ("causal", True, "zigzag", (-1, -1)),
    ("window", False, "zigzag", (700, 300)),
    ("causal_window", True, "contiguous", (1500, 0)),
]


def _rows(xp, tensor, spans, heads, headdim, dtype, seed):
    """Rows ``spans`` ([(start, stop), ...], concatenated) of tensor ``tensor`` (0 q, 1 k, 2 v, 3 dout) of
    the problem ``seed``, shape (1, rows, heads, headdim): standard normal, block b of ROW_BLOCK rows from
    a generator seeded by (seed, tensor, b), so any rows of the problem can be drawn alone."""
    parts = []
    for start, stop in spans:
        for block in range(start // ROW_BLOCK, -(-stop // ROW_BLOCK)):
            rng = numpy.random.default_rng((seed, tensor, block))
            rows = rng.standard_normal((ROW_BLOCK, heads, headdim), dtype=numpy.float32)
            lo, hi = max(start - block * ROW_BLOCK, 0), min(stop - block * ROW_BLOCK, ROW_BLOCK)
            parts.append(xp.asarray(rows[lo:hi]).astype(dtype))
    return xp.concatenate(parts)[None]


def _spans(seqlen, world, rank, layout):
    """Rank ``rank``'s rows of a ``seqlen`` sequence: zigzag (chunks rank and 2 world - 1 - rank of 2 world,
    as cupyflash.zigzag_shard; also for unmasked rings, where any split works) or contiguous."""
    if layout != "contiguous":
        chunk = seqlen // (2 * world)
        return [(rank * chunk, (rank + 1) * chunk), ((2 * world - 1 - rank) * chunk, (2 * world - rank) * chunk)]
    rows = seqlen // world
    return [(rank * rows, (rank + 1) * rows)]


def _problem(xp, spans, args, dtype, seed=0):
    """q, k, v and dout of rows ``spans`` (q and dout with args.heads heads, k and v with args.heads_k)."""
    heads = (args.heads, args.heads_k, args.heads_k, args.heads)
    return [_rows(xp, t, spans, heads[t], args.headdim, dtype, seed) for t in range(4)]


def _unshard(cupyflash, shards, layout, axis=1):
    if layout != "contiguous":
        return cupyflash.zigzag_unshard(shards, axis)
    return numpy.concatenate(shards, axis=axis)


def worker(rank, world, unique_id, args, results):
    """One rank: its shards of the same random problem on every rank, the ring forward and backward,
    and (rank 0) the single-GPU reference or timing. Puts (rank, payload) on ``results``."""
    import cupy

    cupy.cuda.Device(rank).use()  # before cupyflash touches a device
    from cupy.cuda import nccl

    import cupyflash

    dtype = harness.dtype("bf16")
    comm = nccl.NcclCommunicator(world, unique_id, rank)
    pool = cupy.get_default_memory_pool()
    payload = {}
    configs = CONFIGS if args.check else CONFIGS[:2]

    def timed(fn):
        """Seconds per call, the mean of ``--repeats`` calls after two warm-up calls."""
        for _ in range(WARMUP_CALLS):
            fn()
        return harness.host_loop(fn, args.repeats)

    # Every rank runs the ring calls in the same order; rank 0's single-GPU runs come after all of them,
    # so no rank waits in NCCL for them.
    for name, causal, layout, window in configs:
        options = {"causal": causal, "layout": layout, "window_size": window}
        shard = _problem(cupy, _spans(args.seqlen, world, rank, layout), args, dtype)
        if args.check:
            out, lse = cupyflash.ring_flash_attention(*shard[:3], comm, return_lse=True, **options)
            grads = cupyflash.ring_flash_attention_backward(shard[3], *shard[:3], out, lse, comm, **options)
            payload[name] = [x.get() for x in (out, lse, *grads)]
            continue

        def ring_step(shard=shard, options=options):
            out, vjp = cupyflash.ring_flash_attention_vjp(*shard[:3], comm, **options)
            return out, vjp(shard[3])

        # High-water mark: the pool keeps every block it allocated, so its size after one step, less its
        # size before, bounds what the step held at once (results included).
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()
        before = pool.total_bytes()
        ring_step()
        cupy.cuda.Device().synchronize()
        payload[(name, "memory")] = (pool.total_bytes() - before) / shard[0].nbytes
        payload[name] = timed(ring_step)
        del shard
    if rank == 0:
        q, k, v, dout = _problem(cupy, [(0, args.single_seqlen)], args, dtype)
    for name, causal, layout, window in configs if rank == 0 else ():
        options = {"causal": causal, "window_size": window}

        def single(options=options):
            out, lse = cupyflash.flash_attention(q, k, v, return_lse=True, **options)
            return out, lse, cupyflash.flash_attention_backward(dout, q, k, v, out, lse, **options)

        if args.check:
            out, lse, grads = single()
            payload[("single", name)] = [x.get() for x in (out, lse, *grads)]
        else:
            payload[("single", name)] = timed(single)
    results.put((rank, payload))


def plot(report, gpus, path):
    """Bars of the ring's TFLOP/s beside twice the single-GPU rate and the 0.9x target; False when
    matplotlib is missing."""
    plt = harness.pyplot()
    if plt is None:
        return False
    names = [n for n in report if n != "problem"]
    problem = report.get("problem", {"seqlen": 131072, "heads": 16, "headdim": 128})
    figure, axes = plt.subplots(figsize=(6, 4))
    ring = [report[n]["ring_tflops"] for n in names]
    ideal = [gpus * report[n]["single_tflops"] for n in names]
    axes.bar([i - 0.2 for i in range(len(names))], ring, 0.4, label=f"ring on {gpus} GPUs")
    axes.bar([i + 0.2 for i in range(len(names))], ideal, 0.4, label=f"{gpus} x one GPU")
    for i, value in enumerate(ideal):
        axes.plot([i - 0.4, i + 0.4], [0.9 * value] * 2, color="black", linestyle="--", linewidth=1,
                  label="target 0.9x" if i == 0 else None)
        axes.text(i - 0.2, ring[i], f"{ring[i] / value:.2f}x", ha="center", va="bottom", fontsize=8)
    axes.set_xticks(range(len(names)))
    axes.set_xticklabels(["non-causal" if n == "full" else "causal (zigzag)" for n in names])
    axes.set_ylabel("forward + backward, TFLOP/s")
    axes.set_title(f"Ring attention, {problem['seqlen'] // 1024}k tokens, {problem['heads']} heads, "
                   f"head dim {problem['headdim']}, bf16")
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def nccl_problem(gpus):
    """Why the ring cannot run here with ``gpus`` GPUs (too few, or no NCCL in CuPy), or None."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if count < gpus:
        return f"--gpus {gpus} needs {gpus} CUDA GPUs; this machine has {count}"
    with warnings.catch_warnings():  # CuPy warns at import when the NCCL library is missing
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    if not getattr(nccl, "available", False):
        return "needs CuPy's NCCL (cupy.cuda.nccl is not available): install nvidia-nccl-cu12 or nvidia-nccl-cu13"
    return None


def run_ranks(args):
    """Start one spawned worker per GPU and collect their payloads {rank: payload}; a rank that fails stops
    the others (they would wait for it in NCCL) and ends the launcher with its exit code."""
    from cupy.cuda import nccl

    unique_id = nccl.get_unique_id()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=worker, args=(r, args.gpus, unique_id, args, results))
                 for r in range(args.gpus)]
    for p in processes:
        p.start()
    payloads = {}
    while len(payloads) < len(processes):
        try:
            rank, payload = results.get(timeout=5)
            payloads[rank] = payload
        except queue.Empty:
            failed = [p.exitcode for p in processes if p.exitcode]
            if failed:
                for p in processes:
                    p.terminate()
                raise SystemExit(f"a rank failed with exit code {failed[0]}") from None
    for p in processes:
        p.join()
    return payloads


def main(argv=None):
    """Run the check or the scaling benchmark (or redraw a saved run); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=harness.positive_int, default=2, help="ranks, one per GPU (default 2)")
    parser.add_argument("--seqlen", type=harness.positive_int, default=131072, help="tokens of the whole sequence")
    parser.add_argument("--single-seqlen", type=harness.positive_int, default=None,
                        help="tokens of the single-GPU baseline (default: --seqlen)")
    parser.add_argument("--heads", type=harness.positive_int, default=16)
    parser.add_argument("--heads-k", type=harness.positive_int, default=None, help="kv heads (default: --heads)")
    parser.add_argument("--headdim", type=harness.positive_int, default=128)
    parser.add_argument("--repeats", type=harness.positive_int, default=5, help="timed calls (mean), after 2 warm-up calls")
    parser.add_argument("--check", action="store_true", help="compare with single-GPU attention (4096 tokens)")
    parser.add_argument("--json", type=Path, help="write the errors (--check) or rates here")
    parser.add_argument("--plot", type=Path, help="write a bar chart of the scaling run here (needs matplotlib)")
    parser.add_argument("--plot-from", type=Path, help="only plot the rates of an earlier --json scaling run (no GPU needed)")
    args = parser.parse_args(argv)
    if args.plot_from:
        if not plot(json.loads(args.plot_from.read_text()), args.gpus, args.plot or args.plot_from.with_suffix(".png")):
            print("no plot: matplotlib missing")
        return 0
    harness.require_gpu("ring.py", "--plot-from redraws a saved run without one.")
    problem = nccl_problem(args.gpus)
    if problem:
        print(f"ring.py {problem}.", file=sys.stderr)
        return harness.EXIT_CANNOT_RUN
    if args.check:
        args.seqlen = 4096
    args.single_seqlen = args.seqlen if args.check or args.single_seqlen is None else args.single_seqlen
    args.heads_k = args.heads_k or args.heads
    if args.heads % args.heads_k or args.seqlen % (2 * args.gpus):
        print(f"ring.py needs --heads a multiple of --heads-k and --seqlen a multiple of 2 x --gpus, got "
              f"{args.heads}, {args.heads_k}, {args.seqlen}", file=sys.stderr)
        return 2
    payloads = run_ranks(args)
    import cupyflash

    report = {} if args.check else {"problem": {"seqlen": args.seqlen, "heads": args.heads, "heads_k": args.heads_k,
                                                "headdim": args.headdim, "single_seqlen": args.single_seqlen}}
    for name, causal, layout, _ in CONFIGS if args.check else CONFIGS[:2]:
        if args.check:
            single = payloads[0][("single", name)]
            for i, label in enumerate(("out", "lse", "dq", "dk", "dv")):
                axis = 2 if label == "lse" else 1
                ring = _unshard(cupyflash, [payloads[r][name][i] for r in range(args.gpus)], layout, axis)
                ring, want = ring.astype(numpy.float64), single[i].astype(numpy.float64)
                error = float(numpy.abs(ring - want).max() / max(numpy.abs(want).max(), 1e-30))
                report[f"{name}_{label}"] = error
                print(f"{name:14} {label:4} max |ring - single| / max |single| = {error:.2e}")
            continue
        def flops(seqlen, causal=causal):
            forward = harness.forward_flops(1, args.heads, seqlen, seqlen, args.headdim, causal)
            return forward + harness.backward_flops(forward)

        ring_time = max(payloads[r][name] for r in range(args.gpus))
        single_time = payloads[0][("single", name)]
        ring_rate, single_rate = flops(args.seqlen) / ring_time / 1e12, flops(args.single_seqlen) / single_time / 1e12
        memory = max(payloads[r][(name, "memory")] for r in range(args.gpus))
        report[name] = {"ring_tflops": ring_rate, "single_tflops": single_rate,
                        "scaling": ring_rate / (args.gpus * single_rate), "memory_shards": memory}
        print(f"{name:7} forward+backward: ring {ring_rate:.0f} TFLOP/s on {args.gpus} GPUs, one GPU "
              f"{single_rate:.0f} (at {args.single_seqlen} tokens): {ring_rate / (args.gpus * single_rate):.2f}x "
              f"of {args.gpus}x one GPU; "
              f"high-water {memory:.1f} q shards per rank")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.plot and not args.check and not plot(report, args.gpus, args.plot):
        print("no plot: matplotlib missing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
