"""Input checks, run before anything is launched.

TypeError for wrong kinds and dtypes, ValueError for wrong shapes, values and devices; each message
names the argument, what was expected and what was received. The checks return a :class:`Problem`
that the NumPy and CUDA paths share.
"""

import dataclasses
import math
import numbers

import ml_dtypes
import numpy

#: Supported input dtypes by name; outputs keep the input dtype.
SUPPORTED_DTYPES = {
    "float16": numpy.dtype(numpy.float16),
    "bfloat16": numpy.dtype(ml_dtypes.bfloat16),
    "float32": numpy.dtype(numpy.float32),
    "float64": numpy.dtype(numpy.float64),
}
_SUPPORTED_TEXT = "float16, bfloat16, float32 or float64"

#: Query blocks * batch * heads (and key blocks * batch * kv heads) index one grid axis of 2^31 - 1 CTAs,
#: as do the rows of the delta preprocess, 4 per CTA.
_MAX_GRID_X = 2**31 - 1
_GRID_ROWS = 32
_DELTA_ROWS_PER_CTA = 4
#: Sequence lengths and head dims are 32-bit in the kernels, with room for a block past the end.
_MAX_SIZE = 2**31 - 1024
#: Largest finite float32.
_FLOAT32_MAX = float(numpy.finfo(numpy.float32).max)


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def acc_dtype(dtype):
    """Accumulator dtype for inputs of ``dtype``: float64 for float64, else float32."""
    return numpy.dtype(numpy.float64) if dtype == numpy.float64 else numpy.dtype(numpy.float32)


def lse_dtype(dtype):
    """dtype of the saved log-sum-exp: float64 for float32 and float64 inputs, float32 for 16-bit ones.

    The backward pass recomputes each probability as exp(s - lse); a float32 lse would add half an ulp
    of |lse| to every one of them, about 3x the error of a plain float32 softmax (see kernels_cu/dtypes.cuh).
    """
    return numpy.dtype(numpy.float64) if dtype.itemsize >= 4 else numpy.dtype(numpy.float32)


@dataclasses.dataclass(frozen=True)
class Problem:
    """Validated sizes and options of one attention call.

    Packed (varlen) problems have ``cu_seqlens_q``/``cu_seqlens_k`` arrays and ``total_q``/``total_k``
    rows; their ``batch`` is the number of sequences and ``seqlen_q``/``seqlen_k`` the longest ones.
    The mask is the window (``window_left``, ``window_right``; -1 unbounded, causal being right = 0),
    the block layout, and the score modifications ``softcap`` and ``alibi_slopes`` (kernels_cu/policy.cuh).
    """

    xp: object  # numpy or cupy
    dtype: numpy.dtype
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    heads_k: int
    headdim: int
    headdim_v: int
    causal: bool
    softmax_scale: float
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    alibi_slopes: object = None  # float32 (heads,) or (batch, heads), or None
    block_mask: object = None  # cupyflash.BlockMask or None
    cu_seqlens_q: object = None  # int32 (batch + 1,), or None for dense batches
    cu_seqlens_k: object = None
    total_q: int = 0
    total_k: int = 0

    @property
    def varlen(self):
        return self.cu_seqlens_q is not None

    @property
    def score_mod(self):
        """Scores are modified (softcap or ALiBi): the kernels built with the score modifications run."""
        return self.softcap != 0.0 or self.alibi_slopes is not None

    @property
    def out_shape(self):
        if self.varlen:
            return (self.total_q, self.heads, self.headdim_v)
        return (self.batch, self.seqlen_q, self.heads, self.headdim_v)

    @property
    def lse_shape(self):
        return (self.heads, self.total_q) if self.varlen else (self.batch, self.heads, self.seqlen_q)

    @property
    def is_empty(self):
        """Nothing to compute: some output is empty, or no row sees any key."""
        if self.varlen:
            return 0 in (self.batch, self.total_q, self.heads, self.total_k)
        return 0 in (self.batch, self.seqlen_q, self.heads, self.seqlen_k)


def _array_module(named):
    """numpy or cupy for the arrays in ``named`` (name -> array); TypeError for anything else or a mix."""
    cupy = _cupy()
    kinds = {}
    for name, array in named.items():
        if isinstance(array, numpy.ndarray):
            kinds[name] = numpy
        elif cupy is not None and isinstance(array, cupy.ndarray):
            kinds[name] = cupy
        else:
            raise TypeError(
                f"{name} must be a cupy.ndarray or numpy.ndarray, got {type(array).__module__}."
                f"{type(array).__qualname__}; wrap GPU arrays of other libraries with cupy.from_dlpack(x) "
                "(zero-copy) and host data with numpy.asarray(x)"
            )
    modules = set(kinds.values())
    if len(modules) > 1:
        listing = ", ".join(f"{n} is {'cupy' if m is not numpy else 'numpy'}" for n, m in kinds.items())
        raise TypeError(f"inputs must all be cupy arrays or all numpy arrays; got {listing}")
    return modules.pop()


def _check_dtypes(named, dtype_of="q"):
    reference = named[dtype_of].dtype
    if reference not in SUPPORTED_DTYPES.values():
        raise TypeError(f"{dtype_of} has dtype {reference}; expected {_SUPPORTED_TEXT}")
    for name, array in named.items():
        if array.dtype != reference:
            raise TypeError(f"{name} has dtype {array.dtype}, but {dtype_of} has dtype {reference}; they must match")
    return reference


