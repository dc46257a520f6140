"""Ring attention: a sequence sharded over the ranks of a ring, each rank attending its queries to every
rank's keys and values as the K/V blocks travel around the ring, partial results merged by their
log-sum-exp (cupyflash.merge_attention_states); the backward sends each block's dK/dV accumulators
around with it. The per-rank code is the same for an NCCL communicator (GPUs, NCCL carries the bytes on
a stream of its own, overlapped with the attention of the block in hand) and for a VirtualRing (ranks
as threads of one process, NumPy or CuPy arrays), which the CPU tests use.

Memory per rank: its shard, two K/V blocks (the one in hand and the one arriving) and, in the backward,
float32 (float64 for float64 inputs) accumulators of shard size: dQ, and two sets of dK and dV (the one
in hand and the one arriving).
"""

import dataclasses
import functools
import numbers
import queue
import threading
import time

import numpy

from . import _compute, _merge, _problem

#: Shard layouts of a causal ring. "zigzag": rank r holds chunks r and 2 * world - 1 - r of the sequence
#: cut into 2 * world chunks (zigzag_shard), so every rank does the same work; "contiguous": rank r holds
#: chunk r of world chunks (the last rank does the most).
LAYOUTS = ("zigzag", "contiguous")


def _axis(axis, name, x):
    """``axis`` of array ``x`` (argument ``name``) as a non-negative index; negative axes count from the end."""
    if not _problem.is_int(axis):
        raise TypeError(f"axis must be an int, got {type(axis).__name__} {axis!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for {name}, a {x.ndim}-dimensional array of shape {x.shape}; "
                         f"expected -{x.ndim} <= axis < {x.ndim}")
    return int(axis) % x.ndim


def zigzag_shard(x, world, rank, axis=1):
    """Rank ``rank``'s shard of the full sequence ``x`` in the zigzag layout.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        The full sequence: q, k, v, out or dout (batch, seqlen, heads, headdim), or lse (batch, heads,
        seqlen).
    world, rank : int
        The ranks of the ring and this one, ``0 <= rank < world``.
    axis : int
        The sequence axis: 1 for q, k, v, out and dout, 2 (or -1) for lse. Its length must be a
        multiple of ``2 * world``.

    Returns
    -------
    array of x's kind and dtype
        Chunks ``rank`` and ``2 * world - 1 - rank`` of ``2 * world`` equal chunks along ``axis``,
        concatenated: every rank of a causal ring gets the same work.
    """
    xp = _problem.array_module({"x": x})
    for name, value in (("world", world), ("rank", rank)):
        if not _problem.is_int(value):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank {rank!r}, world {world!r}")
    axis = _axis(axis, "x", x)
    length = x.shape[axis]
    if length % (2 * world):
        raise ValueError(f"the sequence axis ({length}) must be a multiple of 2 * world = {2 * world}")
    chunk = length // (2 * world)

    def take(i):
        index = [slice(None)] * x.ndim
        index[axis] = slice(i * chunk, (i + 1) * chunk)
        return x[tuple(index)]

    return xp.concatenate([take(rank), take(2 * world - 1 - rank)], axis=axis)


def zigzag_unshard(shards, axis=1):
    """The full sequence from every rank's zigzag shard, the inverse of :func:`zigzag_shard`.

    Parameters
    ----------
    shards : sequence of arrays, all NumPy or all CuPy
        ``shards[r]`` from rank r (``world = len(shards)`` of them), each of one shape and an even length
        along ``axis``: the two chunks of :func:`zigzag_shard`.
    axis : int
        The sequence axis, as given to :func:`zigzag_shard`: 1 for q, k, v, out, dout and the
        gradients, 2 (or -1) for lse.

    Returns
    -------
    array of the shards' kind and dtype
        The ``2 * world`` chunks in sequence order, concatenated along ``axis``.
    """
    world = len(shards)
    if world < 1:
        raise ValueError("need at least one shard")
    xp = _problem.array_module({f"shards[{r}]": s for r, s in enumerate(shards)})
    for r, shard in enumerate(shards):
        if shard.shape != shards[0].shape:
            raise ValueError(f"every rank's shard must have one shape; shards[{r}] has shape {shard.shape}, shards[0] "
                             f"{shards[0].shape}")
    axis = _axis(axis, "shards[0]", shards[0])
    rows = shards[0].shape[axis]
    if rows % 2:
        raise ValueError(f"a zigzag shard holds two equal chunks, so its length along axis {axis} must be even; the "
                         f"shards have shape {shards[0].shape}")
    chunks = [None] * (2 * world)
    for r, shard in enumerate(shards):
        half = rows // 2
        index = [slice(None)] * shard.ndim
        index[axis] = slice(0, half)
        chunks[r] = shard[tuple(index)]
        index[axis] = slice(half, None)
        chunks[2 * world - 1 - r] = shard[tuple(index)]
    return xp.concatenate(chunks, axis=axis)


