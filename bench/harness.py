"""What the benchmark scripts share: the GPU check, inputs, timing, FLOP counts, the torch peers, records,
tables and plots.

The scripts import this file as a sibling module (``python bench/x.py`` puts ``bench/`` first on
``sys.path``); cupyflash comes from the installation or from ``PYTHONPATH``. Importing it needs only
NumPy: CuPy, ml_dtypes, cupyflash, torch and matplotlib are imported by the functions that use them, so
``--help`` and the dry runs work on any machine, and :func:`require_gpu` turns a missing GPU into one
line and exit status 2.

Two timings, the two ways a user meets a call (a run of a script takes one, back to back unless
``--per-call``: a table beside the peers in both needs two runs; decode.py, ring.py and rotary.py time
back to back or on the host loop only):

- **back to back** (:func:`time_back_to_back`, :func:`time_grouped`, :func:`time_queued`): many calls
  enqueued without waiting, timed with CUDA events; where the kernel is longer than the host's work
  per call, this is the device time, which is what the peers' benchmarks report.
- **per call** (:func:`time_per_call`): each call alone, after a synchronize, until the device is done,
  on the host's clock: host time and launch latency included.

:func:`host_loop` is the third number: the host's time per call of a loop whose kernels are short, so
that the loop is bound by the host.
"""

import argparse
import dataclasses
import datetime
import functools
import json
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent

#: Exit status of a script that cannot run here (no CuPy, no GPU, no cupyflash): argparse's for a usage error.
EXIT_CANNOT_RUN = 2

# ------------------------------------------------------------------------------------------------ FLOPs

#: FLOPs per (query, key) pair and head dim in the forward pass: q.k and p.v, two FLOPs per multiply-add each.
FORWARD_FLOPS_PER_PAIR_DIM = 4
#: Backward FLOPs per forward FLOP (FlashAttention's convention).
BACKWARD_FLOP_FACTOR = 2.5
#: The FLOP conventions, as printed and stored.
FLOP_CONVENTION = "forward 4 * batch * heads * seqlen_q * seqlen_k * headdim, halved when causal; backward 2.5x forward"
VISIBLE_FLOP_CONVENTION = (
    "forward 4 * headdim * visible (query, key) pairs summed over batch and heads; backward 2.5x forward"
)


def forward_flops(batch, heads, seqlen_q, seqlen_k, headdim, causal):
    """FlashAttention's forward FLOP count.

    Parameters
    ----------
    batch, heads, seqlen_q, seqlen_k, headdim : int
        Problem sizes (heads: query heads).
    causal : bool
        Counts the visible area of the bottom-right aligned causal mask: half of the score matrix where
        seqlen_q == seqlen_k (the convention of FlashAttention's benchmarks, S^2 / 2 pairs rather than
        S (S + 1) / 2), seqlen_q * seqlen_k - seqlen_q^2 / 2 for fewer queries than keys (each query sees
        the keys before it and those the extra keys add), seqlen_k^2 / 2 for more (the first
        seqlen_q - seqlen_k queries see none).

    Returns
    -------
    float
        ``4 * batch * heads * seqlen_q * seqlen_k * headdim`` (two matrix products, q k^T and p v, of two
        FLOPs per multiply-add), on the causal area when causal.
    """
    pairs = float(seqlen_q * seqlen_k)
    if causal:
        pairs = seqlen_q * seqlen_k - seqlen_q * seqlen_q / 2 if seqlen_q <= seqlen_k else seqlen_k * seqlen_k / 2
    return float(FORWARD_FLOPS_PER_PAIR_DIM * batch * heads * headdim) * pairs


def backward_flops(forward):
    """Backward FLOPs: :data:`BACKWARD_FLOP_FACTOR` times the forward's."""
    return BACKWARD_FLOP_FACTOR * forward


def pair_flops(pairs, headdim):
    """Forward FLOPs of ``pairs`` visible (query, key) pairs (summed over batch and heads): 4 * headdim each."""
    return float(FORWARD_FLOPS_PER_PAIR_DIM * headdim * pairs)


