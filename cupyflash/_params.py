"""The kernels' argument structs (``kernels_cu/common/params.cuh`` and the structs of single kernels) as
NumPy structured dtypes.

Each kernel takes one struct by value; CuPy copies the bytes of a size-1 NumPy array of these dtypes
into the launch. ``align=True`` lays the fields out as a C compiler does; tests/test_compile.py checks
every struct's size and every field's offset against NVRTC's ``sizeof``/``offsetof``. Pointers are
``uint64`` device addresses (0 for null), strides and sizes are in elements.
"""

import numpy

from ._trace import MAX_BUFFERS, MAX_RANK

_PTR = numpy.uint64
_I64 = numpy.int64
_I32 = numpy.int32
_F64 = numpy.float64

TENSOR_ARG = numpy.dtype(
    [("ptr", _PTR), ("batch_stride", _I64), ("row_stride", _I64), ("head_stride", _I64)], align=True
)
ROWS_ARG = numpy.dtype([("ptr", _PTR), ("batch_stride", _I64), ("head_stride", _I64)], align=True)
BLOCK_SPARSE_ARG = numpy.dtype(
    [
        ("kv_count", _PTR), ("kv_index", _PTR), ("q_count", _PTR), ("q_index", _PTR), ("layout", _PTR),
        ("slice_batch_stride", _I64), ("slice_head_stride", _I64),
        ("tile_q", _I32), ("tile_k", _I32), ("q_tiles", _I32), ("k_tiles", _I32),
        ("block_q", _I32), ("block_k", _I32), ("layout_rows", _I32), ("layout_cols", _I32),
        ("elem_slot", _PTR), ("elem_bits", _PTR),
    ],
    align=True,
)
DROPOUT_ARG = numpy.dtype(
    [("seed", numpy.uint64), ("offset", numpy.uint32), ("threshold", numpy.uint32), ("scale", _F64),
     ("enabled", _I32)],
    align=True,
)
MOD_BUFFER = numpy.dtype([("data", _PTR), ("size", _I32, (MAX_RANK,))], align=True)
MOD_BUFFERS = numpy.dtype([("buf", MOD_BUFFER, (MAX_BUFFERS,))], align=True)
MOD_GRADS = numpy.dtype([("data", _PTR, (MAX_BUFFERS,)), ("local_offset", _I32, (MAX_BUFFERS + 1,)), ("exact", _I32)],
                        align=True)
ATTN_ARGS = numpy.dtype(
    [
        ("q", TENSOR_ARG), ("k", TENSOR_ARG), ("v", TENSOR_ARG),
        ("cu_seqlens_q", _PTR), ("cu_seqlens_k", _PTR), ("seqused_k", _PTR), ("alibi_slopes", _PTR), ("alibi_batch_stride", _I64),
        ("softmax_scale", _F64), ("softcap", _F64),
        ("batch", _I32), ("heads", _I32), ("heads_k", _I32), ("headdim", _I32), ("headdim_v", _I32),
        ("seqlen_q", _I32), ("seqlen_k", _I32), ("total_q", _I32), ("total_k", _I32),
        ("window_left", _I32), ("window_right", _I32), ("vec_loads", _I32),
        ("sparse", BLOCK_SPARSE_ARG), ("dropout", DROPOUT_ARG), ("sinks", _PTR),
        ("score_buffers", MOD_BUFFERS), ("mask_buffers", MOD_BUFFERS),
        ("q_descale", _PTR), ("k_descale", _PTR), ("v_descale", _PTR), ("q_descale_heads", _I32),
    ],
    align=True,
)
FWD_ARGS = numpy.dtype([("attn", ATTN_ARGS), ("out", TENSOR_ARG), ("lse", ROWS_ARG), ("max_score", _PTR)], align=True)
BWD_ARGS = numpy.dtype(
    [
        ("attn", ATTN_ARGS),
        ("out", TENSOR_ARG), ("dout", TENSOR_ARG), ("dq", TENSOR_ARG), ("dk", TENSOR_ARG), ("dv", TENSOR_ARG),
        ("lse", ROWS_ARG), ("delta", ROWS_ARG), ("dq_accum", ROWS_ARG),
        ("dq_turns", _PTR), ("dq_split_stride", _I64), ("turns_split_stride", _I64),
        ("dq_ld", _I32), ("dq_splits", _I32), ("deterministic", _I32), ("tile_group", _I32),
        ("tail_pairs", _I32), ("score_grads", MOD_GRADS), ("sink_terms", _PTR), ("dq_in_place", _I32),
        ("key_order", _PTR), ("walk_ranges", _PTR), ("dq_claims", _PTR), ("dq_claim_rows", _I32),
    ],
    align=True,
)

