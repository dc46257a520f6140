"""The problem of a call: its checks, run once at the public boundary before anything is launched, and
the :class:`Problem` they return, which the compute layer (cupyflash/_compute.py) and everything under
it take as valid.

TypeError for wrong kinds and dtypes, ValueError for wrong shapes, values and devices; each message
names the argument, what was expected and what was received. :func:`arrays` normalizes the array
arguments (big-endian NumPy arrays are converted, masked arrays refused). The check_* functions are the
checks of single arguments, for the other entry points (KV caches, rings, merges).
"""

import dataclasses
import math
import numbers

import ml_dtypes
import numpy

from . import _fp8

#: The input dtypes every function takes, by name; outputs keep the input dtype. (The forwards also take
#: float8_e4m3fn, whose outputs are bfloat16 or float16: _fp8.)
SUPPORTED_DTYPES = {
    "float16": numpy.dtype(numpy.float16),
    "bfloat16": numpy.dtype(ml_dtypes.bfloat16),
    "float32": numpy.dtype(numpy.float32),
    "float64": numpy.dtype(numpy.float64),
}
_SUPPORTED_TEXT = "float16, bfloat16, float32 or float64"
#: Dtypes whose non-native (big-endian) NumPy arrays are converted once (arrays): the inputs' and int32.
_NATIVE_CONVERTED = tuple(SUPPORTED_DTYPES.values()) + (numpy.dtype(numpy.int32),)

#: Query tiles * batch * heads (and key tiles * batch * kv heads) index one grid axis of 2^31 - 1 CTAs.
#: GRID_TILE_ROWS is the fewest rows (or keys) a CTA of any kernel takes: the general family's tiles
#: (tests/test_compile.py checks it against every family's).
_MAX_GRID_X = 2**31 - 1
GRID_TILE_ROWS = 32
#: Sequence lengths and head dims are 32-bit in the kernels, with room for a block past the end.
_MAX_SIZE = 2**31 - 1024
#: Largest finite float32, and the smallest normal one.
_FLOAT32_MAX = float(numpy.finfo(numpy.float32).max)
_FLOAT32_TINY = float(numpy.finfo(numpy.float32).tiny)


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
    the block layout, and the score modifications ``softcap`` and ``alibi_slopes`` (kernels_cu/common/mask.cuh, score_mod.cuh).
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
    check_on_device: bool = False  # cu_seqlens was not checked on the host (see varlen_forward_problem)
    precision: str = "highest"  # PRECISIONS; "tf32" only for float32
    seqused_k: object = None  # int32 (batch,) keys each entry or packed sequence uses (its first ones), or None
    # A KV cache's prefill on the Hopper forward (cupyflash/_kvcache/device.py): k and v are page pools
    # (pages, page_size, heads_k, dim) and block_table, int32 (batch, seqlen_k // page_size), names each
    # entry's pages; a constant of the one-shot plan that reads it (never a cached plan). Else None.
    block_table: object = None
    page_size: int = 0
    sinks: object = None  # float32 (heads,) of q's kind: a logit in every softmax denominator, or None
    out_dtype: object = None  # float8_e4m3fn inputs: the outputs' dtype (bfloat16 or float16); else None (dtype)
    q_descale: object = None  # float8_e4m3fn inputs: float32 (batch, heads_k) or (batch, heads) real / stored, or None
    k_descale: object = None  # float32 (batch, heads_k), or None (1)
    v_descale: object = None
    dropout_p: float = 0.0  # probabilities dropped with this chance (cupyflash/_dropout.py), 0 for none
    dropout_seed: int = 0
    dropout_offset: int = 0
    batch_start: int = 0  # dropout's batch index of this problem's first entry (a packed sequence's index)
    max_score: object = None  # CUDA plans: the slot of the maximum score's (batch, heads) images, or None
    sink_terms: object = None  # CUDA backward plans: the slot of the sinks' per-row gradient terms (lse's shape), or None
    user_score: object = None  # a traced score_mod (cupyflash/_trace.py's Traced), or None
    user_buffers: object = None  # its buffers (a tuple of arrays of q's kind) when given, else None
    user_grads: object = None  # CUDA backward plans: the slots of the buffers' gradient accumulators (None each for
                               # int and bool buffers), or None
    user_grads_exact: bool = False  # user_grads are exact sums (kernels_cu/common/exact_sum.cuh): deterministic
    # Whether the forward's lse leaves the call (returned, or read by the backward of a vjp or ring): then
    # its scores must be those the backward recomputes, which the tf32 kernel's are not (sm90.FORWARD).
    lse_returned: bool = True

    @property
    def varlen(self):
        return self.cu_seqlens_q is not None

    @property
    def query_rows(self):
        """Query rows over the batch: batch * seqlen_q, or total_q for packed batches."""
        return self.total_q if self.varlen else self.batch * self.seqlen_q

    @property
    def user_mask(self):
        """The block mask's traced mask_mod (BlockMask.from_mask_mod), or None."""
        return None if self.block_mask is None or self.block_mask.mask_mod is None else self.block_mask.mask_mod[0]

    @property
    def score_mod(self):
        """Scores are modified (softcap or ALiBi): the kernels built with the score modifications run."""
        return self.softcap != 0.0 or self.alibi_slopes is not None

    @property
    def dropout(self):
        return self.dropout_p != 0.0

    @property
    def output_dtype(self):
        """The dtype of out: the inputs', or out_dtype for float8_e4m3fn inputs."""
        return self.dtype if self.out_dtype is None else self.out_dtype

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


def array_module(named):
    """numpy or cupy for the arrays in ``named`` (name -> array); TypeError for anything else or a mix."""
    cupy = _cupy()
    kinds = {}
    for name, array in named.items():
        if isinstance(array, numpy.ma.MaskedArray):
            raise TypeError(
                f"{name} is a numpy.ma.MaskedArray; its mask would be ignored. Pass {name}.filled(value), or "
                "express the mask with window_size, causal or block_mask"
            )
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


def native(x):
    """x in native byte order: a big-endian (non-native) NumPy array converted once, else x itself."""
    if isinstance(x, numpy.ndarray) and not x.dtype.isnative:
        return x.astype(x.dtype.newbyteorder("="))
    return x


def arrays(written=(), **named):
    """The array arguments, checked to be all NumPy or all CuPy arrays, in native byte order.

    A big-endian (non-native) NumPy array of a supported dtype (or int32, as index arrays) is converted
    once: the arithmetic runs on native values either way, and the results come back in the native
    dtype. The arguments named in ``written`` are written in place, so a converted copy would take the
    writes instead of the caller's array: those must be in native byte order already (ValueError).
    Returns the arrays in the order given.
    """
    xp = array_module(named)
    out = []
    for name, array in named.items():
        if xp is numpy and not array.dtype.isnative and array.dtype.newbyteorder("=") in _NATIVE_CONVERTED:
            if name in written:
                raise ValueError(
                    f"{name} has dtype {array.dtype.str} (non-native byte order), but it is written in place, "
                    f"which needs native byte order; convert it first: "
                    f"{name} = {name}.astype({name}.dtype.newbyteorder('='))")
            array = native(array)
        out.append(array)
    return out


