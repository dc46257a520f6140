"""Ring attention across the GPUs of one machine: the launcher of issue 12 (one process per GPU, the NCCL
unique id made by the parent and handed to the children), a check against single-GPU attention, and the
scaling benchmark.

Run from the repository root on a machine with N GPUs (CuPy's NCCL comes from the nvidia-nccl wheel)::

    python bench/ring.py --gpus 2 --check      # ring == single-GPU flash_attention, causal and not
    python bench/ring.py --gpus 2              # scaling: 128k tokens, forward + backward, bf16, d128

Across machines the same ``worker`` runs under mpirun or Slurm: every process takes its rank and the
world size from the launcher's environment (OMPI_COMM_WORLD_RANK / SLURM_PROCID and their sizes), rank 0
makes ``cupy.cuda.nccl.get_unique_id()`` and shares it (an MPI broadcast, or a file on a shared disk),
and each process builds ``NcclCommunicator(world, unique_id, rank)`` on its local GPU; nothing else
changes, since NCCL carries the bytes between nodes.

Scaling measure: TFLOP/s of the whole problem (forward 4 * batch * heads * seqlen^2 * headdim, halved
when causal; backward 2.5x) on the ring against twice the single-GPU rate of the same problem on one GPU
(the target: at least 0.9x).
"""

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

import numpy

REPO_ROOT = Path(__file__).resolve().parent.parent


def _setup(rank):
    sys.path.insert(0, str(REPO_ROOT))
    import cupy

    cupy.cuda.Device(rank).use()
    return cupy


def _inputs(cupy, seqlen, heads, headdim, dtype, seed):
    rng = numpy.random.default_rng(seed)
    shape = (1, seqlen, heads, headdim)
    return [cupy.asarray(rng.standard_normal(shape, dtype=numpy.float32)).astype(dtype) for _ in range(4)]


def worker(rank, world, unique_id, args, results):
    """One rank: its shards of the same random problem on every rank, the ring forward and backward,
    and (rank 0) the single-GPU reference or timing. Puts (rank, payload) on ``results``."""
    cupy = _setup(rank)
    import ml_dtypes
    from cupy.cuda import nccl

    import cupyflash

    dtype = numpy.dtype(ml_dtypes.bfloat16)
    comm = nccl.NcclCommunicator(world, unique_id, rank)
    payload = {}
    q, k, v, dout = _inputs(cupy, args.seqlen, args.heads, args.headdim, dtype, seed=0)
    shard = [cupyflash.zigzag_shard(x, world, rank) for x in (q, k, v, dout)]

    def timed(fn):
        for _ in range(2):
            fn()
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(args.repeats):
            fn()
        cupy.cuda.Device().synchronize()
        return (time.perf_counter() - start) / args.repeats

    # Every rank runs the ring calls in the same order; rank 0's single-GPU runs come after all of them,
    # so no rank waits in NCCL for them.
    for causal in (False, True):
        options = dict(causal=causal, layout="zigzag" if causal else None)
        if args.check:
            out, lse = cupyflash.ring_flash_attention(*shard[:3], comm, return_lse=True, **options)
            grads = cupyflash.ring_flash_attention_backward(shard[3], *shard[:3], out, lse, comm, **options)
            payload[causal] = [x.get() for x in (out, lse, *grads)]
        else:
            def ring_step():
                out, vjp = cupyflash.ring_flash_attention_vjp(*shard[:3], comm, **options)
                return out, vjp(shard[3])

            payload[causal] = timed(ring_step)
    for causal in (False, True) if rank == 0 else ():
        def single():
            out, lse = cupyflash.flash_attention(q, k, v, causal=causal, return_lse=True)
            return out, lse, cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal)

        if args.check:
            out, lse, grads = single()
            payload[("single", causal)] = [x.get() for x in (out, lse, *grads)]
        else:
            payload[("single", causal)] = timed(single)
    results.put((rank, payload))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=131072, help="tokens of the whole sequence")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="compare with single-GPU attention (4096 tokens)")
    parser.add_argument("--json", type=Path, help="write the errors (--check) or rates here")
    args = parser.parse_args()
    if args.check:
        args.seqlen = 4096
    from cupy.cuda import nccl

    unique_id = nccl.get_unique_id()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=worker, args=(r, args.gpus, unique_id, args, results))
                 for r in range(args.gpus)]
    for p in processes:
        p.start()
    payloads = dict(results.get() for _ in processes)
    for p in processes:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a rank failed with exit code {p.exitcode}")
    sys.path.insert(0, str(REPO_ROOT))
    import cupyflash

    report = {}
    for causal in (False, True):
        name = "causal (zigzag)" if causal else "non-causal"
        if args.check:
            shards = [payloads[r][causal] for r in range(args.gpus)]
            single = payloads[0][("single", causal)]
            for i, label in enumerate(("out", "lse", "dq", "dk", "dv")):
                axis = 2 if label == "lse" else 1
                ring = cupyflash.zigzag_unshard([s[i] for s in shards], axis=axis).astype(numpy.float64)
                want = single[i].astype(numpy.float64)
                error = float(numpy.abs(ring - want).max() / max(numpy.abs(want).max(), 1e-30))
                report[f"{'causal' if causal else 'full'}_{label}"] = error
                print(f"{name:16} {label:4} max |ring - single| / max |single| = {error:.2e}")
            continue
        flops = 3.5 * 4 * args.heads * args.seqlen**2 * args.headdim / (2 if causal else 1)
        ring_time = max(payloads[r][causal] for r in range(args.gpus))
        single_time = payloads[0][("single", causal)]
        ring_rate, single_rate = flops / ring_time / 1e12, flops / single_time / 1e12
        report[f"{'causal' if causal else 'full'}"] = {"ring_tflops": ring_rate, "single_tflops": single_rate,
                                                        "scaling": ring_rate / (args.gpus * single_rate)}
        print(f"{name:16} forward+backward: ring {ring_rate:.0f} TFLOP/s on {args.gpus} GPUs, one GPU "
              f"{single_rate:.0f}: {ring_rate / (args.gpus * single_rate):.2f}x of {args.gpus}x one GPU")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
