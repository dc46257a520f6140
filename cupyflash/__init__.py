"""cupyflash: exact FlashAttention (forward and backward) for CuPy arrays, with a NumPy twin.

>>> import cupy, cupyflash
>>> q = k = v = cupy.random.standard_normal((2, 1024, 8, 64), dtype=cupy.float32)
>>> out = cupyflash.flash_attention(q, k, v, causal=True)
"""

from . import mods, reference
from ._api import (
    apply_rotary,
    flash_attention,
    flash_attention_backward,
    flash_attention_varlen,
    flash_attention_varlen_backward,
    flash_attention_varlen_vjp,
    flash_attention_vjp,
    flash_attention_with_kvcache,
    merge_attention_states,
    merge_attention_states_stacked,
    ring_flash_attention,
    ring_flash_attention_backward,
    ring_flash_attention_vjp,
)
from ._block_mask import BlockMask
from ._dropout import dropout_mask, dropout_rate
from ._fp8 import quantize_fp8
from ._problem import SUPPORTED_DTYPES
from ._ring import VirtualRing, zigzag_shard, zigzag_unshard

__version__ = "0.9.0"

__all__ = [
    "BlockMask",
    "SUPPORTED_DTYPES",
    "VirtualRing",
    "apply_rotary",
    "dropout_mask",
    "dropout_rate",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_varlen",
    "flash_attention_varlen_backward",
    "flash_attention_varlen_vjp",
    "flash_attention_vjp",
    "flash_attention_with_kvcache",
    "merge_attention_states",
    "merge_attention_states_stacked",
    "mods",
    "quantize_fp8",
    "reference",
    "ring_flash_attention",
    "ring_flash_attention_backward",
    "ring_flash_attention_vjp",
    "zigzag_shard",
    "zigzag_unshard",
]