# ------------------------------------------------------------------------------------------------
# Rings: how a rank exchanges blocks with its neighbours.

class _Pending:
    """An exchange in flight; wait() makes its received arrays safe to use."""

    def __init__(self, wait):
        self._wait = wait

    def wait(self):
        self._wait()


#: Seconds a VirtualRing rank waits for one block from its neighbour before it raises TimeoutError
#: (VirtualRing.create, VirtualRing.run). Generous, because a NumPy step of a big problem can take minutes.
DEFAULT_TIMEOUT = 300.0
#: Seconds between a waiting rank's looks at whether its ring failed or its sender returned.
_POLL = 0.05
#: What the exchanges of a ring call carry, by tag, for a VirtualRing's errors: the n-th exchange of a
#: call under a tag brings what ring step n works on (step 0 is a rank's own block).
_CARRIED = {"kv": "the K/V block of step {n}", "dkv": "the dK/dV accumulators of step {n}",
            "kv back": "the K/V block of backward step {n}", "dkv back": "the dK/dV accumulators of backward step {n}",
            "dkv home": "the finished dK/dV sums of its own block", "dsinks": "the dsinks share of hop {n}"}


class _PeerFailed(RuntimeError):
    """A rank of a virtual ring stopped waiting because another rank raised (VirtualRing.run raises that
    rank's error instead)."""


class _RingState:
    """What the ranks of one virtual ring share."""

    def __init__(self, timeout):
        self.timeout = timeout
        self.lock = threading.Lock()
        self.failed = threading.Event()  # a rank raised: the others stop waiting
        self.returned = set()  # ranks whose function has returned (VirtualRing.run)
        self.calls = {}  # ring call number -> {rank: signature}, until every rank has made that call


def _timeout(value):
    if value is None:
        return None
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"timeout must be a positive number of seconds or None, got {type(value).__name__} {value!r}")
    if not value > 0:  # NaN too
        raise ValueError(f"timeout must be a positive number of seconds or None, got {value!r}")
    return float(value)


