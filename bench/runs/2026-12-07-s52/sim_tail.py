"""Simulates the Hopper backward's launch orders on bench/mods.py's document and ragged rows (16k, 16 heads,
d128: key tiles of 128, query tiles of 64 in 128 x 128 blocks): each CTA costs FIXED + TILE per tile of its
walk, a partial tile r times a full one, and takes the first free SM of 132 in launch order. Session 52
(bench/NOTES.md). Run from the repository root: python bench/runs/2026-12-07-s52/sim_tail.py"""
import heapq
import sys

import numpy

sys.path.insert(0, "bench")
import mods  # noqa: E402

HEADS, SMS, FIXED, TILE = 16, 132, 7.5, 2.12  # session 47's CTA clocks (H100)


def walks(key):
    """Full and partial tiles of each key tile's walk (causal, the document mask's 128 x 128 blocks)."""
    row = next(r for r in mods.build_rows(False) if r.key == key)
    doc = row.documents()[0]
    n = len(doc)
    full, part = numpy.zeros(n // 128, int), numpy.zeros(n // 128, int)
    for kb in range(n // 128):
        keys = doc[kb * 128:(kb + 1) * 128]
        for qt in range(n // 64):
            if qt * 64 + 63 < kb * 128:
                continue  # causal: no query of the tile sees these keys
            block = doc[qt // 2 * 128:(qt // 2 + 1) * 128][:, None] == keys[None, :]
            if block.all():
                full[kb] += 1
            elif block.any():
                part[kb] += 1
    return full, part


def makespan(costs):
    sms = [0.0] * SMS
    for c in costs:
        heapq.heappush(sms, heapq.heappop(sms) + c)
    return max(sms)


def order(full, part, r, tail, front):
    """CTA costs in launch order: `front` ranks of every pair in turn, then each pair's other tiles fastest
    (longest walk first), the last `tail` pairs in turn."""
    cost = FIXED + TILE * (full + r * part)
    ranked = cost[numpy.argsort(-(full + part), kind="stable")]
    out = [ranked[i] for i in range(front) for _ in range(HEADS)]
    out += [ranked[i] for _ in range(HEADS - tail) for i in range(front, len(ranked))]
    out += [ranked[i] for i in range(front, len(ranked)) for _ in range(tail)]
    return out


for key in ("document", "ragged"):
    full, part = walks(key)
    print(f"{key}: {HEADS * (full + part).sum()} tiles, {HEADS * part.sum()} partial")
    for r in (1.0, 1.9, 2.3):
        lpt = makespan(sorted(numpy.repeat(FIXED + TILE * (full + r * part), HEADS), reverse=True))
        cols = {"today": (3, 0), "tail 6": (6, 0), "all in turn": (HEADS, 0), "front + tail 3": (3, 1)}
        spans = {name: makespan(order(full, part, r, *args)) for name, args in cols.items()}
        print(f"  r={r}: " + ", ".join(f"{name} {s:.0f}" for name, s in spans.items()) + f", LPT {lpt:.0f} us")
