"""Session 54: why bench/mods.py's ragged backward, back to back, takes ~21% longer than the sum of its
kernels by ncu (H100, s53: 1.47 ms against 1.21), and the document row's only ~9%. For each row and
direction: the median of 20 calls back to back (CUDA events around each), the host's time to enqueue one
call (no synchronize), and one call alone after a synchronize. PYTHONPATH=$PWD python b2b_probe.py"""
import statistics
import sys
import time
from pathlib import Path

import cupy
import numpy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import mods  # noqa: E402

rows = {row.key: row for row in mods.build_rows(False, ("document", "ragged"))}
rng = numpy.random.default_rng(0)
shape = (1, mods.SEQLEN, mods.HEADS, mods.HEADDIM)
q, k, v, dout = (cupy.asarray(rng.standard_normal(shape, numpy.float32).astype(mods.harness.dtype("bf16")))
                 for _ in range(4))
print("row       dir  b2b ms  host enqueue ms  alone ms  (medians of 20)")
for key, row in rows.items():
    forward, backward = mods.cupyflash_calls(row, None)["ours"]
    out, lse = forward(q, k, v, lse=True)
    calls = {"fwd": lambda: forward(q, k, v), "bwd": lambda: backward(dout, q, k, v, out, lse)}
    for direction, call in calls.items():
        for _ in range(3):
            call()
        cupy.cuda.Device().synchronize()
        ev = [cupy.cuda.Event() for _ in range(21)]
        host = []
        ev[0].record()
        for i in range(20):
            t = time.perf_counter()
            call()
            host.append(time.perf_counter() - t)
            ev[i + 1].record()
        ev[-1].synchronize()
        b2b = [cupy.cuda.get_elapsed_time(ev[i], ev[i + 1]) for i in range(20)]
        alone = []
        for _ in range(20):
            cupy.cuda.Device().synchronize()
            t = time.perf_counter()
            call()
            cupy.cuda.Device().synchronize()
            alone.append(time.perf_counter() - t)
        print(f"{key:9} {direction}  {statistics.median(b2b):6.3f}  {1e3 * statistics.median(host):15.3f}  "
              f"{1e3 * statistics.median(alone):8.3f}")