class VirtualRing:
    """One rank of a ring of ``world`` ranks in one process (threads), for NumPy or CuPy arrays: the
    same ring algorithm as an NCCL communicator runs, with the blocks handed over through queues.

    >>> results = VirtualRing.run(4, lambda ring: cupyflash.ring_flash_attention(q[ring.rank], ...,
    ...                                                                          ring))

    Every rank must make the same ring calls, in the same order, each rank from its own thread. A rank
    checks each call against the other ranks' same call (the function, the options and the shard
    shapes) and raises ValueError naming the ranks and the values that differ. A rank that waits for a
    block that cannot come raises instead of hanging: at once when :meth:`run` knows the sender has
    returned, else TimeoutError after ``timeout`` seconds without the block.
    """

    def __init__(self, rank, members, shared):
        """Use :meth:`create` or :meth:`run`."""
        self.rank = rank
        self._members = members
        self._shared = shared
        self._inbox = {}
        self._lock = threading.Lock()
        self._calls = 0  # ring calls this rank has begun
        self._call_name = None
        self._exchanges = {}  # tag -> exchanges of the current ring call

    @property
    def world(self):
        return len(self._members)

    @property
    def timeout(self):
        """Seconds a rank waits for one block before it raises TimeoutError; None: no limit."""
        return self._shared.timeout

    @classmethod
    def create(cls, world, timeout=DEFAULT_TIMEOUT):
        """The ``world`` ranks of a new virtual ring; run each in its own thread (or use :meth:`run`).

        Parameters
        ----------
        world : int
            Ranks, at least 1.
        timeout : float or None
            Seconds a rank waits for one block from its neighbour before it raises TimeoutError, naming
            itself, the ring call and what it waited for (default 300: a NumPy step of a big problem can
            take minutes). None waits without limit.

        Returns
        -------
        list of VirtualRing
            Rank r at index r.
        """
        if not _problem.is_int(world) or world < 1:
            raise ValueError(f"world must be a positive int, got {world!r}")
        shared = _RingState(_timeout(timeout))
        members = []
        members.extend(cls(r, members, shared) for r in range(world))
        return members

    @classmethod
    def run(cls, world, fn, timeout=DEFAULT_TIMEOUT):
        """``[fn(ring) for each rank]``, every rank in its own thread (the ranks wait on each other's
        blocks).

        Parameters
        ----------
        world : int
            Ranks, at least 1.
        fn : callable
            ``fn(ring)`` for each rank ``ring`` of a new ring (``ring.rank``, ``ring.world``).
        timeout : float or None
            As in :meth:`create`. A rank that waits for a block from a rank whose ``fn`` has returned
            raises RuntimeError at once.

        Returns
        -------
        list
            ``fn``'s results, rank r's at index r. An exception in any rank is raised instead, after
            every thread has stopped: the first rank's own error, not the other ranks' giving up.
        """
        members = cls.create(world, timeout)
        shared = members[0]._shared
        results, errors = [None] * world, []

        def body(ring):
            try:
                results[ring.rank] = fn(ring)
            except BaseException as exc:  # reported below; the ranks waiting on this one give up  # noqa: BLE001
                errors.append(exc)
                shared.failed.set()
            finally:
                with shared.lock:
                    shared.returned.add(ring.rank)

        threads = [threading.Thread(target=body, args=(m,)) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise next((e for e in errors if not isinstance(e, _PeerFailed)), errors[0])
        return results

    def _where(self):
        if self._call_name is None:
            return f"VirtualRing rank {self.rank} of {self.world}"
        return f"VirtualRing rank {self.rank} of {self.world} (its ring call {self._calls}, {self._call_name})"

    def _begin(self, name, signature):
        """Starts this rank's next ring call, ``name`` with ``signature`` (field -> value: options and
        shard shapes), and checks it against the same call of the ranks that have begun it already. Every
        rank compares before it sends anything, so no rank receives a block of a call that differs."""
        self._calls += 1
        self._call_name = name
        self._exchanges = {}
        shared = self._shared
        with shared.lock:
            posted = shared.calls.setdefault(self._calls, {})
            earlier = sorted(posted.items())
            posted[self.rank] = signature
            if len(posted) == self.world:
                del shared.calls[self._calls]
        if not earlier:
            return
        # The earlier ranks agree with each other (each compared on its turn): one of them stands for all.
        (a, first), (b, second) = sorted([earlier[0], (self.rank, signature)], key=lambda item: item[0])
        fields = list(first) + [f for f in second if f not in first]
        differences = [f"{f} {first.get(f, 'absent')!r} on rank {a}, {second.get(f, 'absent')!r} on rank {b}"
                       for f in fields if first.get(f, "absent") != second.get(f, "absent")]
        if differences:
            shared.failed.set()
            raise ValueError(f"the ranks of a VirtualRing make different ring calls (call {self._calls}): "
                             f"{'; '.join(differences)}. Every rank must make the same ring calls, in the same order, "
                             "with the same options and shard shapes")

    def _box(self, tag):
        with self._lock:
            return self._inbox.setdefault(tag, queue.Queue())

    def exchange(self, send, recv, tag, hops=1):
        """Sends copies of ``send`` to rank + ``hops`` and, on wait(), fills ``recv`` from rank - ``hops``."""
        source = (self.rank - hops) % self.world
        count = self._exchanges[tag] = self._exchanges.get(tag, 0) + 1
        what = _CARRIED.get(tag, "its {tag!r} message {n}").format(n=count, tag=tag)
        self._members[(self.rank + hops) % self.world]._box(tag).put([x.copy() for x in send])

        def wait():
            for dst, src in zip(recv, self._receive(tag, source, what)):
                dst[...] = src

        return _Pending(wait)

    def _receive(self, tag, source, what):
        """The next arrays from ``source`` under ``tag``; raises when they cannot come."""
        box, shared = self._box(tag), self._shared
        deadline = None if shared.timeout is None else time.monotonic() + shared.timeout
        while True:
            try:
                return box.get(timeout=_POLL)
            except queue.Empty:
                pass
            if shared.failed.is_set():
                raise _PeerFailed(f"{self._where()} stopped waiting: another rank of the virtual ring failed")
            if source in shared.returned:
                # The sender put everything it sent before it returned: one last look.
                try:
                    return box.get_nowait()
                except queue.Empty:
                    raise RuntimeError(
                        f"{self._where()} waits for {what} from rank {source}, which has returned without sending "
                        "it: every rank must make the same ring calls, in the same order") from None
            if deadline is not None and time.monotonic() >= deadline:
                shared.failed.set()
                raise TimeoutError(
                    f"{self._where()} waited {shared.timeout:g} s for {what} from rank {source}, which did not send "
                    "it: every rank must make the same ring calls, in the same order, each rank from its own thread "
                    "(VirtualRing.run(world, fn) runs them so). If a rank's steps take longer than that, raise the "
                    "limit: VirtualRing.create(world, timeout=...) or VirtualRing.run(world, fn, timeout=...); None "
                    "waits without limit")


class _NcclRing:
    """A rank of an NCCL communicator: blocks go to rank + hops and come from rank - hops on a stream of
    their own, ordered after the work the current stream has enqueued, and the current stream waits for them
    on wait(); the attention of the block in hand runs meanwhile."""

    def __init__(self, comm):
        import cupy
        from cupy.cuda import nccl

        self._cupy, self._nccl, self._comm = cupy, nccl, comm
        self.rank, self.world = comm.rank_id(), comm.size()
        self.device = comm.device_id()
        self._stream = cupy.cuda.Stream(non_blocking=True)

    def exchange(self, send, recv, tag, hops=1):
        cupy, nccl = self._cupy, self._nccl
        current = cupy.cuda.get_current_stream()
        self._stream.wait_event(current.record())
        after, before = (self.rank + hops) % self.world, (self.rank - hops) % self.world
        nccl.groupStart()
        for x in send:
            self._comm.send(x.data.ptr, x.nbytes, nccl.NCCL_UINT8, after, self._stream.ptr)
        for x in recv:
            self._comm.recv(x.data.ptr, x.nbytes, nccl.NCCL_UINT8, before, self._stream.ptr)
        nccl.groupEnd()
        done = self._stream.record()
        return _Pending(lambda: current.wait_event(done))


def _ring_of(comm, xp):
    """The ring adapter of ``comm`` for arrays of module ``xp``."""
    if isinstance(comm, VirtualRing):
        return comm
    if xp is not numpy:
        try:
            from cupy.cuda import nccl
        except ImportError:
            nccl = None
        if nccl is not None and getattr(nccl, "available", False) and isinstance(comm, nccl.NcclCommunicator):
            ring = _NcclRing(comm)
            if xp.cuda.Device().id != ring.device:
                raise ValueError(f"comm drives GPU {ring.device}, but the current device is GPU "
                                 f"{xp.cuda.Device().id}; run under `with cupy.cuda.Device({ring.device}):`")
            return ring
    raise TypeError(
        "comm must be a cupy.cuda.nccl.NcclCommunicator (with CuPy arrays; CuPy's NCCL needs the "
        "nvidia-nccl wheel) or a cupyflash.VirtualRing rank, got "
        f"{type(comm).__module__}.{type(comm).__qualname__}"
    )


# ------------------------------------------------------------------------------------------------
# The algorithm.


class _Geometry:
    """Where a rank's rows lie in the global sequence, and the attention calls each ring step needs.

    A shard is a list of runs (shard start, global start, length). Query i and key j of the global
    sequence meet when ``-left <= j - i <= right`` (a bound of -1 is absent; causal is right = 0). For
    each pair of runs the calls keep only the rows and keys with a visible pair and re-express the mask
    as a window of flash_attention, which aligns windows to the bottom-right corner of its block."""

    def __init__(self, world, layout, rows_q, rows_k, left, right):
        self.world, self.layout, self.rows_q, self.rows_k = world, layout, rows_q, rows_k
        self.left, self.right = left, right
        self.steps = _steps(world, layout, rows_q, left, right) if layout else world

    def calls(self, rank, step):
        """(query slice, key slice, window_size) of ``rank``'s queries on the block visiting at ``step``
        (owned by rank - step)."""
        if self.layout is None:  # no mask: positions do not matter
            return [(slice(0, self.rows_q), slice(0, self.rows_k), (-1, -1))]
        plan = _plan(self.world, self.layout, self.rows_q, self.left, self.right, rank, (rank - step) % self.world)
        return [(slice(*rows_q), slice(*rows_k), window) for rows_q, rows_k, window in plan]


def _runs(rank, world, rows, layout):
    """Rank ``rank``'s shard as runs (shard start, global start, length), in sequence order."""
    if layout == "zigzag":
        half = rows // 2
        return ((0, rank * half, half), (half, (2 * world - 1 - rank) * half, half))
    return ((0, rank * rows, rows),)


def _sub_block(q_run, k_run, left, right):
    """The call of one (query run, key run) pair: ((q start, q stop), (k start, k stop), window) in shard
    coordinates, or None when no query of the run sees a key of the other."""
    (q_base, q_global, rows_q), (k_base, k_global, rows_k) = q_run, k_run
    delta = q_global - k_global  # query i and key j of the runs lie (j - i) - delta apart globally
    # Trim what no pair reaches: keys past the last query's right bound, before the first query's left
    # bound; queries whose window starts past the last kept key, or ends before the first.
    k_stop = rows_k if right < 0 else min(rows_k, rows_q + delta + right)
    k_start = 0 if left < 0 else max(0, delta - left)
    if k_stop <= k_start:
        return None
    q_stop = rows_q if left < 0 else min(rows_q, k_stop - delta + left)
    q_start = 0 if right < 0 else max(0, k_start - delta - right)
    if q_stop <= q_start:
        return None
    # flash_attention's window on the sub-block is aligned to its bottom-right corner, i.e. shifted by
    # its key count minus its query count; globally the shift is delta + q_start - k_start. The window
    # moves by the difference, which the trimming above keeps within [-left, right]: no bound turns
    # negative.
    shift = (k_stop - q_stop) - delta
    sub_left = -1 if left < 0 else left + shift
    sub_right = -1 if right < 0 else right - shift
    # A bound that reaches past the sub-block's corner excludes nothing.
    if sub_right >= q_stop - q_start - 1:
        sub_right = -1
    if sub_left >= k_stop - k_start - 1:
        sub_left = -1
    return (q_base + q_start, q_base + q_stop), (k_base + k_start, k_base + k_stop), (sub_left, sub_right)


def _joined(ranges):
    """The union of sorted ``ranges`` when they tile one interval, else None."""
    if all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])):  # noqa: RUF007 (itertools.pairwise needs Python 3.10)
        return ranges[0][0], ranges[-1][1]
    return None


