"""Ring attention: a sequence sharded over the ranks of a ring, each rank attending its queries to every
rank's keys and values as the K/V blocks travel around the ring, partial results merged by their
log-sum-exp (cupyflash.merge_attention_states); the backward sends each block's dK/dV accumulators
around with it. The per-rank code is the same for an NCCL communicator (GPUs, NCCL carries the bytes on
a stream of its own, overlapped with the attention of the block in hand) and for a VirtualRing (ranks
as threads of one process, NumPy or CuPy arrays), which the CPU tests use.

Memory per rank: its shard, two K/V blocks (the one in hand and the one arriving) and, in the backward,
float32 (float64 for float64 inputs) dQ, dK and dV accumulators of shard size.
"""

import queue
import threading

import numpy

from . import _validate

#: Shard layouts of a causal ring. "zigzag": rank r holds chunks r and 2 * world - 1 - r of the sequence
#: cut into 2 * world chunks (zigzag_shard), so every rank does the same work; "contiguous": rank r holds
#: chunk r of world chunks (the last rank does the most).
LAYOUTS = ("zigzag", "contiguous")


def zigzag_shard(x, world, rank, axis=1):
    """Rank ``rank``'s shard of the full sequence ``x`` in the zigzag layout: chunks ``rank`` and
    ``2 * world - 1 - rank`` of ``2 * world`` equal chunks along ``axis`` (1 for q, k, v, out and dout,
    2 for lse), concatenated. The length along ``axis`` must be a multiple of ``2 * world``."""
    xp = _validate._array_module({"x": x})
    length = x.shape[axis]
    if not _validate._is_int(world) or not _validate._is_int(rank) or world < 1 or not 0 <= rank < world:
        raise ValueError(f"need 0 <= rank < world, got rank {rank!r}, world {world!r}")
    if length % (2 * world):
        raise ValueError(f"the sequence axis ({length}) must be a multiple of 2 * world = {2 * world}")
    chunk = length // (2 * world)

    def take(i):
        index = [slice(None)] * x.ndim
        index[axis] = slice(i * chunk, (i + 1) * chunk)
        return x[tuple(index)]

    return xp.concatenate([take(rank), take(2 * world - 1 - rank)], axis=axis)


def zigzag_unshard(shards, axis=1):
    """The full sequence from every rank's zigzag shard (``shards[r]`` from rank r), the inverse of
    :func:`zigzag_shard`."""
    world = len(shards)
    if world < 1:
        raise ValueError("need at least one shard")
    xp = _validate._array_module({f"shards[{r}]": s for r, s in enumerate(shards)})
    chunks = [None] * (2 * world)
    for r, shard in enumerate(shards):
        half = shard.shape[axis] // 2
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