def check_dtypes(named, dtype_of="q", fp8=False):
    """The arrays' one dtype, of SUPPORTED_DTYPES (or float8_e4m3fn with ``fp8``: the forwards)."""
    reference = named[dtype_of].dtype
    if reference == _fp8.E4M3 and not fp8:
        raise TypeError(f"{dtype_of} has dtype float8_e4m3fn, which the forwards take (flash_attention, "
                        f"flash_attention_varlen, flash_attention_with_kvcache); here expected {_SUPPORTED_TEXT}")
    if reference not in SUPPORTED_DTYPES.values() and not (fp8 and reference == _fp8.E4M3):
        raise TypeError(f"{dtype_of} has dtype {reference}; expected {_SUPPORTED_TEXT}"
                        + (" or float8_e4m3fn" if fp8 else ""))
    for name, array in named.items():
        if array.dtype != reference:
            raise TypeError(f"{name} has dtype {array.dtype}, but {dtype_of} has dtype {reference}; they must match")
    return reference


def check_rank(name, array, axes):
    if array.ndim != len(axes):
        raise ValueError(
            f"{name}: {array.ndim}-dimensional array given. Array must be {len(axes)}-dimensional "
            f"({', '.join(axes)})"
        )


def check_devices(xp, named):
    if xp is numpy:
        return
    current = xp.cuda.Device().id
    for name, array in named.items():
        if array.device.id != current:
            raise ValueError(
                f"{name} is on GPU {array.device.id}, but the current device is GPU {current}; "
                f"run under `with cupy.cuda.Device({array.device.id}):` or move the array"
            )


def is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, numpy.bool_))


def check_flag(name, value):
    """A bool argument (TypeError for anything else, ints included)."""
    if not isinstance(value, (bool, numpy.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)



#: precision= values: "highest" (float32 accuracy, every dtype's default) and "tf32" (float32 inputs only:
#: at least TF32's accuracy, for the kernels that have a faster form at it).
PRECISIONS = ("highest", "tf32")


def check_precision(value, dtype):
    if not isinstance(value, str):
        raise TypeError(f"precision must be one of {PRECISIONS}, got {type(value).__name__} {value!r}")
    if value not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {value!r}")
    if value != "highest" and dtype != numpy.float32:
        raise ValueError(f"precision={value!r} applies to float32 inputs; {dtype} inputs take only 'highest' "
                         "(only float32 has a faster form at TF32's accuracy)")
    return value


def real_value(name, value):
    """float(value) of a real argument already checked to be a number: an int past float64's range is a
    ValueError here, where float() would raise OverflowError."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be finite, got an int of {int(value).bit_length()} bits, past float64's "
                         "range") from None


def check_softmax_scale(value, headdim, dtype):
    if value is None:
        return 1.0 / math.sqrt(headdim)
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"softmax_scale must be a real number or None, got {type(value).__name__} {value!r}")
    value = real_value("softmax_scale", value)
    if not math.isfinite(value):
        raise ValueError(f"softmax_scale must be finite, got {value}")
    # Below float64 the kernels hold the scale, and the tensor-core path scale * log2(e), in float32.
    if dtype != numpy.float64 and abs(value) * math.log2(math.e) > _FLOAT32_MAX:
        raise ValueError(
            f"softmax_scale {value} overflows float32 (|softmax_scale| * log2(e) must stay below "
            f"{_FLOAT32_MAX:.3e} for {dtype} inputs)"
        )
    return value


def check_window(window_size, causal):
    """(left, right) with -1 for an unbounded side; causal caps right at 0."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right) of ints, got {window_size!r}")
    left, right = window_size
    for name, value in (("left", left), ("right", right)):
        if not is_int(value):
            raise TypeError(f"window_size {name} must be an int, got {type(value).__name__} {value!r}")
        if value < -1:
            raise ValueError(f"window_size {name} must be -1 (unbounded) or at least 0, got {value}")
    # Past the longest possible sequence a bound excludes nothing; the kernels hold it in 32 bits.
    left, right = (min(int(x), _MAX_SIZE) for x in (left, right))
    return left, 0 if causal else right


def check_softcap(value, dtype, softmax_scale):
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"softcap must be a real number, got {type(value).__name__} {value!r}")
    value = real_value("softcap", value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"softcap must be 0 (none) or a positive finite number, got {value}")
    # Below float64 the kernels hold softcap * log2(e) and softmax_scale / softcap in float32.
    if value and dtype != numpy.float64:
        if not _FLOAT32_TINY <= value <= _FLOAT32_MAX / math.log2(math.e):
            raise ValueError(
                f"softcap {value} is outside the float32 range the kernels use for {dtype} inputs "
                f"([{_FLOAT32_TINY:.3e}, {_FLOAT32_MAX / math.log2(math.e):.3e}])"
            )
        if abs(softmax_scale) / value > _FLOAT32_MAX:
            raise ValueError(
                f"softmax_scale / softcap = {abs(softmax_scale) / value:.3e} overflows float32 for {dtype} inputs"
            )
    return value


def _float32_of_kind(name, x, xp):
    """A float32 array argument of q's kind ``xp`` (a big-endian NumPy one converted); TypeError otherwise."""
    kind = array_module({name: x})
    if kind is not xp:
        raise TypeError(
            f"{name} must be a {'cupy' if xp is not numpy else 'numpy'} array like q, got a "
            f"{'cupy' if kind is not numpy else 'numpy'} array"
        )
    x = native(x)
    if x.dtype != numpy.float32:
        raise TypeError(f"{name} has dtype {x.dtype}; expected float32")
    return x


def check_alibi_slopes(slopes, xp, batch, heads):
    if slopes is None:
        return None
    slopes = _float32_of_kind("alibi_slopes", slopes, xp)
    if slopes.shape not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes must have shape ({heads},) or ({batch}, {heads}) (batch, heads), got {slopes.shape}")
    # Host values are free to check; CuPy slopes are not (it would synchronize): there a NaN or an inf
    # makes the rows of its head that see a key NaN.
    if xp is numpy and not numpy.isfinite(slopes).all():
        bad = numpy.argwhere(~numpy.isfinite(slopes))
        raise ValueError(f"alibi_slopes must be finite; got {slopes[tuple(bad[0])]} at index {tuple(int(i) for i in bad[0])} "
                         f"({len(bad)} non-finite of {slopes.size})")
    check_devices(xp, {"alibi_slopes": slopes})
    return xp.ascontiguousarray(slopes)


