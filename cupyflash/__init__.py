"""cupyflash: exact FlashAttention (forward and backward) for CuPy arrays, with a NumPy twin.

>>> import cupy, cupyflash
>>> q = k = v = cupy.random.standard_normal((2, 1024, 8, 64), dtype=cupy.float32)
>>> out = cupyflash.flash_attention(q, k, v, causal=True)
"""

from . import reference
from ._api import flash_attention, flash_attention_backward, flash_attention_vjp
from ._validate import SUPPORTED_DTYPES

__version__ = "0.4.0"

__all__ = ["flash_attention", "flash_attention_backward", "flash_attention_vjp", "reference", "SUPPORTED_DTYPES"]