class VirtualRing:
    """One rank of a ring of ``world`` ranks in one process (threads), for NumPy or CuPy arrays: the
    same ring algorithm as an NCCL communicator runs, with the blocks handed over through queues.

    >>> results = VirtualRing.run(4, lambda ring: cupyflash.ring_flash_attention(q[ring.rank], ...,
    ...                                                                          ring))
    """

    def __init__(self, rank, members, failed):
        self.rank = rank
        self._members = members
        self._failed = failed  # set when a rank of the ring raised: the others stop waiting
        self._inbox = {}
        self._lock = threading.Lock()

    @property
    def world(self):
        return len(self._members)

    @classmethod
    def create(cls, world):
        """The ``world`` ranks of a new virtual ring."""
        if not _validate._is_int(world) or world < 1:
            raise ValueError(f"world must be a positive int, got {world!r}")
        members, failed = [], threading.Event()
        members.extend(cls(r, members, failed) for r in range(world))
        return members

    @classmethod
    def run(cls, world, fn):
        """``[fn(ring) for each rank]``, every rank in its own thread (the ranks wait on each other's
        blocks). An exception in any rank is raised here (after every thread has stopped)."""
        members = cls.create(world)
        results, errors = [None] * world, []
        failed = members[0]._failed

        def body(ring):
            try:
                results[ring.rank] = fn(ring)
            except BaseException as exc:  # reported below; the ranks waiting on this one give up
                errors.append(exc)
                failed.set()

        threads = [threading.Thread(target=body, args=(m,)) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    def _box(self, tag):
        with self._lock:
            return self._inbox.setdefault(tag, queue.Queue())

    def exchange(self, send, recv, tag):
        """Sends copies of ``send`` to the next rank and, on wait(), fills ``recv`` from the previous one."""
        self._members[(self.rank + 1) % self.world]._box(tag).put([x.copy() for x in send])

        def wait():
            box = self._box(tag)
            while True:
                try:
                    received = box.get(timeout=0.05)
                    break
                except queue.Empty:
                    if self._failed.is_set():
                        raise RuntimeError("another rank of the virtual ring failed") from None
            for dst, src in zip(recv, received):
                dst[...] = src

        return _Pending(wait)


class _NcclRing:
    """A rank of an NCCL communicator: blocks go to rank + 1 and come from rank - 1 on a stream of their
    own, ordered after the work the current stream has enqueued, and the current stream waits for them
    on wait(); the attention of the block in hand runs meanwhile."""

    def __init__(self, comm):
        import cupy
        from cupy.cuda import nccl

        self._cupy, self._nccl, self._comm = cupy, nccl, comm
        self.rank, self.world = comm.rank_id(), comm.size()
        self.device = comm.device_id()
        self._stream = cupy.cuda.Stream(non_blocking=True)

    def exchange(self, send, recv, tag):
        cupy, nccl = self._cupy, self._nccl
        current = cupy.cuda.get_current_stream()
        self._stream.wait_event(current.record())
        after, before = (self.rank + 1) % self.world, (self.rank - 1) % self.world
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

def _check(named, comm, causal, window_size, layout):
    """Common checks of the ring calls; returns (array module, ring, layout)."""
    xp = _validate._array_module(named)
    ring = _ring_of(comm, xp)
    causal = _validate.check_flag("causal", causal)
    if not isinstance(window_size, (tuple, list)) or tuple(window_size) != (-1, -1):
        raise ValueError(f"ring attention supports no sliding window yet; window_size must be (-1, -1), got "
                         f"{window_size!r}")
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} or None, got {layout!r}")
    if causal and layout is None:
        raise ValueError("a causal ring needs layout='zigzag' (shards from cupyflash.zigzag_shard, the same work on "
                         "every rank) or layout='contiguous' (rank r holds chunk r)")
    q, k = named["q"], named["k"]
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"a causal ring shards q and k alike; got {q.shape[1]} query and {k.shape[1]} key rows")
    if causal and layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"a zigzag shard holds two equal chunks; got {q.shape[1]} rows")
    return xp, ring, layout if causal else None


def _pairs(rank, step, world, causal, layout, rows):
    """How this rank's queries meet the block visiting at ``step`` (from rank (rank - step) % world):
    (query rows, block rows, causal) or None when no pair is visible. A zigzag shard holds chunks
    (rank, 2 world - 1 - rank) of 2 world, in sequence order."""
    owner = (rank - step) % world
    every = slice(None)
    if not causal:
        return every, every, False
    if owner == rank:
        # Both chunks in sequence order: the local causal mask is the global one.
        return every, every, True
    if layout == "contiguous":
        return (every, every, False) if owner < rank else None
    half = rows // 2
    if owner < rank:
        # Its first chunk (owner) precedes both of ours; its second (2 world - 1 - owner) follows both.
        return every, slice(0, half), False
    # A later rank: both its chunks lie between our first chunk and our second.
    return slice(half, None), every, False