def check_sinks(sinks, xp, heads):
    """Attention sinks: float32 (heads,) of q's kind. NumPy sinks may not be NaN or +inf (-inf is no sink);
    CuPy sinks are not read (it would synchronize)."""
    if sinks is None:
        return None
    sinks = _float32_of_kind("sinks", sinks, xp)
    if sinks.shape != (heads,):
        raise ValueError(f"sinks must have shape ({heads},) (one logit per query head), got {sinks.shape}")
    if xp is numpy and (numpy.isnan(sinks) | (sinks == numpy.inf)).any():
        bad = int(numpy.flatnonzero(numpy.isnan(sinks) | (sinks == numpy.inf))[0])
        raise ValueError(f"sinks must be finite or -inf (no sink); got {sinks[bad]} at index {bad}")
    check_devices(xp, {"sinks": sinks})
    return xp.ascontiguousarray(sinks)


#: The FP8 input dtype (ml_dtypes.float8_e4m3fn).
FP8_DTYPE = _fp8.E4M3
#: The outputs' dtypes of float8_e4m3fn inputs (bfloat16 the default), by name.
FP8_OUT_DTYPES = {"bfloat16": numpy.dtype(ml_dtypes.bfloat16), "float16": numpy.dtype(numpy.float16)}


def check_fp8(dtype, xp, batch, heads, heads_k, q_descale, k_descale, v_descale, out_dtype):
    """The Problem fields of FP8 inputs: out_dtype and the descales (float32 arrays of q's kind, (batch,
    heads_k), q's also (batch, heads); None means 1; NumPy ones positive and finite, CuPy ones not read:
    on the GPU one that is not makes its head's rows NaN). Other dtypes take none of them."""
    named = (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale), ("out_dtype", out_dtype))
    if dtype != _fp8.E4M3:
        given = [name for name, x in named if x is not None]
        if given:
            raise ValueError(f"{given[0]} applies to float8_e4m3fn inputs; q has dtype {dtype}")
        return {}
    try:
        out = FP8_OUT_DTYPES["bfloat16"] if out_dtype is None else numpy.dtype(out_dtype)
    except TypeError:
        raise TypeError(f"out_dtype must be a dtype (bfloat16 or float16), got {out_dtype!r}") from None
    if out not in FP8_OUT_DTYPES.values():
        raise ValueError(f"out_dtype must be bfloat16 or float16 for float8_e4m3fn inputs, got {out}")
    fields = {"out_dtype": out}
    for name, x in named[:3]:
        if x is None:
            fields[name] = None
            continue
        x = _float32_of_kind(name, x, xp)
        shapes = ((batch, heads_k), (batch, heads)) if name == "q_descale" else ((batch, heads_k),)
        if x.shape not in shapes:
            expected = " or ".join(str(s) for s in dict.fromkeys(shapes))
            raise ValueError(f"{name} must have shape {expected} (batch, heads{'_k' if len(shapes) == 1 else ''}), "
                             f"got {x.shape}")
        if xp is numpy and not (numpy.isfinite(x) & (x > 0)).all():
            bad = numpy.argwhere(~(numpy.isfinite(x) & (x > 0)))[0]
            raise ValueError(f"{name} must be positive and finite; got {x[tuple(bad)]} at index "
                             f"{tuple(int(i) for i in bad)}")
        check_devices(xp, {name: x})
        fields[name] = xp.ascontiguousarray(x)
    return fields


def check_fp8_on_the_gpu(p, operands):
    """CuPy FP8 problems run on the Hopper FP8 kernel (kernels_cu/sm90/fwd_kmajor_mainloop.cuh):
    NotImplementedError naming what it does not take."""
    from ._families import common, sm90

    missing = sm90.kmajor_missing(p, common.current_device().capability, operands)
    if missing:
        raise NotImplementedError(f"the FP8 kernel does not take {missing[0]} yet (README, 'FP8 inputs')")


#: Elements of one score or mask function buffer: the kernels index them in 32 bits.
_MAX_BUFFER_SIZE = 2**31 - 1


