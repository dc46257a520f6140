"""Kernels written in sessions without a GPU and not yet run on one: one switch per feature.

A switch that is off keeps CuPy calls away from its kernels: they raise NotImplementedError naming the
feature, or take the path that has run (the elementwise rotary kernels; sinks merged after the
attention kernel; a BlockMask's layout from CuPy's array operations). That is slower than the new
kernels but never silently wrong. The GPU tests of a feature turn its switch on for themselves
(``tests/helpers.py``, ``open_gates``); a switch is removed, with the checks that read it, once its
tests, memcheck and racecheck have passed on a GPU (bench/NOTES.md keeps the queued runs). Each switch is
a module attribute, read where the choice is made, so a call that does not use the feature pays nothing.
"""

#: return_max_score on CuPy arrays: every forward kernel's exact row maxima (FragmentSoftmax's kTop,
#: recorded by fragment/epilogue.cuh) and the decode kernel's.
MAX_SCORE = False

#: Sinks joined by the forward kernels themselves (their lse and out include the sink) and their gradient
#: from the per-row terms bwd_delta writes. Off: the host merges the sinks after the kernel
#: (_merge.add_sinks) and sums the gradient from dout and out.
SINKS = False

#: Plans for calls with sinks or the maximum score (_keys.with_extras; the sinks a plan's last input).
#: Such a call plans only where the switches of what it uses are on too.
EXTRAS_PLANS = False

#: Dropout in the general and Hopper kernels (kDropout) and cupyflash.dropout_mask drawn on the device.
DROPOUT = False

#: score_mod and from_mask_mod on CuPy arrays: every family's kernels built with a traced function, the
#: decode kernel's, the block classification kernel and the exact sums of the buffers' gradients.
FUNCTIONS = False

#: apply_rotary's fused kernel (kernels_cu/rotary.cu).
ROTARY = False

#: The Hopper FP8 forward (kernels_cu/sm90/fwd_kmajor*.cu[h] with e4m3 operands, kmajor_values.cu).
FP8 = False

#: The Hopper tf32 forward for precision="tf32" (the same kernel with tf32 operands; q, k and V^T rounded
#: by the pre-passes). Off: "tf32" runs the planes kernel (two bfloat16 parts a value).
TF32 = False

#: seqused_k on packed CuPy batches (kernels_cu/common/sequence.cuh clamps each sequence's keys).
SEQUSED_K = False

#: cache_leftpad on CuPy KV caches (the decode kernel's CacheEntry.first; the general kernels over the cache
#: shifted per entry).
LEFTPAD = False

#: A paged KV cache's prefill (more query rows than the decode kernel takes) on the Hopper 16-bit forward,
#: its producer reading each key tile from the pages (Sm90FwdMaps::block_table). Off: the decode kernel.
PAGED_PREFILL = False

#: Every switch, by name.
NAMES = ("MAX_SCORE", "SINKS", "EXTRAS_PLANS", "DROPOUT", "FUNCTIONS", "ROTARY", "FP8", "TF32", "SEQUSED_K", "LEFTPAD",
         "PAGED_PREFILL")


def open_all():
    """Every switch on: the device scripts that run the unverified kernels (sanitizers, benchmarks)."""
    for name in NAMES:
        globals()[name] = True