def window_pairs(seqlen_q, seqlen_k, left, right):
    """Visible pairs of one (batch entry, head) under a bottom-right aligned window.

    Query i sees key j iff ``d - left <= j <= d + right`` with ``d = i + seqlen_k - seqlen_q``; -1 leaves a
    side unbounded, so (-1, -1) is dense and (-1, 0) causal. For seqlen_q = seqlen_k = S: dense S^2, causal
    S (S + 1) / 2, window (w, 0) the sum over i of min(i, w) + 1.
    """
    diagonal = numpy.arange(seqlen_q, dtype=numpy.int64) + (seqlen_k - seqlen_q)
    low = numpy.zeros_like(diagonal) if left < 0 else numpy.maximum(diagonal - left, 0)
    high = numpy.full_like(diagonal, seqlen_k - 1) if right < 0 else numpy.minimum(diagonal + right, seqlen_k - 1)
    return int(numpy.clip(high - low + 1, 0, None).sum())


def block_pairs(layout, block_size, seqlen_q, seqlen_k, batch, heads):
    """Visible pairs of a block layout (batch or 1, heads or 1, q_blocks, k_blocks), no other mask.

    Each set block counts its area, ``min(block_q, rows left) * min(block_k, keys left)``; a leading
    layout axis of size 1 counts once per batch entry (head).
    """
    block_q, block_k = block_size
    rows = numpy.minimum(block_q, seqlen_q - block_q * numpy.arange(layout.shape[-2], dtype=numpy.int64))
    cols = numpy.minimum(block_k, seqlen_k - block_k * numpy.arange(layout.shape[-1], dtype=numpy.int64))
    per_layout = int(numpy.einsum("bhrc,r,c->", layout.astype(numpy.int64), rows, cols))
    return per_layout * (batch // layout.shape[0]) * (heads // layout.shape[1])


def varlen_pairs(lengths, window=(-1, -1)):
    """Visible pairs of one head of a packed batch, each sequence its own (L x L) problem under ``window``."""
    return sum(window_pairs(int(n), int(n), *window) for n in lengths)


def random_block_layout(density, seed, heads, q_blocks, k_blocks):
    """Random block layout (1, heads, q_blocks, k_blocks): each block set with probability ``density``
    (``numpy.random.default_rng(seed).random(shape) < density``), the diagonal blocks always set so no
    query row is empty. With one seed, a lower density's layout is a subset of a higher one's."""
    layout = numpy.random.default_rng(seed).random((1, heads, q_blocks, k_blocks)) < density
    diagonal = numpy.arange(min(q_blocks, k_blocks))
    layout[:, :, diagonal, diagonal] = True
    return layout


def varlen_lengths(count, low, high, seed):
    """``count`` lengths uniform in [low, high] from ``numpy.random.default_rng(seed)``."""
    return tuple(int(n) for n in numpy.random.default_rng(seed).integers(low, high, size=count, endpoint=True))


# ----------------------------------------------------------------------------------------------- dtypes

#: Benchmarked dtypes by command-line name (bf16 is ml_dtypes.bfloat16, which cupyflash takes), and their bytes.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


def dtype(name):
    """The numpy.dtype of a name of :data:`DTYPE_BYTES` (imports ml_dtypes for bf16)."""
    if name == "bf16":
        import ml_dtypes

        return numpy.dtype(ml_dtypes.bfloat16)
    return numpy.dtype({"fp16": numpy.float16, "fp32": numpy.float32, "fp64": numpy.float64}[name])


# -------------------------------------------------------------------------------------------------- GPU


def one_line(exc):
    """``Type: message`` of an exception on one line."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def missing(need_cupyflash=True):
    """Why the benchmarks cannot run here (no CuPy, no CUDA device, no cupyflash), or None when they can."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 (ImportError, or a CuPy whose CUDA libraries fail to load)
        return f"needs CuPy and a CUDA GPU: CuPy is not importable ({one_line(exc)}); install cupy-cuda12x or cupy-cuda13x"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 (CUDARuntimeError: no driver, or a driver older than CuPy's runtime)
        return f"needs a CUDA GPU: no CUDA driver or device ({one_line(exc)})"
    if not count:
        return "needs a CUDA GPU: no CUDA device"
    if need_cupyflash:
        try:
            import cupyflash  # noqa: F401 (the check is the import)
        except Exception as exc:  # noqa: BLE001 (whatever stops the import)
            return (f"needs cupyflash: not importable ({one_line(exc)}); run from the repository root with "
                    "PYTHONPATH=$PWD, or pip install -e .")
    return None


def require_gpu(script, hint="", need_cupyflash=True):
    """Exit with one line on stderr and status :data:`EXIT_CANNOT_RUN` unless CuPy, a GPU and (by default)
    cupyflash are there. ``hint`` follows the line (e.g. what runs without a GPU)."""
    problem = missing(need_cupyflash)
    if problem:
        print(f"{script} {problem}." + (f" {hint}" if hint else ""), file=sys.stderr)
        sys.exit(EXIT_CANNOT_RUN)


def synchronize():
    """Wait for all work on the current device, on every stream (CuPy's and torch's)."""
    import cupy

    cupy.cuda.Device().synchronize()


def release_cached_memory(peers=None):
    """Return the memory cached by CuPy's default pool (and torch's allocator, with ``peers``) to the device."""
    import cupy

    synchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    if peers is not None:
        peers.torch.cuda.empty_cache()


def make_inputs(shape, dtype, seed, count=4):
    """Fresh standard-normal arrays on the device (by default q, k, v, dout), never zeros.

    Parameters
    ----------
    shape : tuple of int
        Shape of every array.
    dtype : numpy.dtype
        Drawn in float32, then cast on the device (float64 is drawn in float64).
    seed : int
        Seed of the device generator; the arrays are successive draws.
    count : int
        How many arrays.

    Returns
    -------
    tuple of cupy.ndarray
    """
    import cupy

    rng = cupy.random.RandomState(seed)
    draw = numpy.float64 if dtype == numpy.float64 else numpy.float32
    return tuple(rng.standard_normal(shape, dtype=draw).astype(dtype) for _ in range(count))


# ----------------------------------------------------------------------------------------------- timing


class EventClock(NamedTuple):
    """CUDA events of one library: ``event()`` makes a timing event, ``elapsed_ms(start, stop)`` reads it."""

    event: Callable
    elapsed_ms: Callable


def cupy_clock():
    """CuPy's events."""
    import cupy

    return EventClock(cupy.cuda.Event, cupy.cuda.get_elapsed_time)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Options that apply to every row of bench.py and masks.py."""

    warmup: int
    repeats: int
    backward: bool
    peers: bool
    #: "back-to-back" (CUDA events, calls enqueued without waiting) or "per-call" (:func:`time_per_call`).
    timing: str = "back-to-back"
    #: cupyflash's precision= on float32 rows (bench.py --precision).
    precision: str = "highest"


#: Least time (ms, on the host's clock) that the warm-up calls take before any timing: a GPU raises its
#: clocks over the first ~100 ms of work after an idle spell, and a few warm-up calls of a short kernel
#: end before that (session 40: the same kernel 9-13% apart between two processes that timed after one call).
WARM_MS = 100.0

#: The timings ``Settings.timing`` names, as stored in results.json.
TIMINGS = {
    "back-to-back": "CUDA events around each call, enqueued back to back after the warm-up (its calls and at "
    f"least {WARM_MS:.0f} ms); median in ms",
    "per-call": "host clock around each call alone, from a synchronize to the end of its device work "
    f"(host time included), after the warm-up (its calls and at least {WARM_MS:.0f} ms); median in ms",
}


def warmup_text(settings):
    """The warm-up of ``settings`` in words, for the scripts' plans and headers."""
    return f"warm-up {settings.warmup} calls and {WARM_MS:.0f} ms"


def warm_up(call, count):
    """``count`` calls, then more until they have taken WARM_MS; the device is synchronized every ten calls
    (so the clock measures work done, not enqueued) and at the end."""
    start = time.perf_counter()
    done = 0
    while done < count or (time.perf_counter() - start) * 1e3 < WARM_MS:
        call()
        done += 1
        if done % 10 == 0:
            synchronize()
    synchronize()
    return done


def time_back_to_back(call, warmup, repeats, clock):
    """Milliseconds of each of ``repeats`` calls enqueued back to back, each between two CUDA events.

    ``warmup`` untimed calls come first (and more until they took WARM_MS: :func:`warm_up`); the device is
    synchronized before the first timed call and after the last. Where the host's work per call is shorter
    than the kernels, each time is the device time of one call.
    """
    warm_up(call, warmup)
    events = [(clock.event(), clock.event()) for _ in range(repeats)]
    for start, stop in events:
        start.record()
        call()
        stop.record()
    synchronize()
    return [clock.elapsed_ms(start, stop) for start, stop in events]


def time_per_call(call, warmup, repeats):
    """Milliseconds of each of ``repeats`` calls made alone: a synchronize, the call, a synchronize, on the
    host's clock (host time, launch latency and device time together), after ``warmup`` untimed calls
    (:func:`warm_up`)."""
    warm_up(call, warmup)
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        call()
        synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def time_grouped(call, warmup, repeats, inner):
    """Milliseconds per call of ``repeats`` groups of ``inner`` back-to-back calls, two CUDA events around
    each group (a decoding loop: the host prepares the next call while the device runs the last one), after
    ``warmup`` untimed calls (:func:`warm_up`)."""
    import cupy

    warm_up(call, warmup)
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(inner):
            call()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / inner)
    return times


def host_loop(call, calls):
    """Seconds per call of a loop of ``calls`` calls that synchronizes once, at the end (and once before).

    Where each call's device work is shorter than its host work, this is the host's time per call.
    """
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    synchronize()
    return (time.perf_counter() - start) / calls


#: A kernel that holds the stream for a given time (``%globaltimer``, nanoseconds; its ticks are coarse
#: but far shorter than the milliseconds asked of it), so that the calls queued behind it start back to
#: back, whatever the host's time per call.
SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long nanoseconds) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}
"""
#: The spin covers this many times the measured host time of the queued calls, plus SPIN_EXTRA_MS, at most SPIN_MAX_MS.
SPIN_MARGIN = 1.5
SPIN_EXTRA_MS = 1.0
SPIN_MAX_MS = 2000.0


@functools.cache
def _spin_kernel():
    import cupy

    return cupy.RawKernel(SPIN_SOURCE, "spin")


def host_ms_per_call(call, calls=3):
    """Host milliseconds to enqueue one call (``calls`` calls without a synchronize, then one)."""
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host_ms = (time.perf_counter() - start) * 1e3 / calls
    synchronize()
    return host_ms


def time_queued(call, calls, host_ms):
    """Device milliseconds of each of ``calls`` calls queued back to back behind a spin kernel.

    The spin lasts longer than the host needs to enqueue every call (``host_ms`` per call, from
    :func:`host_ms_per_call`), so the calls run one after the other with no gap for the host, each
    between two CUDA events: the kernel time of a call, including every kernel it launches.
    """
    import cupy

    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(calls)]
    spin_ms = min(SPIN_MAX_MS, SPIN_MARGIN * host_ms * calls + SPIN_EXTRA_MS)
    synchronize()
    _spin_kernel()((1,), (1,), (numpy.uint64(spin_ms * 1e6),))
    for start, stop in events:
        start.record()
        call()
        stop.record()
    synchronize()
    return [cupy.cuda.get_elapsed_time(start, stop) for start, stop in events]


def median(values):
    """Median of a non-empty sequence of numbers, as a float."""
    return float(numpy.median(numpy.asarray(values, dtype=numpy.float64)))


#: Error texts kept in JSON records and shown in progress lines.
ERROR_CHARS_JSON = 600
ERROR_CHARS_PROGRESS = 150


def measured(times_ms, flops):
    """A successful measurement: median time, TFLOP/s and every time, as a JSON-ready dict."""
    median_ms = median(times_ms)
    return {"median_ms": median_ms, "tflops": flops / median_ms / 1e9, "times_ms": [float(t) for t in times_ms]}


def balanced_order(items, round_index):
    """The order of ``items`` (a round's systems) in round ``round_index``: a Williams design, whose rows
    start 0, 1, n-1, 2, n-2, ... shifted by the round, so that over n rounds (2n for an odd n, the
    second n reversed) every system takes every place and follows every other system equally often.
    The card's clocks follow what ran just before (bench/NOTES.md, 2026-12-02, fifth session: the system
    measured right after cuDNN ran 5-7% faster at seqlen 16k, and rows of 150-300 us calls moved by up
    to 8%); a plain rotation keeps each system behind the same one every round."""
    items = list(items)
    n = len(items)
    base = [0] + [(i + 1) // 2 if i % 2 else n - i // 2 for i in range(1, n)]
    order = [items[(b + round_index) % n] for b in base] if n else []
    return order[::-1] if n % 2 and (round_index // n) % 2 else order


def combine_rounds(measurements):
    """One measurement of several rounds of the same call: the median of the rounds' medians (TFLOP/s
    from it), every time, and the rounds' medians; the first failed or skipped round where any is."""
    for m in measurements:
        if "median_ms" not in m:
            return m
    flops = measurements[0]["tflops"] * measurements[0]["median_ms"] * 1e9
    round_ms = [m["median_ms"] for m in measurements]
    median_ms = median(round_ms)
    return {"median_ms": median_ms, "tflops": flops / median_ms / 1e9,
            "times_ms": [t for m in measurements for t in m["times_ms"]], "round_medians_ms": round_ms}