@functools.lru_cache(maxsize=4096)
def _plan(world, layout, rows, left, right, rank, owner):
    """The calls of ``rank``'s queries on ``owner``'s block (see _Geometry.calls), fewest possible."""
    if owner == rank and left < 0 and right <= 0:
        # The runs of a shard are in sequence order, so a mask that only depends on the order of i and j
        # (causal, or none) is the same on the concatenated shard: one call.
        return (((0, rows), (0, rows), (left, right)),)
    calls = [call for q_run in _runs(rank, world, rows, layout) for k_run in _runs(owner, world, rows, layout)
             if (call := _sub_block(q_run, k_run, left, right)) is not None]
    if len(calls) > 1 and all(window == (-1, -1) for _, _, window in calls):
        # Unmasked pairs that tile a rectangle of the shards are one call.
        rows_q, rows_k = sorted({c[0] for c in calls}), sorted({c[1] for c in calls})
        joined_q, joined_k = _joined(rows_q), _joined(rows_k)
        if len(calls) == len(rows_q) * len(rows_k) and joined_q and joined_k:
            return ((joined_q, joined_k, (-1, -1)),)
    return tuple(calls)


@functools.lru_cache(maxsize=256)
def _steps(world, layout, rows, left, right):
    """Ring steps up to the last that brings some rank a visible block (every rank takes the same
    number): fewer than world only for windows that look back a bounded distance."""
    for step in range(world - 1, 0, -1):
        if any(_plan(world, layout, rows, left, right, rank, (rank - step) % world) for rank in range(world)):
            return step + 1
    return 1


