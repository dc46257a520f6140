"""The general family: SIMT kernels for every dtype, head dim and GPU (the correctness baseline, and the
path of float32, float64, head dims above 256 and GPUs older than sm_80). kernels_cu/general/tile.cuh
describes the tiles; every kernel is deterministic."""

from .. import _kernels, _params
from .._problem import acc_dtype, lse_dtype
from . import common

#: Threads per CTA, score-tile rows (queries of the forward and dQ, keys of dK/dV) and columns, and
#: output columns per CTA (GeneralTraits).
THREADS = 128
BLOCK_M = 32
BLOCK_N = 32
CHUNK = 64
# The dQ and dK/dV kernels share one set of block-sparse lists: tiles of BLOCK_M rows by BLOCK_N columns
# serve both only because they are square.
assert BLOCK_M == BLOCK_N

FWD = _kernels.Kernel("general_fwd", "general/fwd.cu", _kernels.ALL_DTYPES, flags=("dropout",), user_functions=True)
DQ = _kernels.Kernel("general_bwd_dq", "general/bwd.cu", _kernels.ALL_DTYPES, flags=("dropout",), user_functions=True)
DKDV = _kernels.Kernel("general_bwd_dkdv", "general/bwd.cu", _kernels.ALL_DTYPES, flags=("dropout",),
                       user_functions=True)

def cxx_facts():
    """The family's constants as the kernels state them: (headers, {C++ expression: value}) for
    tests/test_compile.py."""
    facts = {}
    for ctype in ("__half", "float", "double"):
        traits = f"cupyflash::GeneralTraits<{ctype}>"
        facts.update({f"{traits}::kThreads": THREADS, f"{traits}::kBlockM": BLOCK_M, f"{traits}::kBlockN": BLOCK_N,
                      f"{traits}::kChunk": CHUNK})
    # The score and mask functions' argument block, which this family's kernels read.
    facts.update({"cupyflash::kMaxModBuffers": _params.MAX_BUFFERS, "cupyflash::kMaxModRank": _params.MAX_RANK})
    facts.update({f"cupyflash::exact_sum_slots<{ctype}>()": common.EXACT_SUM_SLOTS[name]
                  for name, ctype in (("float32", "float"), ("float64", "double"))})
    return ("general/tile.cuh", "common/user_mod.cuh", "common/exact_sum.cuh"), facts


class GeneralForward:
    """Supports every problem on every device."""

    name = "general"
    kernels = (FWD,)
    user_functions = True

    def select(self, p, device, operands):
        if p.dtype.itemsize == 1:  # FP8: the Hopper kernel's alone
            return None
        # 16-bit inputs take the fast forms, as their tensor-core kernels do (one call's forward and
        # backward may run on different families).
        return FWD.variant(common.dtype_name(p.dtype), dropout=p.dropout,
                           user=common.user_code(p, fast=p.dtype.itemsize == 2))

    def plan(self, b, variant, p, q, k, v, device):
        out, lse = b.output(p.out_shape, p.dtype), b.output(p.lse_shape, lse_dtype(p.dtype))
        args = common.fwd_args(b, p, q, k, v, out, lse, common.sparse_lists(b, p, BLOCK_M, BLOCK_N))
        grid = (common.cdiv(p.seqlen_q, BLOCK_M) * p.batch * p.heads, common.cdiv(p.headdim_v, CHUNK), 1)
        b.launch(common.function(variant), grid, THREADS, (args,))
        return out, lse


class GeneralBackward:
    """Supports every problem on every device; deterministic in both modes (but for a score_mod's buffer
    gradients, added with atomics)."""

    name = "general"
    kernels = (common.DELTA, DQ, DKDV)
    user_functions = True

    def select(self, p, device, operands):
        return DQ.variant(common.dtype_name(p.dtype), dropout=p.dropout,
                          user=common.user_code(p, fast=p.dtype.itemsize == 2))

    def plan(self, b, variant, p, dout, q, k, v, out, lse, deterministic, device):
        dq, dk, dv = (b.output(x.shape, p.dtype) for x in (q, k, v))
        delta = b.workspace(p.lse_shape, acc_dtype(p.dtype))
        lists = common.sparse_lists(b, p, BLOCK_M, BLOCK_N)
        args = common.bwd_args(b, p, dout, q, k, v, out, lse, delta, dq, dk, dv, lists)
        common.plan_delta(b, p, args)
        dtype = common.dtype_name(p.dtype)
        grid_dq = (common.cdiv(p.seqlen_q, BLOCK_M) * p.batch * p.heads, common.cdiv(p.headdim, CHUNK), 1)
        b.launch(common.function(variant), grid_dq, THREADS, (args,))
        grid_dkdv = (common.cdiv(p.seqlen_k, BLOCK_M) * p.batch * p.heads_k,
                     common.cdiv(max(p.headdim, p.headdim_v), CHUNK), 1)
        b.launch(common.function(DKDV.variant(dtype, dropout=p.dropout, user=variant.user)), grid_dkdv, THREADS, (args,))
        return dq, dk, dv


FORWARD = GeneralForward()
BACKWARD = GeneralBackward()