KV_CACHE_ARGS = numpy.dtype(
    [
        ("attn", ATTN_ARGS), ("out", TENSOR_ARG), ("lse", ROWS_ARG), ("k_new", TENSOR_ARG), ("v_new", TENSOR_ARG),
        ("q_rot", TENSOR_ARG), ("rotary_cos", _PTR), ("rotary_sin", _PTR), ("cache_seqlens", _PTR),
        ("cache_batch_idx", _PTR), ("block_table", _PTR), ("cache_leftpad", _PTR), ("part_out", _PTR), ("part_lse", _PTR),
        ("seqused_k", _PTR), ("bad", _PTR), ("split_counters", _PTR), ("max_score", _PTR),
        ("block_table_stride", _I64), ("cache_seqlens_value", _I32),
        ("seqlen_new", _I32), ("page_size", _I32), ("cache_entries", _I32), ("num_splits", _I32),
        ("rotary_dim", _I32), ("rotary_rows", _I32), ("rotary_interleaved", _I32), ("rotary_q_at_row", _I32),
    ],
    align=True,
)

#: TransposeValuesArgs (kernels_cu/sm90/kmajor_values.cu).
TRANSPOSE_VALUES_ARGS = numpy.dtype(
    [("v", TENSOR_ARG), ("vt", _PTR), ("batch", _I32), ("seqlen_k", _I32), ("heads_k", _I32), ("headdim_v", _I32),
     ("keys", _I32)],
    align=True,
)

#: RoundRowsArgs (kernels_cu/sm90/kmajor_values.cu).
ROUND_ROWS_ARGS = numpy.dtype(
    [("x", TENSOR_ARG), ("out", _PTR), ("batch", _I32), ("rows", _I32), ("heads", _I32), ("dim", _I32),
     ("dim_out", _I32)],
    align=True,
)

#: NanFill (kernels_cu/common/checks.cu): up to three results, each ``words`` elements of ``width``
#: bytes whose NaN is the bit pattern ``nan``.
NAN_FILL = numpy.dtype(
    [("ptr", _PTR, (3,)), ("words", _I64, (3,)), ("nan", numpy.uint64, (3,)), ("width", _I32, (3,))], align=True
)

#: DropoutMaskArgs (kernels_cu/common/dropout_mask.cu).
DROPOUT_MASK_ARGS = numpy.dtype(
    [("dropout", DROPOUT_ARG), ("mask", _PTR), ("batch", _I32), ("heads", _I32), ("seqlen_q", _I32),
     ("seqlen_k", _I32)],
    align=True,
)

#: RotaryArgs (kernels_cu/common/rotary.cu).
ROTARY_ARGS = numpy.dtype(
    [
        ("x", TENSOR_ARG), ("out", TENSOR_ARG), ("cos", _PTR), ("sin", _PTR), ("cu_seqlens", _PTR), ("offsets", _PTR),
        ("rows", _I64), ("offset", _I32), ("batch", _I32), ("seqlen", _I32), ("heads", _I32), ("headdim", _I32),
        ("half", _I32), ("table_rows", _I32), ("interleaved", _I32), ("conjugate", _I32), ("copy_rest", _I32),
    ],
    align=True,
)

#: MaxScoreDecodeArgs (kernels_cu/common/max_score.cu).
MAX_SCORE_DECODE_ARGS = numpy.dtype([("images", _PTR), ("out", _PTR), ("count", _I32)], align=True)

