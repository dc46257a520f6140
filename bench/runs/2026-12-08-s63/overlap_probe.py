"""Issue 22, session 63 (session 62's probe, never run, its file removed: this replaces it), with the unrolled passes of
runs/2026-12-08-s63/pending/i22_planes_overlap_v2.patch, the tree this runs on): where the time of the
float32 graph by parts goes. The d128 causal 1k row (b16 h16), calls back to back:
  off      one launch of each kernel (main's path);
  p3s16    three parts, later parts' passes on 16 SMs beside the previous part's forward (the patch);
  p3s16e   the same graph with the later parts' passes cut to one key row (their launches and waits stay;
           the forwards read stale planes, which leaves their time as it is);
  p3s0e    that, with the forwards on every SM (the floor of passes hidden at no cost);
  p3s16f   the p3s16 graph with the forwards cut to one query row and one key tile a head (the passes,
           nearly alone).
  p3s16u   p3s16 with the later passes' threads taking 3 chunks at a time (the v2 patch's default);
  p3s16uf  that with the forwards cut (the unrolled passes nearly alone);
  p3s24    p3s16 on 24 SMs (one chunk a thread).
The first five keep one chunk a thread (PLANES_OVERLAP_UNROLL = 1, session 61's passes). If p3s16 ~
p3s16e, the passes are hidden and the 16 SMs cost what they save; if p3s16 > p3s16e, they are late, and
p3s16u or p3s24 say whether more bytes in flight or more SMs bring them in time.
PYTHONPATH=<tree> python overlap_probe.py [--rounds 3] [--precompile]"""
import dataclasses
import os
import sys

import cupy
import numpy as np

import cupyflash
from cupyflash import _api, _plan
from cupyflash._families import sm80, sm90

sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import harness  # noqa: E402

if "--precompile" in sys.argv:
    from cupyflash import _kernels
    _kernels.precompile([v for v in sm90.FWD_PLANES.variants() if not any(v.flags)]
                        + [v for v in sm80.PLANES.variants() if not v.param("tf32")], max_workers=4)
    sys.exit()
argv = sys.argv[1:]
rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 3
d, causal, s, batch, heads = 128, True, 1024, 16, 16
rng = np.random.default_rng(5)
q, k, v = (cupy.asarray(rng.standard_normal((batch, s, heads, d), dtype=np.float32)) for _ in range(3))
flops = harness.forward_flops(batch, heads, s, s, d, causal)
split = sm80.split_planes


def one_row(slot):
    return _plan.Slot(slot.index, (slot.shape[0], 1, *slot.shape[2:]), slot.dtype, slot.strides, slot.aligned16)


def empty_later(b, p, x, planes, heads_k, tf32, ctas=None, path=_plan.BOTH, after=None, unroll=1):
    if ctas is not None:  # a later part's pass (k's or v's)
        x, planes = one_row(x), one_row(planes)
    return split(b, p, x, planes, heads_k, tf32, ctas, path, after, unroll)


launch = sm90.Sm90Forward._launch_planes


def cut_forward(self, b, variant, p, q, k, v, out, lse, device, sms, path, after):
    if path == _plan.GRAPH:
        # One query row over one key tile (masking is bottom-right aligned: one row over 1024 keys would
        # still walk every key tile); the k and v maps keep their 1024 rows, so reads stay in bounds.
        p = dataclasses.replace(p, seqlen_q=1, seqlen_k=variant.param("block_n"))
        q, out = one_row(q), one_row(out)
    return launch(self, b, variant, p, q, k, v, out, lse, device, sms, path, after)


CONFIGS = {"off": (1, 16, split, 1), "p3s16": (3, 16, split, 1), "p3s16e": (3, 16, empty_later, 1),
           "p3s0e": (3, 0, empty_later, 1), "p3s16f": (3, 16, split, 1), "p3s16u": (3, 16, split, 3),
           "p3s16uf": (3, 16, split, 3), "p3s24": (3, 24, split, 1)}
results = {}
ref = None
for r in range(rounds):
    names = list(CONFIGS)
    for name in names[r % len(names):] + names[:r % len(names)]:
        (sm90.PLANES_OVERLAP_PARTS, sm90.PLANES_OVERLAP_SMS, sm80.split_planes,
         sm90.PLANES_OVERLAP_UNROLL) = CONFIGS[name]
        sm90.Sm90Forward._launch_planes = cut_forward if name.endswith("f") else launch
        _api.PLANS.clear()

        def call():
            return cupyflash.flash_attention(q, k, v, causal=causal)

        out = call()  # (the first run: the direct launches, whole batch)
        if ref is None:
            ref = out
        graph_out = call()  # (the second: the graph)
        if name in ("off", "p3s16", "p3s16u", "p3s24") and not bool(cupy.array_equal(graph_out, ref)):
            print(f"{name}: BITS DIFFER", flush=True)
        b2b = harness.median(harness.time_back_to_back(call, 5, 20, harness.cupy_clock()))  # ms
        (plan,) = _api.PLANS._plans.values()
        if name != "off" and not plan._graph.programmatic:
            print(f"{name}: the driver refused the launch-order edges (the plain chain ran)", flush=True)
        results.setdefault(name, []).append((b2b * 1e3, flops / b2b / 1e9, len(plan._graph_launches)))
sm80.split_planes, sm90.Sm90Forward._launch_planes = split, launch
for name in CONFIGS:
    got = results[name]
    print(f"{name}: us " + ", ".join(f"{x[0]:.0f}" for x in got) + " | TFLOP/s " + ", ".join(f"{x[1]:.1f}" for x in got)
          + f" | graph launches {got[0][2]}", flush=True)

