"""Session 55: why the ragged row's forward costs ~55 us more per call alone than back to back (the
document row ~10 us). For each document row, forward and backward: the host's enqueue time of a call
(no synchronize), the call alone (synchronize, call, synchronize; host clock), its device time alone
(events around it), and back to back (events around 20 calls), medians of 30, us."""
import statistics
import sys
import time

import cupy

sys.path.insert(0, "bench")
import harness  # noqa: E402
import mods  # noqa: E402


def med(xs):
    return statistics.median(xs) * 1e6


def probe(call, n=30):
    for _ in range(3):
        call()
    cupy.cuda.Device().synchronize()
    enq, alone, dev = [], [], []
    for _ in range(n):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        call()
        enq.append(time.perf_counter() - t)
        cupy.cuda.Device().synchronize()
    for _ in range(n):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        call()
        cupy.cuda.Device().synchronize()
        alone.append(time.perf_counter() - t)
    for _ in range(n):
        cupy.cuda.Device().synchronize()
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        call()
        b.record()
        b.synchronize()
        dev.append(cupy.cuda.get_elapsed_time(a, b) * 1e-3)
    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    a.record()
    for _ in range(20):
        call()
    b.record()
    b.synchronize()
    return med(enq), med(alone), med(dev), cupy.cuda.get_elapsed_time(a, b) * 1e3 / 20


print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
print(f"{'row':9} {'dir':4} {'enqueue':>8} {'alone':>8} {'device':>8} {'b2b':>8}")
for number, row in enumerate(mods.build_rows(False, ["document", "ragged"])):
    shape = (1, row.seqlen, mods.HEADS, mods.HEADDIM)
    q, k, v, dout = harness.make_inputs(shape, harness.dtype(mods.DTYPE), mods.SEED + number)
    forward, backward = mods.cupyflash_calls(row, None)["ours"]
    out, lse = forward(q, k, v, lse=True)
    for d, call in (("fwd", lambda: forward(q, k, v)), ("bwd", lambda: backward(dout, q, k, v, out, lse))):
        r = probe(call)
        print(f"{row.key:9} {d:4} " + " ".join(f"{x:8.1f}" for x in r), flush=True)