def check_buffers(name, buffers, xp):
    """Buffers of a score or mask function: a tuple or list of arrays of q's kind, of the dtypes
    ``_trace.BUFFER_KINDS`` names, rank at most ``_trace.MAX_RANK`` and fewer than 2**31 elements;
    returned C-contiguous (and native-endian)."""
    from . import _trace

    if not isinstance(buffers, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of arrays, got {type(buffers).__module__}.{type(buffers).__qualname__}")
    if len(buffers) > _trace.MAX_BUFFERS:
        raise ValueError(f"{name} holds at most {_trace.MAX_BUFFERS} arrays, got {len(buffers)}")
    checked = []
    for n, x in enumerate(buffers):
        label = f"{name}[{n}]"
        kind = array_module({label: x})
        if kind is not xp:
            raise TypeError(f"{label} must be a {'cupy' if xp is not numpy else 'numpy'} array like q, got a "
                            f"{'cupy' if kind is not numpy else 'numpy'} array")
        x = native(x)
        if x.dtype not in _trace.BUFFER_KINDS:
            raise TypeError(f"{label} has dtype {x.dtype}; expected float32, float64, int32 or bool")
        if x.ndim > _trace.MAX_RANK:
            raise ValueError(f"{label} has rank {x.ndim}; at most {_trace.MAX_RANK} axes")
        if x.size > _MAX_BUFFER_SIZE:
            raise ValueError(f"{label} has {x.size} elements; at most {_MAX_BUFFER_SIZE} (2**31 - 1)")
        check_devices(xp, {label: x})
        checked.append(xp.ascontiguousarray(x))
    return tuple(checked)


def check_score_mod(score_mod, buffers, xp, softcap, alibi_slopes):
    """score_mod and score_mod_buffers: returns (traced function or None, buffers tuple or None)."""
    if score_mod is None:
        if buffers is not None:
            raise ValueError("score_mod_buffers was given without a score_mod")
        return None, None
    if softcap != 0.0 or alibi_slopes is not None:
        raise ValueError("score_mod cannot be combined with softcap or alibi_slopes: write them in the score_mod "
                         "(README, 'Score and mask functions')")
    from . import _trace

    checked = check_buffers("score_mod_buffers", () if buffers is None else buffers, xp)
    traced = _trace.trace(score_mod, "score", [(x.dtype, x.ndim) for x in checked])
    return traced, (None if buffers is None else checked)


def check_dropout(dropout_p, dropout_seed, dropout_offset):
    """(p, seed, offset) of dropout: p a real, 0 or in [1/512, 511/512) (cupyflash/_dropout.py: the rates
    8-bit decisions draw); with p > 0 a seed, an int in [0, 2^64); the offset an int in [0, 2^32). The
    seed is not needed (and may be None) without dropout."""
    from ._dropout import MAX_OFFSET, MAX_SEED, threshold

    if isinstance(dropout_p, (bool, numpy.bool_)) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a real number, got {type(dropout_p).__name__} {dropout_p!r}")
    p = real_value("dropout_p", dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    threshold(p)  # raises where no 8-bit decision draws p
    if not is_int(dropout_offset):
        raise TypeError(f"dropout_offset must be an int, got {type(dropout_offset).__name__} {dropout_offset!r}")
    if not 0 <= dropout_offset <= MAX_OFFSET:
        raise ValueError(f"dropout_offset must be in [0, 2**32), got {dropout_offset}")
    if dropout_seed is None:
        if p > 0:
            raise ValueError("dropout_p > 0 needs dropout_seed (an int in [0, 2**64)); the same seed and "
                             "dropout_offset make the backward drop the same probabilities")
        return p, 0, int(dropout_offset)
    if not is_int(dropout_seed):
        raise TypeError(f"dropout_seed must be an int or None, got {type(dropout_seed).__name__} {dropout_seed!r}")
    if not 0 <= dropout_seed <= MAX_SEED:
        raise ValueError(f"dropout_seed must be in [0, 2**64), got {dropout_seed}")
    return p, int(dropout_seed), int(dropout_offset)


def check_block_mask(mask, batch, heads, seqlen_q, seqlen_k):
    if mask is None:
        return None
    from ._block_mask import BlockMask

    if not isinstance(mask, BlockMask):
        raise TypeError(
            f"block_mask must be a cupyflash.BlockMask (see BlockMask.from_dense), got {type(mask).__module__}."
            f"{type(mask).__qualname__}"
        )
    if mask.mask_mod is not None and mask.mask_mod[3] != (seqlen_q, seqlen_k):
        raise ValueError(f"block_mask was built by from_mask_mod for (seqlen_q, seqlen_k) = {mask.mask_mod[3]}, "
                         f"got {(seqlen_q, seqlen_k)}")
    block_q, block_k = mask.block_size
    expected = (-(-seqlen_q // block_q), -(-seqlen_k // block_k))
    b, h, rows, cols = mask.shape
    if (rows, cols) != expected or b not in (1, batch) or h not in (1, heads):
        raise ValueError(
            f"block_mask has layout shape {mask.shape} for blocks {mask.block_size}; expected (1 or {batch}, "
            f"1 or {heads}, {expected[0]}, {expected[1]}) for seqlen_q {seqlen_q}, seqlen_k {seqlen_k}"
        )
    # A layout of one batch entry (head) serves every entry (head) only if the calls never evaluate a
    # function that reads b (h): the blocks were classified at b = 0 (h = 0), while partial blocks
    # evaluate it at the real ones.
    if mask.mask_mod is not None and (b < batch or h < heads):
        for what, name, size, wanted in (("batch", "b", b, batch), ("heads", "h", h, heads)):
            if size == 1 < wanted and mask.mask_mod[0].reads(name) and mask._has_partial_blocks():
                raise ValueError(f"block_mask was built by from_mask_mod with {what}=1, but its mask_mod reads {name} "
                                 f"and its partial blocks evaluate it at each {name}, so it serves only calls of "
                                 f"{what} 1; got {what} {wanted} (build it with {what}={wanted})")
    return mask


def check_heads(heads, heads_k):
    if heads_k == 0 and heads > 0 or heads_k > 0 and heads % heads_k != 0:
        raise ValueError(
            f"the number of query heads must be a multiple of the number of kv heads; got q {heads} heads, "
            f"k/v {heads_k} heads"
        )


def check_sizes(sizes):
    for name, size in sizes:
        if size > _MAX_SIZE:
            raise ValueError(f"{name} must be at most {_MAX_SIZE} (32-bit kernel indices), got {size}")


def check_grid(batch, seqlen_q, seqlen_k, heads, heads_k):
    blocks = max(-(-seqlen_q // GRID_TILE_ROWS) * heads * batch, -(-seqlen_k // GRID_TILE_ROWS) * heads_k * batch)
    if blocks > _MAX_GRID_X:
        raise ValueError(
            f"problem too large for one launch: {blocks} blocks of rows over batch * heads; at most {_MAX_GRID_X}"
        )


def _options(p, causal, window_size, softcap, alibi_slopes, block_mask, precision, sinks, dropout_p, dropout_seed,
             dropout_offset, score_mod=None, score_mod_buffers=None, operands=()):
    """Completes problem fields ``p`` (a dict) with the mask, the score modifications, the precision, the
    sinks and dropout."""
    p["precision"] = check_precision(precision, p["dtype"])
    p["sinks"] = check_sinks(sinks, p["xp"], p["heads"])
    p["dropout_p"], p["dropout_seed"], p["dropout_offset"] = check_dropout(dropout_p, dropout_seed, dropout_offset)
    if p["dtype"] == _fp8.E4M3 and p["dropout_p"]:
        raise ValueError("dropout is not offered with float8_e4m3fn inputs (FP8 has a forward and no backward, "
                         "and dropout is for training)")
    if p["dtype"] == _fp8.E4M3 and score_mod is not None:
        raise ValueError("score_mod is not offered with float8_e4m3fn inputs (write the score modification in "
                         "bfloat16 or float16)")
    p["window_left"], p["window_right"] = check_window(window_size, check_flag("causal", causal))
    p["softcap"] = check_softcap(softcap, p["dtype"], p["softmax_scale"])
    p["alibi_slopes"] = check_alibi_slopes(alibi_slopes, p["xp"], p["batch"], p["heads"])
    p["user_score"], p["user_buffers"] = check_score_mod(score_mod, score_mod_buffers, p["xp"], p["softcap"],
                                                         p["alibi_slopes"])
    if block_mask is not None:
        if p.get("cu_seqlens_q") is not None:
            raise TypeError("block_mask is not supported with packed (varlen) batches")
        p["block_mask"] = check_block_mask(block_mask, p["batch"], p["heads"], p["seqlen_q"], p["seqlen_k"])
    problem = Problem(**p)
    if problem.dtype == _fp8.E4M3 and problem.xp is not numpy:
        check_fp8_on_the_gpu(problem, operands)
    return problem


def _heads_and_dims(q, k, v):
    heads, headdim = q.shape[-2:]
    heads_k = k.shape[-2]
    headdim_v = v.shape[-1]
    if v.shape[-2] != heads_k:
        raise ValueError(f"k and v must have the same number of heads; got k {heads_k}, v {v.shape[-2]}")
    if k.shape[-1] != headdim:
        raise ValueError(f"q and k must have the same headdim; got q {headdim}, k {k.shape[-1]}")
    if headdim < 1 or headdim_v < 1:
        raise ValueError(f"headdim must be at least 1; got q/k headdim {headdim}, v headdim {headdim_v}")
    check_heads(heads, heads_k)
    return heads, heads_k, headdim, headdim_v


def forward_problem(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, block_mask=None, precision="highest", sinks=None, dropout_p=0.0,
                    dropout_seed=None, dropout_offset=0, score_mod=None, score_mod_buffers=None, q_descale=None,
                    k_descale=None, v_descale=None, out_dtype=None):
    """Check the inputs of a forward call (after :func:`arrays`) and return its :class:`Problem`."""
    named = {"q": q, "k": k, "v": v}
    xp = array_module(named)
    dtype = check_dtypes(named, fp8=True)
    for name, array in named.items():
        check_rank(name, array, ("batch", "seqlen", "heads", "headdim"))
    batch, seqlen_q = q.shape[:2]
    seqlen_k = k.shape[1]
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"batch sizes differ: q has {batch}, k has {k.shape[0]}, v has {v.shape[0]}")
    if v.shape[1] != seqlen_k:
        raise ValueError(f"k and v must have the same seqlen; got k {seqlen_k}, v {v.shape[1]}")
    heads, heads_k, headdim, headdim_v = _heads_and_dims(q, k, v)
    check_sizes((("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k), ("headdim", headdim), ("headdim_v", headdim_v)))
    check_grid(batch, seqlen_q, seqlen_k, heads, heads_k)
    check_devices(xp, named)
    p = {"xp": xp, "dtype": dtype, "batch": batch, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "heads": heads, "heads_k": heads_k,
         "headdim": headdim, "headdim_v": headdim_v, "softmax_scale": check_softmax_scale(softmax_scale, headdim, dtype)}
    p.update(check_fp8(dtype, xp, batch, heads, heads_k, q_descale, k_descale, v_descale, out_dtype))
    return _options(p, causal, window_size, softcap, alibi_slopes, block_mask, precision, sinks, dropout_p,
                    dropout_seed, dropout_offset, score_mod, score_mod_buffers, (q, k, v))


def _cu_seqlens(name, cu, xp, total, batch=None):
    if array_module({name: cu}) is not xp:
        raise TypeError(f"{name} must be a {'cupy' if xp is not numpy else 'numpy'} array like q")
    cu = native(cu)
    if cu.dtype != numpy.int32:
        raise TypeError(f"{name} has dtype {cu.dtype}; expected int32")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-dimensional of length batch + 1 >= 1, got shape {cu.shape}")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length; got {batch + 1} and {cu.shape[0]}")
    check_devices(xp, {name: cu})
    return xp.ascontiguousarray(cu)


def _max_seqlen(name, value):
    if value is None:
        return None
    if not is_int(value):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return int(value)


def _check_cu_seqlens_on_host(name, cu, total, given_max):
    """Checks a host copy of cu_seqlens and returns its longest sequence."""
    cu = numpy.asarray(cu, dtype=numpy.int64)
    lengths = numpy.diff(cu)
    if cu[0] != 0 or cu[-1] != total or (lengths < 0).any():
        raise ValueError(
            f"{name} must be non-decreasing from 0 to {total} (the rows of the packed tensor), got "
            f"{numpy.array2string(cu, threshold=12)}"
        )
    longest = int(lengths.max(initial=0))
    if given_max is not None and given_max < longest:
        raise ValueError(f"{name.replace('cu_seqlens', 'max_seqlen')} is {given_max}, but {name} holds a sequence "
                         f"of {longest}")
    return longest if given_max is None else given_max


def varlen_forward_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q=None, max_seqlen_k=None,
                           causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           precision="highest", sinks=None, dropout_p=0.0, dropout_seed=None, dropout_offset=0,
                           score_mod=None, score_mod_buffers=None, q_descale=None, k_descale=None, v_descale=None,
                           out_dtype=None, seqused_k=None):
    """Check the inputs of a packed (varlen) forward call (after :func:`arrays`); return its :class:`Problem`.

    NumPy inputs, and CuPy inputs without both max_seqlen, check cu_seqlens on the host (for CuPy, one
    device-to-host copy of batch + 1 integers, which waits for the current stream). CuPy inputs with both
    max_seqlen given never synchronize: Problem.check_on_device is then True and the CUDA path checks
    cu_seqlens on the device, filling every result with NaN when it is malformed.
    """
    named = {"q": q, "k": k, "v": v}
    xp = array_module(named)
    dtype = check_dtypes(named, fp8=True)
    for name, array in named.items():
        check_rank(name, array, ("total", "heads", "headdim"))
    total_q, total_k = q.shape[0], k.shape[0]
    if v.shape[0] != total_k:
        raise ValueError(f"k and v must have the same number of rows; got k {total_k}, v {v.shape[0]}")
    heads, heads_k, headdim, headdim_v = _heads_and_dims(q, k, v)
    cu_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, xp, total_q)
    cu_k = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, xp, total_k, batch=cu_q.shape[0] - 1)
    batch = cu_q.shape[0] - 1
    max_q = _max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = _max_seqlen("max_seqlen_k", max_seqlen_k)
    on_device = xp is not numpy and max_q is not None and max_k is not None
    if not on_device:
        host = (cu_q, cu_k) if xp is numpy else (cu_q.get(), cu_k.get())
        max_q = _check_cu_seqlens_on_host("cu_seqlens_q", host[0], total_q, max_q)
        max_k = _check_cu_seqlens_on_host("cu_seqlens_k", host[1], total_k, max_k)
        if xp is numpy:
            cu_q, cu_k = host
    check_sizes((("total_q", total_q), ("total_k", total_k), ("headdim", headdim), ("headdim_v", headdim_v),
                  ("max_seqlen_q", max_q), ("max_seqlen_k", max_k)))
    check_grid(batch, max_q, max_k, heads, heads_k)
    check_devices(xp, named)
    p = {"xp": xp, "dtype": dtype, "batch": batch, "seqlen_q": max_q, "seqlen_k": max_k, "heads": heads, "heads_k": heads_k,
         "headdim": headdim, "headdim_v": headdim_v, "softmax_scale": check_softmax_scale(softmax_scale, headdim, dtype),
         "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "total_q": total_q, "total_k": total_k, "check_on_device": on_device,
         "seqused_k": _check_seqused_k(seqused_k, xp, cu_k, batch)}
    p.update(check_fp8(dtype, xp, batch, heads, heads_k, q_descale, k_descale, v_descale, out_dtype))
    return _options(p, causal, window_size, softcap, alibi_slopes, None, precision, sinks, dropout_p, dropout_seed,
                    dropout_offset, score_mod, score_mod_buffers, (q, k, v))


def gather_paged(k, v, cu_seqlens_k, block_table):
    """flash_attention_varlen's paged keys and values (FlashAttention-2's block_table): k and v of shape
    (num_pages, page_size, heads_k, dim), sequence b's key t at row t % page_size of page
    block_table[b, t // page_size]; returns them packed, (total_k, heads_k, dim) with total_k =
    cu_seqlens_k[-1], for the packed problem (NumPy arrays; CuPy ones: :func:`paged_counts_on_device`)."""
    cu, block_table = native(numpy.asarray(cu_seqlens_k)), native(block_table)
    _check_paged(k, v, cu, block_table)
    if cu.dtype != numpy.int32:
        raise TypeError(f"cu_seqlens_k has dtype {cu.dtype}; expected int32")
    num_pages, page_size = k.shape[:2]
    lengths = numpy.diff(cu.astype(numpy.int64))
    capacity = block_table.shape[1] * page_size
    if cu[0] != 0 or (lengths < 0).any():
        raise ValueError(f"cu_seqlens_k must be non-decreasing from 0, got {numpy.array2string(cu, threshold=12)}")
    if (lengths > capacity).any():
        raise ValueError(f"cu_seqlens_k gives sequences of {lengths.tolist()} keys; block_table holds {capacity} per "
                         f"sequence ({block_table.shape[1]} pages of {page_size})")
    rows = [(b, numpy.arange(n)) for b, n in enumerate(lengths)]
    pages = [block_table[b, t // page_size] for b, t in rows]
    for b, used in enumerate(pages):
        if ((used < 0) | (used >= num_pages)).any():
            raise ValueError(f"block_table row {b} names pages outside the {num_pages} of k and v")
    gathered = [(page, t % page_size) for page, (_, t) in zip(pages, rows)]
    return tuple(numpy.concatenate([x[page, row] for page, row in gathered]) if gathered else x[:0, 0]
                 for x in (k, v))


def _check_paged(k, v, cu_seqlens_k, block_table):
    """The shapes and dtypes of flash_attention_varlen's paged keys and values and their block table."""
    for name, x in (("k", k), ("v", v)):
        check_rank(name, x, ("num_pages", "page_size", "heads_k", "dim"))
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree on (num_pages, page_size, heads_k); got {k.shape} and {v.shape}")
    if block_table.dtype != numpy.int32 or block_table.ndim != 2:
        raise TypeError(f"block_table must be an int32 array of shape (batch, max_pages), got {block_table.dtype} "
                        f"{block_table.shape}")
    if cu_seqlens_k.ndim != 1 or cu_seqlens_k.shape[0] != block_table.shape[0] + 1:
        raise ValueError(f"block_table has {block_table.shape[0]} rows; cu_seqlens_k must have {block_table.shape[0] + 1} "
                         f"entries, got shape {cu_seqlens_k.shape}")


def paged_counts_on_device(k, v, cu_seqlens_k, seqused_k, block_table):
    """flash_attention_varlen's block_table for CuPy arrays, with no host synchronization, as a packed
    problem in which sequence b's keys are rows b * capacity on of (batch * capacity, heads_k, dim) keys
    and values (capacity = max_pages * page_size): the pages either gathered there (gather_pages_on_device)
    or read in place by the Hopper forward's paged producer. Returns zero-stride views of that packed
    shape (for the problem's checks; no memory), the packed problem's cu_seqlens_k (b * capacity) and
    seqused_k (the sequence's keys, at most the caller's seqused_k), the bool (batch,) flags of sequences
    whose cu_seqlens_k or used pages are out of range (their rows are made NaN after the forward, as the KV
    cache's are; seqused_k 0, so the kernels read none of their keys), and the capacity."""
    import cupy

    _check_paged(k, v, cu_seqlens_k, block_table)
    batch, max_pages = block_table.shape
    kind = array_module({"block_table": block_table})
    for name, x, shape in (("cu_seqlens_k", cu_seqlens_k, (batch + 1,)), ("seqused_k", seqused_k, (batch,))):
        if x is None:
            continue
        if array_module({name: x}) is not kind or x.dtype != numpy.int32 or x.shape != shape:
            raise TypeError(f"{name} must be an int32 cupy array of shape {shape} like block_table, got a "
                            f"{type(x).__module__} array of dtype {x.dtype} and shape {x.shape}")
    check_devices(cupy, {n: x for n, x in (("k", k), ("v", v), ("cu_seqlens_k", cu_seqlens_k),
                                           ("block_table", block_table), ("seqused_k", seqused_k)) if x is not None})
    num_pages, page_size = k.shape[:2]
    capacity = max_pages * page_size
    lengths = cupy.diff(cu_seqlens_k.astype(numpy.int64))
    pages_used = (cupy.clip(lengths, 0, capacity) + page_size - 1) // page_size
    table_bad = ((block_table < 0) | (block_table >= num_pages)) & (cupy.arange(max_pages)[None, :] < pages_used[:, None])
    bad = (lengths < 0) | (lengths > capacity) | table_bad.any(axis=1)
    views = tuple(cupy.broadcast_to(x[:1, :1].reshape((-1,) + x.shape[2:]), (batch * capacity,) + x.shape[2:])
                  for x in (k, v))  # (one row: a reshape of the whole pool could copy it)
    used = cupy.clip(lengths, 0, capacity)
    if seqused_k is not None:
        used = cupy.minimum(used, seqused_k)
    cu = (cupy.arange(batch + 1, dtype=numpy.int32) * capacity).astype(numpy.int32)
    return views[0], views[1], cu, cupy.where(bad, 0, used).astype(numpy.int32), bad, capacity


def gather_pages_on_device(k, v, block_table):
    """The pages of paged_counts_on_device's problem gathered: (batch * capacity, heads_k, dim) copies of k
    and v, sequence b's pages at rows b * capacity on (an out-of-range page reads page 0 or the last: its
    sequence is flagged, and NaN)."""
    pages = block_table.clip(0, k.shape[0] - 1)
    rows = block_table.shape[0] * block_table.shape[1] * k.shape[1]
    return tuple(x[pages].reshape((rows,) + x.shape[2:]) for x in (k, v))


#: NaN's bits by itemsize (bfloat16 and float16 apart), written through integer views: CuPy runs no
#: elementwise operation on every dtype the kernels take.
_NAN_BITS = {"bfloat16": (numpy.uint16, 0x7FC0), "float16": (numpy.uint16, 0x7E00), "float32": (numpy.uint32, 0x7FC00000),
             "float64": (numpy.uint64, 0x7FF8000000000000)}


def nan_bad_sequences(results, bad, cu_seqlens_q, return_lse, return_max_score):
    """The results of a packed CuPy forward (out, then lse and max_score where asked for) with the rows of
    the sequences ``bad`` flags NaN: out's rows, lse's columns, max_score's rows (paged_counts_on_device's
    out-of-range sequences). No host synchronization."""
    import cupy

    results = results if isinstance(results, tuple) else (results,)
    if bad.shape[0] == 0:
        return results if len(results) > 1 else results[0]
    sequence = cupy.searchsorted(cu_seqlens_q[1:], cupy.arange(results[0].shape[0]), side="right")
    rows = bad[cupy.minimum(sequence, bad.shape[0] - 1)]
    _set_nan(cupy, results[0], rows, 0)  # out: (total_q, heads, headdim_v)
    if return_lse:
        _set_nan(cupy, results[1], rows, 1)  # lse: (heads, total_q)
    if return_max_score:
        _set_nan(cupy, results[-1], bad, 0)  # max_score: (batch, heads)
    return results if len(results) > 1 else results[0]


def _set_nan(xp, x, flags, axis):
    """x's slices along ``axis`` (0 or 1) where ``flags`` is set become NaN: a masked copy (boolean
    indexing would count the mask on the host)."""
    kind, bits = _NAN_BITS[x.dtype.name]
    shape = [1] * x.ndim
    shape[axis] = flags.shape[0]
    xp.copyto(x.view(kind), kind(bits), where=flags.reshape(shape))


def _check_seqused_k(seqused_k, xp, cu_k, batch):
    """seqused_k of a packed forward: int32 (batch,) of q's kind, the keys each sequence uses (its first
    ones). NumPy values must lie in [0, the sequence's keys]; CuPy values are not read on the host (the
    kernels clamp them into that range)."""
    if seqused_k is None:
        return None
    if array_module({"seqused_k": seqused_k}) is not xp:
        raise TypeError(f"seqused_k must be a {'cupy' if xp is not numpy else 'numpy'} array like q")
    seqused_k = native(seqused_k)
    if seqused_k.dtype != numpy.int32:
        raise TypeError(f"seqused_k has dtype {seqused_k.dtype}; expected int32")
    if seqused_k.shape != (batch,):
        raise ValueError(f"seqused_k must have shape ({batch},) (one count per sequence), got {seqused_k.shape}")
    if xp is numpy:
        keys = numpy.diff(numpy.asarray(cu_k))
        bad = numpy.flatnonzero((seqused_k < 0) | (seqused_k > keys))
        if bad.size:
            raise ValueError(f"seqused_k[{bad[0]}] must lie in [0, {keys[bad[0]]}] (sequence {bad[0]}'s keys), got "
                             f"{seqused_k[bad[0]]}")
    check_devices(xp, {"seqused_k": seqused_k})
    return xp.ascontiguousarray(seqused_k)


def _backward_arrays(problem, dout, q, out, lse):
    """Checks dout, out and lse against a forward problem."""
    check_dtypes({"q": q, "dout": dout, "out": out})
    axes = ("total_q", "heads", "headdim_v") if problem.varlen else ("batch", "seqlen_q", "heads", "headdim_v")
    for name, array in (("dout", dout), ("out", out)):
        check_rank(name, array, axes)
        if array.shape != problem.out_shape:
            raise ValueError(f"{name} must have shape {problem.out_shape} ({', '.join(axes)}), got {array.shape}")
    lse_axes = ("heads", "total_q") if problem.varlen else ("batch", "heads", "seqlen_q")
    check_rank("lse", lse, lse_axes)
    if lse.shape != problem.lse_shape:
        raise ValueError(f"lse must have shape {problem.lse_shape} ({', '.join(lse_axes)}), got {lse.shape}")
    if lse.dtype not in (numpy.float32, numpy.float64):
        raise TypeError(
            f"lse has dtype {lse.dtype}; expected float32 or float64 (flash_attention returns "
            f"{lse_dtype(problem.dtype)} for {problem.dtype} inputs)"
        )
    check_devices(problem.xp, {"dout": dout, "out": out, "lse": lse})


def refuse_fp8_backward(q):
    if getattr(q, "dtype", None) == _fp8.E4M3:
        raise TypeError("the backward of float8_e4m3fn inputs is not offered: run the forward you differentiate, "
                        "and its backward, in bfloat16 (FP8 attention is for inference; cuDNN's FP8 backward is "
                        "slower than its bfloat16 one where causal)")


def backward_problem(dout, q, k, v, out, lse, **options):
    """Check the inputs of a backward call (after :func:`arrays`) and return its :class:`Problem`."""
    refuse_fp8_backward(q)
    problem = forward_problem(q, k, v, **options)
    _backward_arrays(problem, dout, q, out, lse)
    return problem


def varlen_backward_problem(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, **options):
    """Check the inputs of a packed backward call (after :func:`arrays`) and return its :class:`Problem`."""
    refuse_fp8_backward(q)
    problem = varlen_forward_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, **options)
    _backward_arrays(problem, dout, q, out, lse)
    return problem


_LSE_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))


def merge_parts(outs, lses):
    """Checks the parts of a merge, ``outs`` and ``lses`` (name -> array, in part order, from
    :func:`arrays`): one supported dtype for every out, float32 or float64 lse, and the layouts of
    :func:`cupyflash.flash_attention` (out (batch, seqlen_q, heads, headdim_v), lse (batch, heads,
    seqlen_q)) or of the varlen functions (out (total_q, heads, headdim_v), lse (heads, total_q)) with
    the same sizes in every part. Returns (array module, packed)."""
    xp = array_module({**outs, **lses})
    check_dtypes(outs, dtype_of=next(iter(outs)))
    for name, lse in lses.items():
        if lse.dtype not in _LSE_DTYPES:
            raise TypeError(f"{name} has dtype {lse.dtype}; expected float32 or float64 (the log-sum-exp)")
    first_name, first = next(iter(outs.items()))
    if first.ndim not in (3, 4):
        raise ValueError(
            f"{first_name}: {first.ndim}-dimensional array given. Array must be 4-dimensional (batch, seqlen_q, "
            "heads, headdim_v) or, for packed sequences, 3-dimensional (total_q, heads, headdim_v)"
        )
    packed = first.ndim == 3
    for name, out in outs.items():
        if out.shape != first.shape:
            raise ValueError(f"{name} has shape {out.shape}, but {first_name} has shape {first.shape}; they must match")
    if packed:
        expected, axes = (first.shape[1], first.shape[0]), "(heads, total_q)"
    else:
        expected, axes = (first.shape[0], first.shape[2], first.shape[1]), "(batch, heads, seqlen_q)"
    for name, lse in lses.items():
        if lse.shape != expected:
            raise ValueError(f"{name} has shape {lse.shape}; expected {expected}, {axes} of {first_name}")
    check_devices(xp, {**outs, **lses})
    return xp, packed


def merge_stacked(out, lse, packed):
    """Checks the stacked form of a merge: out and lse with a leading axis of n >= 1 parts, each part as
    in :func:`merge_parts`, in the packed layout when ``packed``. Returns (array module, n)."""
    parts_axes = "(parts, total_q, heads, headdim_v)" if packed else "(parts, batch, seqlen_q, heads, headdim_v)"
    if not packed and out.ndim == 4:
        raise ValueError(
            "out: 4-dimensional array given. Array must be 5-dimensional (parts, batch, seqlen_q, heads, headdim_v), "
            "or 4-dimensional (parts, total_q, heads, headdim_v) with packed=True. A 4-dimensional out is either "
            "packed parts (pass packed=True) or a single (batch, seqlen_q, heads, headdim_v) result, whose batch "
            "entries would be merged as parts (stack the parts instead: xp.stack([out_a, out_b]))"
        )
    if out.ndim != (4 if packed else 5):
        raise ValueError(
            f"out: {out.ndim}-dimensional array given. Array must be {4 if packed else 5}-dimensional {parts_axes}"
            + (" with packed=True" if packed else "")
        )
    if lse.ndim != out.ndim - 1 or lse.shape[:1] != out.shape[:1]:
        raise ValueError(
            f"lse has shape {lse.shape}; expected a {out.ndim - 1}-dimensional array whose first axis is out's "
            f"number of parts, {out.shape[0]}"
        )
    if out.shape[0] == 0:
        raise ValueError("out has 0 parts along its first axis; merging needs at least one")
    xp, _ = merge_parts({"out[0]": out[0]}, {"lse[0]": lse[0]})
    return xp, out.shape[0]


@dataclasses.dataclass(frozen=True)
class Rotary:
    """A checked apply_rotary call: x (batch, seqlen, heads, headdim) or packed (total, heads, headdim)."""

    xp: object
    rotary_dim: int
    interleaved: bool
    conjugate: bool
    inplace: bool
    offsets: object  # int, or int32 (batch,) of x's kind
    cu_seqlens: object  # int32 (batch + 1,) of x's kind, or None
    max_seqlen: int  # the longest sequence (dense: seqlen)


def rotary_problem(x, cos, sin, *, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, conjugate, inplace):
    """Checks the arguments of :func:`cupyflash.apply_rotary` (after :func:`arrays`); returns a Rotary."""
    named = {"x": x, "cos": cos, "sin": sin}
    xp = array_module(named)
    if x.dtype not in SUPPORTED_DTYPES.values():
        raise TypeError(f"x has dtype {x.dtype}; expected {_SUPPORTED_TEXT}")
    for name, table in (("cos", cos), ("sin", sin)):
        if table.dtype not in (x.dtype, numpy.dtype(numpy.float32)):
            raise TypeError(f"{name} has dtype {table.dtype}; expected x's dtype ({x.dtype}) or float32")
        check_rank(name, table, ("seqlen_rotary", "rotary_dim / 2"))
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have one shape; got {cos.shape} and {sin.shape}")
    if cos.dtype != sin.dtype:
        raise TypeError(f"cos and sin must have one dtype; got {cos.dtype} and {sin.dtype}")
    packed = cu_seqlens is not None
    check_rank("x", x, ("total", "heads", "headdim") if packed else ("batch", "seqlen", "heads", "headdim"))
    rotary_dim = 2 * cos.shape[1]
    if not 0 < rotary_dim <= x.shape[-1]:
        raise ValueError(f"cos has {cos.shape[1]} columns: rotary_dim = 2 * that must be in [2, headdim = "
                         f"{x.shape[-1]}]")
    for name, flag in (("interleaved", interleaved), ("conjugate", conjugate), ("inplace", inplace)):
        check_flag(name, flag)
    lengths = None  # each sequence's length, where known on the host
    if packed:
        cu_seqlens = _cu_seqlens("cu_seqlens", cu_seqlens, xp, x.shape[0])
        batch = cu_seqlens.shape[0] - 1
        max_seqlen = _max_seqlen("max_seqlen", max_seqlen)
        if max_seqlen is None or xp is numpy:
            host = cu_seqlens if xp is numpy else cu_seqlens.get()
            max_seqlen = _check_cu_seqlens_on_host("cu_seqlens", host, x.shape[0], max_seqlen)
            lengths = numpy.diff(numpy.asarray(host, numpy.int64))
    else:
        if max_seqlen is not None:
            raise ValueError("max_seqlen goes with cu_seqlens (packed x); a dense x's seqlen is its second axis")
        batch, max_seqlen = x.shape[:2]
        lengths = numpy.full(batch, max_seqlen, numpy.int64)
    if is_int(seqlen_offsets):
        offsets = int(seqlen_offsets)
        if offsets < 0:
            raise ValueError(f"seqlen_offsets must be non-negative, got {offsets}")
        last = offsets + (max_seqlen if lengths is None else int(lengths.max(initial=0)))
    else:
        if not hasattr(seqlen_offsets, "shape"):
            raise TypeError(f"seqlen_offsets must be an int or an int32 array (batch,) of x's kind, got "
                            f"{type(seqlen_offsets).__name__} {seqlen_offsets!r}")
        if array_module({"seqlen_offsets": seqlen_offsets}) is not xp:
            raise TypeError("seqlen_offsets must be an int or an int32 array of x's kind")
        seqlen_offsets = native(seqlen_offsets)
        if seqlen_offsets.dtype != numpy.int32 or seqlen_offsets.shape != (batch,):
            raise TypeError(f"seqlen_offsets must be an int or an int32 array of shape ({batch},); got "
                            f"{seqlen_offsets.dtype} {seqlen_offsets.shape}")
        offsets = xp.ascontiguousarray(seqlen_offsets)
        # CuPy offsets are not read on the host: a position past cos's rows makes its row NaN there.
        last = None
        if xp is numpy:
            if offsets.min(initial=0) < 0:
                raise ValueError(f"seqlen_offsets must be non-negative, got {offsets.min()}")
            last = int(numpy.where(lengths > 0, offsets + lengths, 0).max(initial=0))  # empty ones use none
    if last is not None and max_seqlen and last > cos.shape[0]:
        raise ValueError(f"cos and sin have {cos.shape[0]} rows (positions), but positions run to {last - 1} "
                         "(seqlen_offsets plus the longest sequence)")
    if inplace and xp is numpy and not x.flags.writeable:
        raise ValueError("inplace=True needs a writable x")
    check_devices(xp, {**named, **({"cu_seqlens": cu_seqlens} if packed else {})})
    return Rotary(xp, rotary_dim, bool(interleaved), bool(conjugate), bool(inplace), offsets,
                  cu_seqlens, max_seqlen)
