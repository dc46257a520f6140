"""The CUDA path of validated, non-empty problems: each call is a plan (cupyflash/_plan.py) of the first
kernel family that supports it (cupyflash/_families) on CuPy's current device, run on its current
stream. The public functions keep the plans they build (cupyflash/_api.py); the compute layer's other
callers (ring attention, the KV-cache paths) run one and drop it."""

import dataclasses

import cupy
import numpy

from . import _families, _fp8, _plan
from ._families import common, sm90
from ._problem import acc_dtype, lse_dtype


def launchable(p):
    """False only for a packed batch whose given max_seqlen is 0 while it has rows: no grid to launch, and
    the device check finds a sequence longer than its max, so every output becomes NaN."""
    return p.seqlen_q > 0 and p.seqlen_k > 0


def _problem_inputs(b, p, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, user_buffers=()):
    """The problem's own arrays as plan inputs (in this order, then the score_mod's buffers, then
    :func:`tail_inputs`: the sinks where the problem has them, FP8's three descales where its inputs are
    e4m3), and the problem with their slots."""
    slots = {name: b.input(*common.contiguous(x)) if x is not None else b.input(None)
             for name, x in (("alibi_slopes", alibi_slopes), ("cu_seqlens_q", cu_seqlens_q),
                             ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k))}
    if p.user_buffers is not None:
        slots["user_buffers"] = tuple(b.input(*common.contiguous(x)) for x in user_buffers)
    if p.sinks is not None:
        slots["sinks"] = b.input(*common.contiguous(p.sinks))
    if p.dtype == _fp8.E4M3:
        slots.update({name: b.input(*common.contiguous(getattr(p, name))) if getattr(p, name) is not None
                      else b.input(None) for name in _fp8.DESCALES})
    return dataclasses.replace(p, **slots)


def paged_in_place(p, q, k, v, block_table, max_score=False):
    """Packed problem ``p`` (flash_attention_varlen's block_table: _problem.paged_counts_on_device) with the
    page pools ``k`` and ``v`` read in place by the Hopper forward's paged producer (compute capability
    9.0, dispatch free to take the sm90 family), or None where that kernel does not take
    it (the caller gathers the pages). ``max_score``: the call returns the maximum score (its tile may
    differ)."""
    device = common.current_device()
    if (device.capability != sm90.CAPABILITY
            or sm90.FORWARD not in _families.forced(_families.FORWARD)):
        return None
    paged = dataclasses.replace(p, block_table=common.contiguous(block_table)[0], page_size=k.shape[1])
    probe = dataclasses.replace(paged, max_score=True) if max_score else paged
    return paged if sm90.FORWARD.select(probe, device, (q, k, v)) is not None else None


def tail_inputs(p):
    """A plan run's last problem inputs: the sinks where the problem has them, then for e4m3 inputs the
    three descales (None where not given)."""
    sinks = () if p.sinks is None else (p.sinks,)
    return sinks + (tuple(getattr(p, name) for name in _fp8.DESCALES) if p.dtype == _fp8.E4M3 else ())


def buffer_gradients(p):
    """Zeroed accumulators of the score_mod buffers' gradients (the accumulation dtype, None for int and
    bool buffers), which a backward plan's kernels add into."""
    dtype = acc_dtype(p.dtype)
    return tuple(cupy.zeros(x.shape, dtype) if x.dtype.kind == "f" else None for x in p.user_buffers or ())


def forward_plan(p, q, k, v, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, return_lse=True,
                 max_score=False, user_buffers=()):
    """The plan of the forward of problem ``p`` for operands as the call gives them (the plan converts
    what the kernels cannot read as it is, on every run). Its run takes ``(q, k, v, alibi_slopes,
    cu_seqlens_q, cu_seqlens_k, seqused_k, *user_buffers)`` (the score_mod's buffers) and returns
    ``(out, lse)``, or ``(out,)`` without ``return_lse`` (the kernels still write lse, into the
    workspace); with ``max_score``, then the float32 (batch, heads) maxima (the forward raises their
    images in a workspace zeroed each run, then common.plan_max_score_decode). A problem with sinks takes
    them after the buffers."""
    device = common.current_device()
    b = _plan.PlanBuilder()
    operands = tuple(b.input(*common.readable(x)) for x in (q, k, v))
    ps = _problem_inputs(b, p, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, user_buffers)
    images = top = None
    if max_score:
        images = b.workspace((p.batch, p.heads), numpy.uint32, zeroed=True)
        top = b.output((p.batch, p.heads), numpy.float32)
        ps = dataclasses.replace(ps, max_score=images)
    if launchable(p):
        family, variant = _families.select(_families.FORWARD, ps, device, operands)
        out, lse = family.plan(b, variant, ps, *operands, device)
    else:
        out, lse = b.output(p.out_shape, p.dtype), b.output(p.lse_shape, lse_dtype(p.dtype))
    if max_score:
        common.plan_max_score_decode(b, images, top)
    common.plan_varlen_check(b, ps, *operands, out, lse, *((top,) if max_score else ()))
    return b.build(((out, lse) if return_lse else (out,)) + ((top,) if max_score else ()))


