"""The feature matrix shared by the NumPy-path tests (test_features.py) and the GPU tests
(test_gpu_features.py): windows, softcap, ALiBi, block masks and packed batches, alone and together,
with GQA, headdim_v != headdim, odd sizes and every dtype, on every path (the float16/bfloat16 cases
use head dims the tensor-core kernels cover; float32/float64 run the sm80 family's forward and the
general kernels, as tests/helpers.py's FLOAT32_FAMILIES says).

Options that hold arrays are recipes, built for the array module of the test by :func:`build`.
"""

import numpy as np
from helpers import alibi, random_layout

import cupyflash

# (id, (batch, seqlen_q, seqlen_k, heads, heads_k, headdim, headdim_v), dtype, causal, options)
DENSE = [
    ("window-64-0", (2, 203, 203, 4, 2, 64, 64), "bfloat16", False, {"window_size": (64, 0)}),
    ("window-32-17-q<k", (1, 113, 301, 2, 1, 128, 128), "float16", False, {"window_size": (32, 17)}),
    ("window-causal-q>k", (1, 301, 113, 3, 3, 96, 64), "bfloat16", True, {"window_size": (40, -1)}),
    ("window-5-5", (2, 77, 77, 2, 2, 40, 40), "float32", False, {"window_size": (5, 5)}),
    ("window-0-0-causal", (1, 29, 53, 2, 1, 32, 32), "float64", True, {"window_size": (0, 0)}),
    ("window-right-only", (1, 97, 64, 2, 1, 256, 256), "float16", False, {"window_size": (-1, 3)}),
    ("softcap-5-causal", (2, 131, 157, 4, 2, 64, 64), "bfloat16", True, {"softcap": 5.0}),
    ("softcap-0.5-window", (1, 97, 97, 2, 2, 128, 128), "float16", False, {"softcap": 0.5, "window_size": (30, 30)}),
    ("softcap-2", (1, 67, 45, 2, 1, 48, 48), "float32", False, {"softcap": 2.0}),
    ("softcap-d192", (1, 70, 90, 2, 1, 192, 128), "bfloat16", True, {"softcap": 20.0}),
    ("alibi-heads-causal", (2, 150, 150, 4, 2, 64, 64), "bfloat16", True, {"alibi_slopes": ("alibi", False)}),
    ("alibi-batch-softcap", (2, 113, 203, 4, 4, 128, 96), "float16", False,
     {"alibi_slopes": ("alibi", True), "softcap": 8.0}),
    ("alibi-window", (1, 31, 47, 2, 1, 16, 16), "float64", False, {"alibi_slopes": ("alibi", True), "window_size": (7, 3)}),
    ("alibi-d256", (1, 65, 129, 2, 2, 256, 256), "bfloat16", False, {"alibi_slopes": ("alibi", False)}),
    ("block-64-causal", (1, 500, 500, 4, 2, 64, 64), "bfloat16", True,
     {"block_mask": ("random", (1, 4), (64, 64), 0.4)}),
    ("block-128-broadcast", (2, 700, 650, 2, 1, 128, 128), "float16", False,
     {"block_mask": ("random", (1, 1), (128, 128), 0.3)}),
    ("block-16x48-window", (2, 150, 170, 4, 2, 40, 40), "float32", True,
     {"block_mask": ("random", (2, 4), (16, 48), 0.5), "window_size": (60, 0)}),
    ("block-32", (1, 60, 70, 2, 2, 24, 24), "float64", False, {"block_mask": ("random", (1, 2), (32, 32), 0.5)}),
    ("block-16-d96", (1, 200, 230, 2, 1, 96, 96), "float16", False, {"block_mask": ("random", (1, 2), (16, 16), 0.3)}),
    ("longformer", (1, 640, 640, 2, 2, 128, 128), "bfloat16", True, {"block_mask": ("longformer", (64, 64))}),
    ("bigbird", (1, 512, 512, 2, 2, 64, 64), "float16", False, {"block_mask": ("bigbird", (128, 128))}),
    ("everything", (2, 257, 311, 4, 2, 96, 96), "bfloat16", True,
     {"window_size": (100, -1), "softcap": 10.0, "alibi_slopes": ("alibi", True),
      "block_mask": ("random", (2, 4), (64, 64), 0.5)}),
    ("everything-fp32", (1, 90, 70, 4, 1, 32, 48), "float32", True,
     {"window_size": (20, -1), "softcap": 3.0, "alibi_slopes": ("alibi", False),
      "block_mask": ("random", (1, 4), (16, 16), 0.6)}),
]

# (id, lengths_q, lengths_k, heads, heads_k, headdim, headdim_v, dtype, causal, options)
VARLEN = [
    ("plain", [37, 0, 101, 64, 1], [37, 0, 101, 64, 1], 4, 2, 64, 64, "bfloat16", False, {}),
    ("causal-window-alibi", [130, 17, 300], [90, 200, 300], 2, 1, 128, 128, "float16", True,
     {"window_size": (50, 0), "alibi_slopes": ("alibi", True)}),
    ("empty-keys", [5, 0, 33], [7, 9, 0], 3, 3, 40, 24, "float32", True, {}),
    ("fp64-softcap", [9, 14], [21, 3], 2, 1, 16, 16, "float64", False, {"softcap": 1.5}),
    ("softcap-d256", [65, 129], [129, 65], 2, 2, 256, 128, "bfloat16", False, {"softcap": 4.0}),
]


def build(xp, batch, heads, seqlen_q, seqlen_k, options, seed=0):
    """The options with their recipes turned into arrays of ``xp`` and BlockMasks."""
    built = {}
    for name, value in options.items():
        if name == "alibi_slopes":
            built[name] = alibi(xp, batch, heads, per_batch=value[1])
        elif name == "block_mask":
            kind, *args = value
            if kind == "random":
                (lb, lh), block, density = args
                shape = (lb, lh, -(-seqlen_q // block[0]), -(-seqlen_k // block[1]))
                built[name] = cupyflash.BlockMask.from_dense(random_layout(shape, density, seed), block)
            elif kind == "longformer":
                built[name] = cupyflash.BlockMask.longformer(seqlen_q, seqlen_k, block_size=args[0], window_blocks=1,
                                                             global_blocks=1)
            else:
                built[name] = cupyflash.BlockMask.bigbird(seqlen_q, seqlen_k, block_size=args[0], random_blocks=1,
                                                          heads=heads, seed=seed)
        else:
            built[name] = value
    return built


def dense_ids():
    return [case[0] for case in DENSE]


def varlen_ids():
    return [case[0] for case in VARLEN]


__all__ = ["DENSE", "VARLEN", "build", "dense_ids", "varlen_ids", "np"]
