"""Model of the split_keys pipeline of sm90_fwd_planes (kernels_cu/sm90/fwd_kernel.cuh +
fwd_planes_mainloop.cuh, patch i22): producer_queries, the loader (warp 1 lane 0), the two splitter
warps, two consumer warpgroups, TMA loads/stores as asynchronous events. mbarriers with phase counting
and parity waits as in PTX (try_wait.parity P succeeds iff the current phase's parity != P). Every wait
carries the phase index it means; a waiter that finds the barrier two or more phases past it is an
error (it would block, or read a later phase). Random interleavings, random modes and walk lengths."""
import random
import re
import sys

LOAD, PUB, LOCAL = 0, 1, 2


class Err(Exception):
    pass


class MBar:
    def __init__(self, name, count):
        self.name, self.count, self.pending, self.tx, self.phase = name, count, count, 0, 0

    def arrive(self, tx=0):
        self.pending -= 1
        self.tx += tx
        if self.pending < 0:
            raise Err(f"{self.name}: too many arrivals")
        self._check()

    def complete_tx(self, n):
        self.tx -= n
        self._check()

    def _check(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count


def wait(bar, parity, intended, who):
    def pred():
        if bar.phase > intended + 1:
            raise Err(f"{who} waits {bar.name} for phase {intended}, which is {bar.phase - intended - 1} "
                      f"phases behind the barrier (parity wait would block or read a later phase)")
        assert parity == intended & 1
        return (bar.phase & 1) != parity
    yield pred


class NamedBarrier:
    def __init__(self, n):
        self.n, self.count, self.gen = n, 0, 0

    def sync(self):
        g = self.gen
        self.count += 1
        if self.count == self.n:
            self.count, self.gen = 0, self.gen + 1
        yield lambda: self.gen > g


def run(seed, kStages, kStaged, kUnits=2, fix=False, splitting=True, work=None, delay_publish=True):
    rng = random.Random(seed)
    T = len(work)
    S = {}
    tile = [None, None]
    readers = (1 + 2 if splitting else 1) if fix else 0
    published = [MBar(f"published[{b}]", 1) for b in range(2)]
    tile_empty = [MBar(f"tile_empty[{b}]", 2 + readers) for b in range(2)]
    q_full, q_empty = MBar("q_full", 1), MBar("q_empty", 2)
    arrivals = 2 if splitting else 1
    full = {h: [MBar(f"{h}_full[{s}]", arrivals) for s in range(kStages)] for h in "kv"}
    empty = {h: [MBar(f"empty_{h}[{s}]", 2) for s in range(kStages)] for h in "kv"}
    entry = [None] * kStages
    stage = {h: [dict() for _ in range(kStages)] for h in "kv"}
    staged_full = [MBar(f"staged_full[{s}]", 1) for s in range(kStaged)]
    staged_empty = [MBar(f"staged_empty[{s}]", 2) for s in range(kStaged)]
    staged_mode = [None] * kStaged
    staged_data = [None] * kStaged
    split_bar = NamedBarrier(2)
    events = []  # pending async completions: callables
    parts = [(w, u) for w in (2, 3) for u in range(kUnits)]
    stats = {LOAD: 0, PUB: 0, LOCAL: 0}

    def check_stage(h, s, want, who):
        got = stage[h][s]
        if any(got.get(p) != want for p in parts):
            raise Err(f"{who}: stage {h}[{s}] holds {got}, wants {want}")

    def producer():
        for t in range(T + 1):
            if t >= 2:
                yield from wait(tile_empty[t % 2], (t // 2 - 1) & 1, t // 2 - 1, "producer")
            done = t == T
            tile[t % 2] = ("done", t) if done else (t, work[t])
            published[t % 2].arrive()
            if t > 0:
                yield from wait(q_empty, (t - 1) & 1, t - 1, "producer")
            q_full.arrive()
            if done:
                return
            yield None

    def consumer(c):
        i = 0
        for t in range(T + 1):
            yield from wait(q_full, t & 1, t, f"consumer{c}")
            tl = tile[t % 2]
            if tl[0] == "done":
                return
            if tl[0] != t:
                raise Err(f"consumer{c} reads tile {tl} for {t}")
            count = tl[1]
            if count == 0:
                q_empty.arrive()
            for j in range(count):
                s, par = i % kStages, (i // kStages) & 1
                yield from wait(full["k"][s], par, i // kStages, f"consumer{c}")
                if entry[s] != (t, j):
                    raise Err(f"consumer{c}: entry[{s}] = {entry[s]}, wants {(t, j)}")
                check_stage("k", s, (t, j), f"consumer{c}")
                yield None
                check_stage("k", s, (t, j), f"consumer{c}")
                empty["k"][s].arrive()
                if j == count - 1:
                    q_empty.arrive()
                yield from wait(full["v"][s], par, i // kStages, f"consumer{c}")
                check_stage("v", s, (t, j), f"consumer{c}")
                yield None
                check_stage("v", s, (t, j), f"consumer{c}")
                empty["v"][s].arrive()
                i += 1
            yield None  # the epilogue reads tile fields
            if tile[t % 2][0] != t:
                raise Err(f"consumer{c}: tile[{t % 2}] republished under its epilogue")
            tile_empty[t % 2].arrive()

    def tma(fn):
        events.append(fn)

    def loader():
        i = n = 0
        for t in range(T + 1):
            yield from wait(published[t % 2], (t // 2) & 1, t // 2, "loader")
            tl = tile[t % 2]
            if tl[0] == "done":
                return
            if tl[0] != t:
                raise Err(f"loader reads tile {tl} for {t}")
            count = tl[1]
            if fix:
                tile_empty[t % 2].arrive()
            for j in range(count):
                mode = rng.choice((LOAD, PUB, LOCAL)) if splitting else LOAD
                stats[mode] += 1
                if splitting:
                    slot = n % kStaged
                    if n >= kStaged:
                        yield from wait(staged_empty[slot], (n // kStaged - 1) & 1, n // kStaged - 1, "loader")
                    n += 1
                    staged_mode[slot] = mode
                if mode == LOAD:
                    if splitting:
                        staged_full[slot].arrive()
                    s = i % kStages
                    for h in "kv":
                        if i >= kStages:
                            yield from wait(empty[h][s], (i // kStages - 1) & 1, i // kStages - 1, "loader")
                        if h == "k":
                            entry[s] = (t, j)
                        full[h][s].arrive(tx=1)
                        if splitting:
                            full[h][s].arrive()

                        def land(h=h, s=s, val=(t, j)):
                            for p in parts:
                                stage[h][s][p] = val
                            full[h][s].complete_tx(1)
                        tma(land)
                        yield None
                else:
                    for u in range(2 * kUnits):
                        if u > 0:
                            slot = n % kStaged
                            if n >= kStaged:
                                yield from wait(staged_empty[slot], (n // kStaged - 1) & 1, n // kStaged - 1, "loader")
                            n += 1
                        staged_full[slot].arrive(tx=1)

                        def land(slot=slot, val=(t, j, u)):
                            staged_data[slot] = val
                            staged_full[slot].complete_tx(1)
                        tma(land)
                        yield None
                i += 1

    def splitter(w):
        i = n = 0
        for t in range(T + 1):
            yield from wait(published[t % 2], (t // 2) & 1, t // 2, f"splitter{w}")
            tl = tile[t % 2]
            if tl[0] == "done":
                return
            if tl[0] != t:
                raise Err(f"splitter{w} reads tile {tl} for {t}")
            count = tl[1]
            if fix:
                tile_empty[t % 2].arrive()
            for j in range(count):
                s = i % kStages
                slot = n % kStaged
                yield from wait(staged_full[slot], (n // kStaged) & 1, n // kStaged, f"splitter{w}")
                mode = staged_mode[slot]
                if mode == LOAD:
                    staged_empty[slot].arrive()
                    n += 1
                    i += 1
                    continue
                store_writes = []
                for hi, h in enumerate("kv"):
                    if i >= kStages:
                        yield from wait(empty[h][s], (i // kStages - 1) & 1, i // kStages - 1, f"splitter{w}")
                    if h == "k" and w == 2:
                        entry[s] = (t, j)
                    for u in range(kUnits):
                        slot = n % kStaged
                        if hi + u > 0:
                            yield from wait(staged_full[slot], (n // kStaged) & 1, n // kStaged, f"splitter{w}")
                        want = (t, j, hi * kUnits + u)
                        if staged_data[slot] != want:
                            raise Err(f"splitter{w}: staged slot {slot} holds {staged_data[slot]}, wants {want}")
                        stage[h][s][(w, u)] = (t, j)
                        yield None
                        if staged_data[slot] != want:
                            raise Err(f"splitter{w}: staged slot {slot} overwritten under the split")
                        staged_empty[slot].arrive()
                        n += 1
                    if mode == PUB:
                        yield from split_bar.sync()
                        if w == 2:
                            read = {"done": False}

                            def store_read(h=h, s=s, val=(t, j), read=read):
                                check_stage(h, s, val, "TMA store")
                                read["done"] = True
                                tma(lambda: store_writes.append(1))
                            tma(store_read)
                            yield lambda read=read: read["done"]  # bulk_wait_read
                    full[h][s].arrive()
                if mode == PUB and w == 2:
                    yield lambda: len(store_writes) == 2  # bulk_wait
                    if delay_publish:
                        for _ in range(rng.randrange(1, 30)):
                            yield None  # the writes' round trip
                i += 1

    actors = {"producer": producer(), "c0": consumer(0), "c1": consumer(1), "loader": loader()}
    if splitting:
        actors.update({"s2": splitter(2), "s3": splitter(3)})
    blocked = {name: None for name in actors}
    steps = 0
    while actors:
        steps += 1
        ready = []
        for name, pred in blocked.items():
            if pred is None or pred():
                ready.append(name)
        if events and (not ready or rng.random() < 0.3):
            events.pop(rng.randrange(len(events)))()
            continue
        if not ready:
            raise Err("deadlock: " + ", ".join(f"{k}" for k in blocked))
        name = rng.choice(ready)
        try:
            blocked[name] = next(actors[name])
        except StopIteration:
            del actors[name], blocked[name]
    if events:
        for e in events:
            e()
    return stats


def trials(label, count, work_fn=None, **kw):
    errors = {}
    for seed in range(count):
        rng = random.Random(10_000 + seed)
        w = [rng.choice((0, 1, 1, 2, 3, 5)) for _ in range(rng.randrange(1, 7))] if work_fn is None else work_fn(rng)
        try:
            run(seed, work=w, **kw)
        except Err as e:
            key = re.sub(r"\d+", "#", str(e))[:70]
            errors.setdefault(key, (seed, w, str(e)))
    print(f"{label}: {count} trials, {len(errors)} kinds of failure")
    for k, (seed, w, e) in list(errors.items())[:8]:
        print(f"   seed {seed} walks {w}: {e}")
    return errors


if __name__ == "__main__":
    N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    nonzero = lambda rng: [rng.choice((1, 2, 3, 5)) for _ in range(rng.randrange(1, 7))]  # noqa: E731
    for kStages, kStaged in ((2, 4), (1, 2)):
        print(f"--- kStages={kStages}, kStaged={kStaged}")
        trials("patch, walks of >= 1 key tile", N, kStages=kStages, kStaged=kStaged, work_fn=nonzero)
        trials("patch, walks with empty ones", N, kStages=kStages, kStaged=kStaged)
        trials("base (no split_keys), walks with empty ones", N, kStages=kStages, kStaged=kStaged, splitting=False)
        trials("patch + readers on tile_empty", N, kStages=kStages, kStaged=kStaged, fix=True)