def _check_rank(name, array, axes):
    if array.ndim != len(axes):
        raise ValueError(
            f"{name}: {array.ndim}-dimensional array given. Array must be {len(axes)}-dimensional "
            f"({', '.join(axes)})"
        )


def _check_devices(xp, named):
    if xp is numpy:
        return
    current = xp.cuda.Device().id
    for name, array in named.items():
        if array.device.id != current:
            raise ValueError(
                f"{name} is on GPU {array.device.id}, but the current device is GPU {current}; "
                f"run under `with cupy.cuda.Device({array.device.id}):` or move the array"
            )


def _check_flag(name, value):
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def _softmax_scale(value, headdim, dtype):
    if value is None:
        return 1.0 / math.sqrt(headdim)
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"softmax_scale must be a real number or None, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"softmax_scale must be finite, got {value}")
    # Below float64 the kernels hold the scale, and the tensor-core path scale * log2(e), in float32.
    if dtype != numpy.float64 and abs(value) * math.log2(math.e) > _FLOAT32_MAX:
        raise ValueError(
            f"softmax_scale {value} overflows float32 (|softmax_scale| * log2(e) must stay below "
            f"{_FLOAT32_MAX:.3e} for {dtype} inputs)"
        )
    return value


def forward_problem(q, k, v, causal, softmax_scale):
    """Check the inputs of a forward call and return its :class:`Problem`."""
    named = {"q": q, "k": k, "v": v}
    xp = _array_module(named)
    dtype = _check_dtypes(named)
    for name, array in named.items():
        _check_rank(name, array, ("batch", "seqlen", "heads", "headdim"))
    batch, seqlen_q, heads, headdim = q.shape
    _, seqlen_k, heads_k, _ = k.shape
    headdim_v = v.shape[3]
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q has {batch}, k has {k.shape[0]}, v has {v.shape[0]}")
    if v.shape[1] != seqlen_k:
        raise ValueError(f"k and v must have the same seqlen; got k {seqlen_k}, v {v.shape[1]}")
    if v.shape[2] != heads_k:
        raise ValueError(f"k and v must have the same number of heads; got k {heads_k}, v {v.shape[2]}")
    if k.shape[3] != headdim:
        raise ValueError(f"q and k must have the same headdim; got q {headdim}, k {k.shape[3]}")
    if headdim < 1 or headdim_v < 1:
        raise ValueError(f"headdim must be at least 1; got q/k headdim {headdim}, v headdim {headdim_v}")
    for name, size in (("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k), ("headdim", headdim), ("headdim_v", headdim_v)):
        if size > _MAX_SIZE:
            raise ValueError(f"{name} must be at most {_MAX_SIZE} (32-bit kernel indices), got {size}")
    if heads_k == 0 and heads > 0 or heads_k > 0 and heads % heads_k != 0:
        raise ValueError(
            f"the number of query heads must be a multiple of the number of kv heads; got q {heads} heads, "
            f"k/v {heads_k} heads"
        )
    blocks = max(
        -(-seqlen_q // _GRID_ROWS) * heads * batch,
        -(-seqlen_k // _GRID_ROWS) * heads_k * batch,
        -(-(batch * heads * seqlen_q) // _DELTA_ROWS_PER_CTA),
    )
    if blocks > _MAX_GRID_X:
        raise ValueError(
            f"problem too large for one launch: {blocks} blocks of rows over batch * heads; at most {_MAX_GRID_X}"
        )
    _check_devices(xp, named)
    return Problem(
        xp=xp,
        dtype=dtype,
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        heads=heads,
        heads_k=heads_k,
        headdim=headdim,
        headdim_v=headdim_v,
        causal=_check_flag("causal", causal),
        softmax_scale=_softmax_scale(softmax_scale, headdim, dtype),
        window_right=0 if causal else -1,
    )


def backward_problem(dout, q, k, v, out, lse, causal, softmax_scale):
    """Check the inputs of a backward call and return its :class:`Problem`."""
    named = {"dout": dout, "q": q, "k": k, "v": v, "out": out, "lse": lse}
    _array_module(named)
    problem = forward_problem(q, k, v, causal, softmax_scale)
    _check_dtypes({"q": q, "dout": dout, "out": out})
    for name, array in (("dout", dout), ("out", out)):
        _check_rank(name, array, ("batch", "seqlen_q", "heads", "headdim_v"))
        if array.shape != problem.out_shape:
            raise ValueError(
                f"{name} must have shape {problem.out_shape} (batch, seqlen_q, heads, headdim_v), "
                f"got {array.shape}"
            )
    _check_rank("lse", lse, ("batch", "heads", "seqlen_q"))
    if lse.shape != problem.lse_shape:
        raise ValueError(f"lse must have shape {problem.lse_shape} (batch, heads, seqlen_q), got {lse.shape}")
    if lse.dtype not in (numpy.float32, numpy.float64):
        raise TypeError(
            f"lse has dtype {lse.dtype}; expected float32 or float64 (flash_attention returns "
            f"{lse_dtype(problem.dtype)} for {problem.dtype} inputs)"
        )
    _check_devices(problem.xp, {"dout": dout, "out": out, "lse": lse})
    return problem