def _visiting_blocks(ring, xp, k, v):
    """Yields (step, (k, v) block in hand) for the ring's steps, starting with this rank's own. While the
    caller works on one block the next is in flight: the one in hand goes to rank + 1 and the next comes
    from rank - 1 into one of two buffers, waited for when the caller asks for it."""
    block = (xp.ascontiguousarray(k), xp.ascontiguousarray(v))
    buffers = [(xp.empty_like(block[0]), xp.empty_like(block[1])) for _ in range(min(ring.world - 1, 2))]
    for step in range(ring.world):
        pending = None
        if step < ring.world - 1:
            arriving = buffers[step % 2]
            pending = ring.exchange(block, arriving, "kv")
        yield step, block
        if pending is not None:
            pending.wait()
            block = arriving


def ring_forward(q, k, v, ring, xp, causal, softmax_scale, layout):
    """(out, lse) of this rank's queries over every rank's keys (validated inputs)."""
    from ._api import flash_attention, merge_attention_states

    acc = _validate.lse_dtype(q.dtype)
    world, rows = ring.world, q.shape[1]
    out = lse = None
    for step, block in _visiting_blocks(ring, xp, k, v):
        pair = _pairs(ring.rank, step, world, causal, layout, rows)
        if pair is not None:
            rows_q, rows_k, masked = pair
            part, part_lse = flash_attention(q[:, rows_q], block[0][:, rows_k], block[1][:, rows_k], causal=masked,
                                             softmax_scale=softmax_scale, return_lse=True)
            if out is None:  # step 0: the rank's own block, every row
                out, lse = part.astype(acc), part_lse
            else:
                merged, merged_lse = merge_attention_states(out[:, rows_q], lse[:, :, rows_q], part.astype(acc),
                                                            part_lse)
                out[:, rows_q], lse[:, :, rows_q] = merged, merged_lse
    return out.astype(q.dtype), lse


def ring_backward(dout, q, k, v, out, lse, ring, xp, causal, softmax_scale, layout, deterministic):
    """(dq, dk, dv) of this rank's shard. Each block's partial gradients come from the block backward
    given the global out and lse (so its probabilities are the global softmax's); dK and dV accumulate
    in the block's travelling accumulators, which reach the block's owner after a full turn."""
    from ._api import flash_attention_backward

    acc = _validate.acc_dtype(q.dtype)
    world, rows = ring.world, q.shape[1]
    # The accumulators move every step (the last move brings each block's home): two buffers alternate.
    grad_buffers = [(xp.empty(k.shape, acc), xp.empty(v.shape, acc)) for _ in range(2 if world > 1 else 0)]
    dq = xp.zeros(q.shape, acc)
    grads = (xp.zeros(k.shape, acc), xp.zeros(v.shape, acc))
    grads_pending = grad_arriving = None
    for step, block in _visiting_blocks(ring, xp, k, v):
        pair = _pairs(ring.rank, step, world, causal, layout, rows)
        part = None
        if pair is not None:
            rows_q, rows_k, masked = pair
            part = flash_attention_backward(dout[:, rows_q], q[:, rows_q], block[0][:, rows_k], block[1][:, rows_k],
                                            out[:, rows_q], lse[:, :, rows_q], causal=masked,
                                            softmax_scale=softmax_scale, deterministic=deterministic)
        if grads_pending is not None:
            # The accumulators of the block now in hand, from the rank that held it last.
            grads_pending.wait()
            grads = grad_arriving
        if part is not None:
            dq[:, rows_q] += part[0].astype(acc)
            grads[0][:, rows_k] += part[1].astype(acc)
            grads[1][:, rows_k] += part[2].astype(acc)
        if world > 1:
            grad_arriving = grad_buffers[step % 2]
            grads_pending = ring.exchange(grads, grad_arriving, "dkv")
    if grads_pending is not None:
        grads_pending.wait()  # our own block's, after a full turn
        grads = grad_arriving
    return dq.astype(q.dtype), grads[0].astype(q.dtype), grads[1].astype(q.dtype)
