"""Issue 24: the Hopper backward's launch under bench/mods.py's document mask (16k, 8 documents, causal, 16
heads, 128-key CTAs of 64-row query tiles, 132 SMs, one CTA an SM), as greedy list scheduling: a CTA's time
is its walk (query tiles) plus a fixed overhead; printed is the grid's end over the even split of the work,
for tiles fastest, longest first (all pairs or per group) and dense causal. python3 launch_sim.py"""
import heapq, numpy as np
S, H, SM, BN, BM = 16384, 16, 132, 128, 64
rng = np.random.default_rng(0)
cuts = np.sort(rng.choice(np.arange(1, 32), 7, replace=False)) * S // 32
bounds = np.concatenate([[0], cuts, [S]])
print("doc lengths", np.diff(bounds))
doc_end = np.empty(S, int)
for a, b in zip(bounds[:-1], bounds[1:]): doc_end[a:b] = b
def walk_doc(k):  # query tiles (BM rows) with some visible pair for key tile k (causal within doc)
    k0 = k * BN
    # visible queries: from k0 (diagonal) to end of the doc of each key in the tile; keys span maybe 2 docs
    qs = set()
    for key in range(k0, k0 + BN, 1):
        qs.update(range(key // BM, (doc_end[key] - 1) // BM + 1))
    return len(qs)
def walk_causal(k):
    return (S - k * BN) // BM
KT = S // BN
def simulate(walks, order, overhead=1.0):
    sms = [0.0] * SM; heapq.heapify(sms)
    for (h, k) in order:
        t = heapq.heappop(sms); heapq.heappush(sms, t + walks[k] + overhead)
    total = sum(walks[k] + overhead for (h, k) in order)
    return max(sms) / (total / SM)
for name, wf in (("doc", walk_doc), ("causal", walk_causal)):
    walks = [wf(k) for k in range(KT)]
    tiles_fastest = [(h, k) for h in range(H) for k in range(KT)]
    longest = sorted(tiles_fastest, key=lambda x: -walks[x[1]])
    group = max(1, SM // KT)
    print(name, "avg walk", np.mean(walks), "max", max(walks),
          "tiles fastest makespan/ideal %.3f" % simulate(walks, tiles_fastest),
          "longest-first %.3f" % simulate(walks, longest),
          "per-4-heads longest first %.3f" % simulate(walks, [x for g in range(0, H, 4) for x in sorted([y for y in tiles_fastest if g <= y[0] < g + 4], key=lambda x: -walks[x[1]])]))
walks = [walk_doc(k) for k in range(KT)]
for g in (1, 2, 4, 8, 16):
    order = []
    for p0 in range(0, H, g):
        ranks = sorted(range(KT), key=lambda k: -walks[k])
        for r in ranks:
            for p in range(p0, min(H, p0 + g)):
                order.append((p, r))
    print("group", g, "sorted per pair, rank-major: %.3f" % simulate(walks, order), "overhead 3: %.3f" % simulate(walks, order, 3.0),
          "tiles fastest ov3 %.3f" % simulate(walks, [(h, k) for h in range(H) for k in range(KT)], 3.0))
# The implemented order (bwd_key_order + schedule_tile_tail): every pair's tiles longest first, the last
# cdiv(2 x 132, 128) = 3 pairs' tiles in turn.
ranks = sorted(range(KT), key=lambda k: -walks[k])
tail = -(-2 * SM // KT)
order = [(h, ranks[i]) for h in range(H - tail) for i in range(KT)] + [(p, ranks[i]) for i in range(KT) for p in range(H - tail, H)]
print(f"implemented (tail {tail}): {simulate(walks, order):.3f}, overhead 3: {simulate(walks, order, 3.0):.3f}")
