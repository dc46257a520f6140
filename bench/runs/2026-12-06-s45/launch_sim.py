"""Issue 24: the Hopper backward's launch under bench/mods.py's document mask (16k, 8 documents, causal, 16
heads, 128-key CTAs of 64-row query tiles, 132 SMs, one CTA an SM), as greedy list scheduling: a CTA's time
is its walk (query tiles) plus a fixed overhead; printed is the grid's end over the even split of the work,
for tiles fastest, longest first (all pairs, per group of pairs, the implemented tail order) and dense
causal. python3 launch_sim.py"""
import heapq

import numpy as np

S, H, SM, BN, BM = 16384, 16, 132, 128, 64
KT = S // BN
rng = np.random.default_rng(0)  # bench/mods.py's documents (SEED 0)
cuts = np.sort(rng.choice(np.arange(1, 32), 7, replace=False)) * S // 32
bounds = np.concatenate([[0], cuts, [S]])
doc_end = np.empty(S, int)
for a, b in zip(bounds[:-1], bounds[1:]):
    doc_end[a:b] = b


def walk_doc(k):
    """Query tiles that key tile k visits: causal within each of its keys' documents."""
    tiles = set()
    for key in range(k * BN, (k + 1) * BN):
        tiles.update(range(key // BM, (doc_end[key] - 1) // BM + 1))
    return len(tiles)


def walk_causal(k):
    return (S - k * BN) // BM


def simulate(walks, order, overhead=1.0):
    """The grid's end over the even split of its work."""
    sms = [0.0] * SM
    for _, k in order:
        t = heapq.heappop(sms)
        heapq.heappush(sms, t + walks[k] + overhead)
    total = sum(walks[k] + overhead for _, k in order)
    return max(sms) / (total / SM)


def grouped(walks, group):
    """Every pair's tiles longest first, groups of `group` pairs taking them in turn."""
    ranks = sorted(range(KT), key=lambda k: -walks[k])
    return [(p, r) for p0 in range(0, H, group) for r in ranks for p in range(p0, min(H, p0 + group))]


print("document lengths", np.diff(bounds))
tiles_fastest = [(h, k) for h in range(H) for k in range(KT)]
for name, walk in (("document", walk_doc), ("dense causal", walk_causal)):
    walks = [walk(k) for k in range(KT)]
    print(f"{name}: mean walk {np.mean(walks):.2f}, longest {max(walks)}, tiles fastest "
          f"{simulate(walks, tiles_fastest):.3f} (overhead 3: {simulate(walks, tiles_fastest, 3.0):.3f})")
walks = [walk_doc(k) for k in range(KT)]
for group in (1, 2, 3, 4, 8, 16):
    order = grouped(walks, group)
    print(f"document, longest first in groups of {group}: {simulate(walks, order):.3f} "
          f"(overhead 3: {simulate(walks, order, 3.0):.3f})")
# The implemented order (bwd_key_order + schedule_tile_tail): every pair's tiles longest first, the last
# cdiv(2 x 132, 128) = 3 pairs' tiles in turn.
ranks = sorted(range(KT), key=lambda k: -walks[k])
tail = -(-2 * SM // KT)
order = [(h, r) for h in range(H - tail) for r in ranks] + [(p, r) for r in ranks for p in range(H - tail, H)]
print(f"document, implemented (tail {tail}): {simulate(walks, order):.3f}, overhead 3: {simulate(walks, order, 3.0):.3f}")