#: Parts one merge launch takes (kernels_cu/common/merge.cu kMergeParts).
MERGE_PARTS = 16

#: MergeArgs (kernels_cu/common/merge.cu).
MERGE_ARGS = numpy.dtype(
    [("parts", TENSOR_ARG, (MERGE_PARTS,)), ("lses", ROWS_ARG, (MERGE_PARTS,)), ("out", TENSOR_ARG), ("lse", ROWS_ARG),
     ("num_parts", _I32), ("batch", _I32), ("seqlen", _I32), ("heads", _I32), ("headdim", _I32)],
    align=True,
)

#: MaskModBlocksArgs (kernels_cu/common/mask_mod_blocks.cu).
MASK_MOD_BLOCKS_ARGS = numpy.dtype(
    [("buffers", MOD_BUFFERS), ("some", _PTR), ("every", _PTR), ("batch", _I32), ("heads", _I32), ("seqlen_q", _I32),
     ("seqlen_k", _I32), ("block_q", _I32), ("block_k", _I32), ("rows", _I32), ("cols", _I32)],
    align=True,
)

#: MaskModBitsArgs (kernels_cu/common/mask_mod_blocks.cu).
MASK_MOD_BITS_ARGS = numpy.dtype(
    [("buffers", MOD_BUFFERS), ("slot", _PTR), ("cells", _PTR), ("bits", _PTR), ("slots", _I64), ("heads", _I32),
     ("seqlen_q", _I32), ("seqlen_k", _I32), ("block_q", _I32), ("block_k", _I32), ("rows", _I32), ("cols", _I32)],
    align=True,
)

#: FinishExactArgs (kernels_cu/common/exact_sum.cu).
FINISH_EXACT_ARGS = numpy.dtype([("words", _PTR), ("out", _PTR), ("count", _I64)], align=True)

#: C++ struct name -> dtype, for the layout test.
STRUCTS = {
    "TensorArg": TENSOR_ARG,
    "RowsArg": ROWS_ARG,
    "BlockSparseArg": BLOCK_SPARSE_ARG,
    "DropoutArg": DROPOUT_ARG,
    "ModBuffer": MOD_BUFFER,
    "ModBuffers": MOD_BUFFERS,
    "ModGrads": MOD_GRADS,
    "AttnArgs": ATTN_ARGS,
    "FwdArgs": FWD_ARGS,
    "BwdArgs": BWD_ARGS,
    "KvCacheArgs": KV_CACHE_ARGS,
    "TransposeValuesArgs": TRANSPOSE_VALUES_ARGS,
    "RoundRowsArgs": ROUND_ROWS_ARGS,
    "NanFill": NAN_FILL,
    "DropoutMaskArgs": DROPOUT_MASK_ARGS,
    "RotaryArgs": ROTARY_ARGS,
    "MaxScoreDecodeArgs": MAX_SCORE_DECODE_ARGS,
    "MaskModBlocksArgs": MASK_MOD_BLOCKS_ARGS,
    "MaskModBitsArgs": MASK_MOD_BITS_ARGS,
    "MergeArgs": MERGE_ARGS,
    "FinishExactArgs": FINISH_EXACT_ARGS,
}


def new(dtype):
    """A zeroed argument struct: a size-1 array, which CuPy passes to a kernel by value."""
    return numpy.zeros(1, dtype)


def pointer(x):
    """Device address of a CuPy array (0 for None)."""
    return 0 if x is None else x.data.ptr


def tensor(x, batched=True):
    """A TensorArg as a tuple of its fields, from ``x``: (batch, rows, heads, dim), or (rows, heads, dim)
    when not ``batched``. (One tuple assignment fills a struct several times faster than field by
    field, which matters for the host time of short calls.)"""
    size = x.dtype.itemsize
    strides = x.strides
    if batched:
        return (pointer(x), strides[0] // size, strides[1] // size, strides[2] // size)
    return (pointer(x), 0, strides[0] // size, strides[1] // size)


def rows(x, batch_stride, head_stride):
    """A RowsArg as a tuple of its fields."""
    return (pointer(x), batch_stride, head_stride)