def run_rounds(systems, rounds, peers=None):
    """Each of ``systems`` (name -> a call returning {direction: measurement}) ``rounds`` times, in a new
    order each round (:func:`balanced_order`), cached memory released before each; per system and direction
    the median of the rounds' medians (:func:`combine_rounds`)."""
    per_round = {name: [] for name in systems}
    for index in range(rounds):
        for name in balanced_order(systems, index):
            release_cached_memory(peers)
            per_round[name].append(systems[name]())
    return {name: {key: combine_rounds([r[key] for r in results]) for key in results[0]}
            for name, results in per_round.items()}


def failed(exc, caught_warnings=()):
    """A measurement whose call raised: the exception and any warnings (torch explains there), one line."""
    text = one_line(exc)
    reasons = " | ".join(" ".join(str(w.message).split()) for w in caught_warnings)
    return {"error": (f"{text} [warnings: {reasons}]" if reasons else text)[:ERROR_CHARS_JSON]}


def skipped(reason):
    """A measurement that was not attempted, with the reason."""
    return {"skipped": reason}


def measure(make_call, flops, settings, clock=None):
    """Build a call, run it once untimed (compilation, lazy initialization), then time it.

    Parameters
    ----------
    make_call : callable
        Returns the zero-argument call to time; may do untimed setup (e.g. a forward pass before a
        backward one).
    flops : float
        FLOPs of one call.
    settings : Settings
        Warm-up and repeat counts, and the timing (back to back or per call).
    clock : EventClock or None
        Events of the library that launches the call (None: CuPy's); the per-call timing needs none.

    Returns
    -------
    dict
        :func:`measured`, or :func:`failed` when the setup or the call raised (unsupported input,
        out of memory), so one failing system never stops the benchmark.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call = make_call()
            call()
            if settings.timing == "per-call":
                times = time_per_call(call, settings.warmup, settings.repeats)
            else:
                times = time_back_to_back(call, settings.warmup, settings.repeats, clock or cupy_clock())
            return measured(times, flops)
        except Exception as exc:  # noqa: BLE001 (any backend error becomes an n/a entry)
            return failed(exc, caught)


# ------------------------------------------------------------------------------------------------ torch

#: torch.nn.attention.SDPBackend member of each torch SDPA system.
TORCH_BACKENDS = {"torch_fa2": "FLASH_ATTENTION", "torch_cudnn": "CUDNN_ATTENTION", "torch_efficient": "EFFICIENT_ATTENTION",
                  "torch_math": "MATH"}


@dataclasses.dataclass(frozen=True)
class TorchPeers:
    """torch pieces used to time its attention."""

    torch: object
    sdpa: Callable  # torch.nn.functional.scaled_dot_product_attention
    sdpa_kernel: Callable  # torch.nn.attention.sdpa_kernel
    backends: dict  # system key of TORCH_BACKENDS -> SDPBackend member, or None when this torch lacks it
    clock: EventClock


def load_torch():
    """Import torch for the peer systems, if it is there and sees a GPU.

    Returns
    -------
    peers : TorchPeers or None
    description : str
        torch's version (with CUDA and cuDNN versions), or why the torch systems do not run.
    """
    import cupy

    try:
        import torch
        import torch.nn.functional
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except (ImportError, OSError) as exc:  # OSError: torch present but its CUDA libraries fail to load
        return None, f"torch not importable ({exc})"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__}: torch.cuda.is_available() is False"
    torch.cuda.set_device(cupy.cuda.Device().id)
    # float32 peers at float32 accuracy, as issue 22 compares them: no TF32 in torch's matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    peers = TorchPeers(
        torch=torch,
        sdpa=torch.nn.functional.scaled_dot_product_attention,
        sdpa_kernel=sdpa_kernel,
        backends={key: getattr(SDPBackend, name, None) for key, name in TORCH_BACKENDS.items()},
        clock=EventClock(lambda: torch.cuda.Event(enable_timing=True), lambda start, stop: start.elapsed_time(stop)),
    )
    return peers, f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}; TF32 off)"


def load_flex(peers):
    """FlexAttention compiled once (``torch.compile(flex_attention, dynamic=False)``) and create_block_mask.

    Returns
    -------
    flex, create_block_mask : callables, or None, None with an old torch
    line : str
        How Flex runs, or why not.
    """
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        dynamo = peers.torch._dynamo.config
        # Every row is a new shape or mask_mod: compile each statically, and allow the recompiles.
        for name, value in (("automatic_dynamic_shapes", False), ("cache_size_limit", 1000), ("recompile_limit", 1000)):
            if hasattr(dynamo, name):
                setattr(dynamo, name, value)
        flex = peers.torch.compile(flex_attention, dynamic=False)
    except Exception as exc:  # noqa: BLE001 (an old torch without flex_attention)
        return None, None, f"  Flex: not run ({type(exc).__name__}: {exc}); its columns show -"
    line = "  Flex: torch.compile(flex_attention, dynamic=False), compiled at each row's first call (untimed)"
    return flex, create_block_mask, line


def load_flash_attn():
    """The ``flash_attn`` package (FlashAttention-2 with windows and varlen), or None; and a line saying which."""
    try:
        import flash_attn
    except Exception as exc:  # noqa: BLE001 (not installed, or built for another torch)
        return None, f"  FA2: torch SDPA FLASH_ATTENTION (dense rows only; flash_attn not importable: {type(exc).__name__})"
    return flash_attn, f"  FA2: torch SDPA FLASH_ATTENTION (dense rows); flash_attn {flash_attn.__version__} (window, varlen)"


def time_torch(peers, attention, layout, inputs, flops_fwd, flops_bwd, settings):
    """Forward and backward of a torch attention function on zero-copy views of CuPy arrays.

    The backward time is that of ``out.backward(dout, retain_graph=True)`` alone: the forward with
    ``requires_grad`` runs once before timing, and the gradients are reset (no kernel) before each call.

    Parameters
    ----------
    attention : callable
        ``attention(q, k, v) -> out`` on torch tensors in the layout ``layout`` gives; ``out`` has dout's.
    layout : callable
        torch tensor of a CuPy array's shape -> the view ``attention`` takes (no copy).
    inputs : tuple of cupy.ndarray
        q, k, v, dout.
    settings : Settings
        Warm-up, repeats, timing; ``backward`` says whether the backward is timed.

    Returns
    -------
    dict
        {"fwd": measurement} and, with ``settings.backward``, "bwd".
    """
    torch = peers.torch
    q, k, v, dout = inputs

    def make_forward():
        qt, kt, vt = (layout(torch.from_dlpack(x)) for x in (q, k, v))
        return lambda: attention(qt, kt, vt)

    def make_backward():
        leaves = [torch.from_dlpack(x).requires_grad_() for x in (q, k, v)]
        out = attention(*(layout(leaf) for leaf in leaves))
        dout_t = layout(torch.from_dlpack(dout))

        def backward():
            for leaf in leaves:
                leaf.grad = None
            out.backward(dout_t, retain_graph=True)

        return backward

    results = {"fwd": measure(make_forward, flops_fwd, settings, peers.clock)}
    if settings.backward:
        results["bwd"] = measure(make_backward, flops_bwd, settings, peers.clock)
    return results


def heads_second(tensor):
    """torch view (batch, heads, seqlen, headdim) of a (batch, seqlen, heads, headdim) tensor, as SDPA takes it."""
    return tensor.transpose(1, 2)


def time_sdpa(peers, system, inputs, causal, flops_fwd, flops_bwd, settings):
    """torch SDPA restricted to one backend (a key of :data:`TORCH_BACKENDS`), :func:`time_torch` on
    (batch, heads, seqlen, headdim) views; both directions ``skipped`` when this torch lacks the backend."""
    backend = peers.backends[system]
    if backend is None:
        reason = f"this torch has no SDPBackend.{TORCH_BACKENDS[system]}"
        return {key: skipped(reason) for key in (("fwd", "bwd") if settings.backward else ("fwd",))}
    with peers.sdpa_kernel([backend]):
        return time_torch(peers, lambda q, k, v: peers.sdpa(q, k, v, is_causal=causal), heads_second, inputs,
                          flops_fwd, flops_bwd, settings)


# ---------------------------------------------------------------------------------------------- records


def git_revision(path):
    """``git describe --always --dirty`` of the repository whose top level is ``path``, or None where git or
    .git is missing, or where ``path`` is only a folder inside another repository (a tree unpacked there)."""
    try:
        top = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             check=True)
        if Path(top.stdout.strip()).resolve() != Path(path).resolve():
            return None
        result = subprocess.run(["git", "-C", str(path), "describe", "--always", "--dirty"], capture_output=True,
                                text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return result.stdout.strip()


def environment(torch_description):
    """Date, device and versions (cupyflash's path and git revision too) for a results file."""
    import cupy

    import cupyflash

    device = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": props["name"].decode(),
        "compute_capability": f"{props['major']}.{props['minor']}",
        "device_memory_bytes": int(props["totalGlobalMem"]),
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
        "cupy": cupy.__version__,
        "numpy": numpy.__version__,
        "cupyflash": cupyflash.__version__,
        "cupyflash_path": str(Path(cupyflash.__file__).parent),
        "git": git_revision(Path(cupyflash.__file__).parent.parent),
        "torch": torch_description,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
    }


