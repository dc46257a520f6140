"""ncu target for issue 24 (ragged_source.sh): bench/mods.py's document and ragged rows (16k, 16 heads, bf16
d128, 8 documents, causal, from_mask_mod in 128 x 128 blocks), one forward and one backward each inside
the profiler's range, after a warm-up call of each outside it. Launch order in the range: document fwd,
document bwd, ragged fwd, ragged bwd. PYTHONPATH=$PWD python ragged_source.py"""
import sys
from pathlib import Path

import cupy
import numpy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import mods  # noqa: E402  (bench/mods.py: the rows, their documents and calls)

rows = {row.key: row for row in mods.build_rows(False, ("document", "ragged"))}
rng = numpy.random.default_rng(0)
shape = (1, mods.SEQLEN, mods.HEADS, mods.HEADDIM)
q, k, v, dout = (cupy.asarray(rng.standard_normal(shape, numpy.float32).astype(mods.harness.dtype("bf16")))
                 for _ in range(4))
calls = {key: mods.cupyflash_calls(row, None)["ours"] for key, row in rows.items()}
for key, (forward, backward) in calls.items():  # warm-up: compiles, builds the plans
    out, lse = forward(q, k, v, lse=True)
    backward(dout, q, k, v, out, lse)
cupy.cuda.Device().synchronize()
cupy.cuda.profiler.start()
for key, (forward, backward) in calls.items():
    out, lse = forward(q, k, v, lse=True)
    backward(dout, q, k, v, out, lse)
cupy.cuda.Device().synchronize()
cupy.cuda.profiler.stop()
print("profiled: document fwd, document bwd, ragged fwd, ragged bwd")