def _check(function, named, comm, causal, window_size, layout, softmax_scale, precision, sinks=None):
    """Common checks of the ring calls; returns (array module, ring, geometry). ``function`` names the
    call and ``named`` holds its arrays; a VirtualRing rank also checks that its call agrees with the
    other ranks' (an NCCL rank cannot without a host synchronization)."""
    xp = _problem.array_module(named)
    ring = _ring_of(comm, xp)
    causal = _problem.check_flag("causal", causal)
    left, right = _problem.check_window(window_size, causal)
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} or None, got {layout!r}")
    rows_q, rows_k = named["q"].shape[1], named["k"].shape[1]
    if left < 0 and right < 0:
        geometry = _Geometry(ring.world, None, rows_q, rows_k, -1, -1)
    else:
        what = "a causal ring" if causal else "a ring with a sliding window"
        if layout is None:
            raise ValueError(f"{what} needs layout='zigzag' (shards from cupyflash.zigzag_shard, the same work on "
                             "every rank) or layout='contiguous' (rank r holds chunk r)")
        if rows_q != rows_k:
            raise ValueError(f"{what} shards q and k alike; got {rows_q} query and {rows_k} key rows")
        if layout == "zigzag" and rows_q % 2:
            raise ValueError(f"a zigzag shard holds two equal chunks; got {rows_q} rows")
        geometry = _Geometry(ring.world, layout, rows_q, rows_k, left, right)
    if isinstance(ring, VirtualRing):
        signature = {"function": function, "arrays": xp.__name__, "dtype": str(named["q"].dtype), "causal": causal,
                     "window_size": tuple(int(w) for w in window_size), "layout": layout,
                     "softmax_scale": softmax_scale, "precision": precision,
                     "sinks": None if sinks is None else sinks.tolist() if xp is numpy else "given"}
        signature.update((f"{name} shape", tuple(x.shape)) for name, x in named.items())
        ring._begin(function, signature)
    return xp, ring, geometry