def write_json(path, document):
    """Write a results file (the scripts rewrite it after every row, so a cut-short run keeps what it measured)."""
    Path(path).write_text(json.dumps(document, indent=1) + "\n")


# -------------------------------------------------------------------------------------------- reporting


def si(value):
    """Compact count, e.g. 4.29G."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g}{suffix}"
    return str(value)


def tflops_of(results, system, direction):
    """TFLOP/s of one measurement of ``results[system][direction]``, or None when missing, skipped or failed."""
    return (results or {}).get(system, {}).get(direction, {}).get("tflops")


def rate_cell(entry):
    """Table cell of a measurement: TFLOP/s, ``n/a`` (raised or unsupported), ``skip`` (not attempted) or
    ``-`` (not run, None)."""
    if entry is None:
        return "-"
    if "tflops" in entry:
        return f"{entry['tflops']:.1f}"
    return "n/a" if "error" in entry or "cell" in entry else "skip"


def progress_text(direction, entry):
    """``fwd 1.234 ms 456.7 TF/s`` of a measurement, or its ``n/a`` / ``skip`` (or the note in its "cell")."""
    if "median_ms" in entry:
        return f"{direction} {entry['median_ms']:.3f} ms {entry['tflops']:.1f} TF/s"
    return f"{direction} {entry.get('cell') or ('n/a' if 'error' in entry else 'skip')}"


def note_lines(results, names):
    """Indented lines giving why each n/a or skip of ``results[system][direction]`` happened (an entry
    with a "cell" note says it in its cells instead); ``names``: system key -> printed name."""
    lines = []
    for system, by_direction in results.items():
        for direction, entry in by_direction.items():
            reason = entry.get("error") or (entry.get("skipped") if "cell" not in entry else None)
            if reason:
                lines.append(f"    {names[system]} {direction}: {reason[:ERROR_CHARS_PROGRESS]}")
    return lines


def grouped_table(groups, items, note=None):
    """Lines of a table whose columns come in labelled groups.

    Parameters
    ----------
    groups : sequence of (label, columns)
        ``columns``: (header, width, cell) each, ``cell(*item)`` giving the text; a negative width
        left-aligns.
    items : sequence of tuples
        One line each.
    note : callable or None
        ``note(label, *item)``: a text that replaces that group's cells on that line, or None.

    Returns
    -------
    list of str
        The group labels, the column headers, then one line per item.
    """

    def span(columns):
        return sum(abs(width) for _, width, _ in columns) + len(columns) - 1

    def fmt(text, width):
        return f"{text:<{-width}}" if width < 0 else f"{text:>{width}}"

    def group_text(label, columns, item):
        text = note(label, *item) if note is not None and item is not None else None
        if text is not None:
            return f"{text:<{span(columns)}}"
        texts = [header if item is None else cell(*item) for header, _, cell in columns]
        return " ".join(fmt(t, width) for t, (_, width, _) in zip(texts, columns))

    lines = [" | ".join(f"{label:^{span(columns)}}" for label, columns in groups).rstrip()]
    for item in [None, *items]:
        lines.append(" | ".join(group_text(label, columns, item) for label, columns in groups).rstrip())
    return lines


def text_table(headers, rows, widths):
    """Lines of a plain table: a header line, then one line per row; a negative width left-aligns."""

    def line(cells):
        return " ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, w in zip(cells, widths)).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is not importable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


# ---------------------------------------------------------------------------------------------- options


def add_timing_options(parser, repeats, warmup):
    """``--repeats``, ``--warmup`` and ``--per-call``, the timing options of the grid scripts."""
    parser.add_argument("--repeats", type=positive_int, default=repeats, help="timed calls (median)")
    parser.add_argument("--warmup", type=non_negative_int, default=warmup, help="untimed calls before timing")
    parser.add_argument("--per-call", action="store_true",
                        help="time each call alone, from a synchronize to the end of its work (host time included), "
                        "instead of CUDA events around calls enqueued back to back")


def positive_int(text):
    """An option value as an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text}")
    return value


def non_negative_int(text):
    """An option value as an int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text}")
    return value


def parse_list(text, convert, allowed=None):
    """A comma-separated option value, duplicates dropped; argparse.ArgumentTypeError names a bad item."""
    items = []
    for item in text.split(","):
        try:
            value = convert(item.strip())
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"bad item {item!r} in {text!r}") from None
        if allowed is not None and value not in allowed:
            raise argparse.ArgumentTypeError(f"{item!r} is not one of {', '.join(map(str, allowed))}")
        items.append(value)
    return tuple(dict.fromkeys(items))