def backward_plan(p, dout, q, k, v, out, lse, deterministic, alibi_slopes=None, cu_seqlens_q=None,
                  cu_seqlens_k=None, user_buffers=(), user_grads=()):
    """The plan of the backward of problem ``p`` (see :func:`forward_plan`). Its run takes ``(dout, q, k,
    v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, None, *user_buffers, *sinks, *user_grads)`` (the
    score_mod's buffers, the sinks where the problem has them, then the buffers' zeroed gradient
    accumulators of :func:`buffer_gradients`, which it
    adds into, or with ``deterministic`` writes from exact sums) and returns ``(dq, dk, dv)``, then with
    sinks their gradient's per-row terms, which bwd_delta writes
    (_merge.sink_gradient_from_terms sums them); lse may be float32 or float64 (the plan converts it to the
    precision of the forward's)."""
    device = common.current_device()
    b = _plan.PlanBuilder()
    operands = tuple(b.input(*common.readable(x)) for x in (dout, q, k, v, out))
    dtype = lse_dtype(p.dtype)
    if lse.dtype == dtype and lse.flags.c_contiguous:
        lse_slot = b.input(lse)
    else:
        lse_slot = b.input(cupy.ascontiguousarray(lse.astype(dtype)), lambda x: cupy.ascontiguousarray(x.astype(dtype)))
    ps = _problem_inputs(b, p, alibi_slopes, cu_seqlens_q, cu_seqlens_k, None, user_buffers)
    grad_slots = words = ()
    if p.user_buffers is not None:
        grad_slots = tuple(b.input(g) for g in user_grads)
        if deterministic and p.user_score.buffer_gradients:
            # Exact sums (kernels_cu/common/exact_sum.cuh), whose adds commute, then their values.
            slots = common.EXACT_SUM_SLOTS[acc_dtype(p.dtype).name]
            words = tuple(None if g is None else b.workspace((g.size * slots,), numpy.int64, zeroed=True)
                          for g in grad_slots)
            ps = dataclasses.replace(ps, user_grads=words, user_grads_exact=True)
        else:
            ps = dataclasses.replace(ps, user_grads=grad_slots)
    dout_s, q_s, k_s, v_s, out_s = operands
    terms = None
    if p.sinks is not None and launchable(p):
        terms = b.output(p.lse_shape, dtype)
        ps = dataclasses.replace(ps, sink_terms=terms)
    if launchable(p):
        family, variant = _families.select(_families.BACKWARD, ps, device, (q_s, k_s, v_s, dout_s))
        grads = family.plan(b, variant, ps, dout_s, q_s, k_s, v_s, out_s, lse_slot, deterministic, device)
        for sums, grad in zip(words, grad_slots):
            if sums is not None:
                common.plan_finish_exact(b, sums, grad)
    else:
        grads = tuple(b.output(x.shape, p.dtype) for x in (q_s, k_s, v_s))
    common.plan_varlen_check(b, ps, q_s, k_s, v_s, *grads)
    return b.build(tuple(grads) + ((terms,) if terms is not None else ()))


def forward(p, q, k, v, max_score=False):
    """``(out, lse)`` of a validated, non-empty problem whose arrays are its own, and with ``max_score`` the
    largest score of each (batch entry, head), float32."""
    buffers = p.user_buffers or ()
    plan = forward_plan(p, q, k, v, p.alibi_slopes, p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, max_score=max_score,
                        user_buffers=buffers)
    return plan(q, k, v, p.alibi_slopes, p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, *buffers, *tail_inputs(p))


def backward(p, dout, q, k, v, out, lse, deterministic):
    """``((dq, dk, dv), sink_terms, buffer_grads)`` of a validated, non-empty problem: the sinks' per-row
    gradient terms where bwd_delta wrote them (:func:`backward_plan`), else None; with score_mod buffers
    the list of their gradients in the accumulation dtype (None for int and bool buffers), else None."""
    buffers, grads = p.user_buffers or (), buffer_gradients(p)
    plan = backward_plan(p, dout, q, k, v, out, lse, deterministic, p.alibi_slopes, p.cu_seqlens_q, p.cu_seqlens_k,
                         buffers, grads)
    results = tuple(plan(dout, q, k, v, out, lse, p.alibi_slopes, p.cu_seqlens_q, p.cu_seqlens_k, None, *buffers,
                         *tail_inputs(p), *grads))
    return results[:3], results[3] if len(results) > 3 else None, list(grads) if p.user_buffers is not None else None