def _visiting_blocks(ring, xp, k, v, steps, back=False):
    """Yields (step, (k, v) block in hand) for the first ``steps`` ring steps, starting with the block
    (k, v): this rank's own, which goes to rank + 1 while the next comes from rank - 1; or, ``back``, the
    block the forward left in hand (that of rank - (steps - 1)), which goes to rank - 1 while the next
    comes from rank + 1, so that the walk ends on the rank's own block. While the caller works on one
    block the next is in flight, into one of two buffers, waited for when the caller asks for it."""
    block = (xp.ascontiguousarray(k), xp.ascontiguousarray(v))
    buffers = [(xp.empty_like(block[0]), xp.empty_like(block[1])) for _ in range(min(steps - 1, 2))]
    tag, hops = ("kv back", -1) if back else ("kv", 1)
    for step in range(steps):
        pending = None
        if step < steps - 1:
            arriving = buffers[step % 2]
            pending = ring.exchange(block, arriving, tag, hops)
        yield step, block
        if pending is not None:
            pending.wait()
            block = arriving


def _block_problem(p, q, k, window):
    """The problem of one call of a ring step: problem ``p`` of the rank's shard on the query and key rows
    ``q`` and ``k`` of a block, with ``window`` (checked by the planner, cupyflash/_ring.py). The sinks
    join once, after the merge of every block (a block's lse must be of its keys alone)."""
    return dataclasses.replace(p, seqlen_q=q.shape[1], seqlen_k=k.shape[1], window_left=window[0],
                               window_right=window[1], sinks=None)


def _summed_over_ranks(ring, xp, share):
    """The sum of every rank's ``share`` (arrays of one shape), added in rank order on every rank so
    that all hold the same bits: the shares travel world - 1 hops around the ring."""
    shares = {ring.rank: share}
    held = share
    for hop in range(1, ring.world):
        arriving = xp.empty_like(share)
        ring.exchange((held,), (arriving,), "dsinks").wait()
        held = shares[(ring.rank - hop) % ring.world] = arriving
    total = shares[0]
    for rank in range(1, ring.world):
        total = total + shares[rank]
    return total


