"""Issue 22, session 61: the float32 forward's graph by parts of the batch (sm90.planes_overlap_parts: each
part's k and v planes passes beside the previous part's forward) against one launch of each kernel
(PLANES_OVERLAP_PARTS = 1), and the parts and SMs around the defaults; bench.py's float32 rows. TFLOP/s,
calls back to back (events) and each call alone (host clock), rounds in rotated order.
PYTHONPATH=<tree> python overlap_ab.py [--precompile] [--rounds 2] [--configs off,p3s16,...]"""
import os
import sys

import cupy
import numpy as np

import cupyflash
from cupyflash import _api
from cupyflash._families import sm90

if "--precompile" in sys.argv:
    from cupyflash import _kernels
    from cupyflash._families import sm80
    _kernels.precompile([v for v in sm90.FWD_PLANES.variants() if not any(v.flags)]
                        + [sm80.PLANES.variant("float32")], max_workers=4)
    sys.exit()
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import harness  # noqa: E402

ROWS = [  # (head dim, causal, seqlen, batch, heads): bench.py's grid (batch x seqlen 16k, heads x dim 2048)
    (128, True, 1024, 16, 16), (64, True, 1024, 16, 32), (128, False, 1024, 16, 16), (64, False, 1024, 16, 32),
    (128, True, 4096, 4, 16),
]
CONFIGS = {"off": (1, 16), "p2s16": (2, 16), "p3s16": (3, 16), "p4s16": (4, 16), "p3s12": (3, 12), "p3s20": (3, 20),
           "p4s20": (4, 20)}
argv = sys.argv[1:]
rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 2
names = argv[argv.index("--configs") + 1].split(",") if "--configs" in argv else list(CONFIGS)
rng = np.random.default_rng(5)
results = {}
for d, causal, s, batch, heads in ROWS:
    q, k, v = (cupy.asarray(rng.standard_normal((batch, s, heads, d), dtype=np.float32)) for _ in range(3))
    flops = harness.forward_flops(batch, heads, s, s, d, causal)
    ref = None
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sm90.PLANES_OVERLAP_PARTS, sm90.PLANES_OVERLAP_SMS = CONFIGS[name]
            _api.PLANS.clear()

            def call():
                return cupyflash.flash_attention(q, k, v, causal=causal)

            out = call()
            if ref is None:
                ref = out
            same = bool(cupy.array_equal(call(), ref))  # (the second run: the graph)
            b2b = harness.median(harness.time_back_to_back(call, 5, 20, harness.cupy_clock()))
            alone = harness.median(harness.time_per_call(call, 3, 15))
            (plan,) = _api.PLANS._plans.values()
            results.setdefault((d, causal, s, name), []).append(
                (flops / b2b / 1e9, flops / alone / 1e9, same, len(plan._graph_launches)))
    for name in names:
        got = results[(d, causal, s, name)]
        print(f"d{d} {'causal' if causal else 'full'} {s} {name}: back to back "
              + ", ".join(f"{x[0]:.1f}" for x in got) + " | alone " + ", ".join(f"{x[1]:.1f}" for x in got)
              + f" | graph launches {got[0][3]}" + ("" if all(x[2] for x in got) else " | BITS DIFFER"), flush=True)