def ring_forward(p, q, k, v, ring, geometry, keep_last=False):
    """(out, lse) of this rank's queries over every rank's keys: the compute layer on each block, merged
    (validated inputs of problem ``p``); with ``keep_last``, also the (k, v) block in hand at the end
    (rank - (steps - 1)'s), where ring_backward's walk back starts."""
    xp = p.xp
    acc = _problem.lse_dtype(q.dtype)
    batch, rows, heads = q.shape[:3]
    out = lse = block = None
    for step, block in _visiting_blocks(ring, xp, k, v, geometry.steps):
        for rows_q, rows_k, window in geometry.calls(ring.rank, step):
            q_part, k_part, v_part = q[:, rows_q], block[0][:, rows_k], block[1][:, rows_k]
            part, part_lse = _compute.forward(_block_problem(p, q_part, k_part, window), q_part, k_part, v_part)
            if out is None and rows_q == slice(0, rows):  # the first call on every row: nothing to merge
                out, lse = part.astype(acc), part_lse
                continue
            if out is None:
                out = xp.zeros((batch, rows, heads, v.shape[3]), acc)
                lse = xp.full((batch, heads, rows), -numpy.inf, acc)
            merged, merged_lse = _merge.merge(xp, [out[:, rows_q], part.astype(acc)], [lse[:, :, rows_q], part_lse], False)
            out[:, rows_q], lse[:, :, rows_q] = merged, merged_lse
    if p.sinks is not None:
        out, lse = _merge.add_sinks(xp, out, lse, p.sinks, False, acc)
    return (out.astype(q.dtype), lse) + ((block,) if keep_last else ())


def ring_backward(p, dout, q, k, v, out, lse, ring, geometry, deterministic, start=None):
    """(dq, dk, dv) of this rank's shard, and dsinks (summed over every rank's rows) with sinks
    (validated inputs of problem ``p``). Each call's partial gradients come from the block backward given
    the global out and lse (so its probabilities are the global softmax's, sinks included); dK and dV
    accumulate in the block's travelling accumulators, which go home after the last step. ``start``: the
    block the forward left in hand (ring_forward's keep_last, the vjp): the walk then goes back, from that
    block to the rank's own, the accumulators with the blocks, so it needs no transfer for its first
    block and its sums end at home (no trip home)."""
    xp = p.xp
    acc = _problem.acc_dtype(q.dtype)
    world, steps = ring.world, geometry.steps
    back = start is not None
    tag, direction = ("dkv back", -1) if back else ("dkv", 1)
    # The accumulators move after every step but the last, then go home (a full turn, or straight back
    # from where a shortened ring stopped). Two sets alternate: the one in hand is sent while the next
    # arrives in the other, which the send before last has finished reading (the sends and receives of
    # a rank are ordered on one stream; a virtual ring copies at the send).
    dq = xp.zeros(q.shape, acc)
    grads = (xp.zeros(k.shape, acc), xp.zeros(v.shape, acc))
    grad_buffers = [grads, (xp.empty(k.shape, acc), xp.empty(v.shape, acc))] if steps > 1 else []
    pending = arriving = None
    for step, block in _visiting_blocks(ring, xp, *(start if back else (k, v)), steps, back):
        forward_step = steps - 1 - step if back else step  # the block of rank - forward_step
        parts = [(rows_q, rows_k,
                  _compute.backward(_block_problem(p, q[:, rows_q], block[0][:, rows_k], window), dout[:, rows_q],
                                    q[:, rows_q], block[0][:, rows_k], block[1][:, rows_k], out[:, rows_q],
                                    lse[:, :, rows_q], deterministic))
                 for rows_q, rows_k, window in geometry.calls(ring.rank, forward_step)]
        if pending is not None:
            # The accumulators of the block now in hand, from the rank that held it last.
            pending.wait()
            grads = arriving
        for rows_q, rows_k, (dq_part, dk_part, dv_part) in parts:
            # One pass each: the parts are widened to the accumulator's dtype inside the addition.
            dq[:, rows_q] += dq_part
            grads[0][:, rows_k] += dk_part
            grads[1][:, rows_k] += dv_part
        if step < steps - 1:  # on to the next holder of this block
            arriving = grad_buffers[(step + 1) % 2]
            pending = ring.exchange(grads, arriving, tag, direction)
    # The sums are complete: walking back they are home; else they go home (to owner = rank - last
    # step) in the output dtype, which halves the only transfer no computation hides, for 16-bit inputs.
    grads = tuple(g.astype(q.dtype) for g in grads)
    hops = 0 if back else world - (steps - 1)
    if hops % world:
        home = (xp.empty_like(grads[0]), xp.empty_like(grads[1]))
        ring.exchange(grads, home, "dkv home", hops).wait()
        grads = home
    if p.sinks is None:
        return dq.astype(q.dtype), grads[0], grads[1]
    dsinks = _summed_over_ranks(ring, xp, _merge.sink_gradient(xp, dout, out, lse, p.sinks, False))
    return dq.astype(q.dtype), grads[0], grads[1], dsinks
