"""Kernel families: one object per family and direction says what it supports for a problem on a
device (``select`` returns a variant or None), and runs it (shared memory, grid, argument struct).
Dispatch tries the families in order; a new family (a Hopper kernel, a split-KV combine) is a new
module here and an entry in these tuples.

Importing this package needs no GPU: the tables and variants are plain data.
"""

from . import common, general, sm80

#: Families in dispatch order, per direction; the general family supports every problem.
FORWARD = (sm80.FORWARD, general.FORWARD)
BACKWARD = (sm80.BACKWARD, general.BACKWARD)


def _kernels():
    seen = {}
    for kernel in [k for family in FORWARD + BACKWARD for k in family.kernels] + [common.VARLEN_CHECK, common.FILL_NAN_IF]:
        seen.setdefault(kernel.name, kernel)
    return tuple(seen.values())


#: Every kernel template, and the closed table of their variants: dispatch, the compile-everything
#: test and error messages use it.
KERNELS = _kernels()
VARIANTS = tuple(v for kernel in KERNELS for v in kernel.variants())


def select(families, problem, device):
    """The first family of ``families`` that supports ``problem`` on ``device``, and its variant."""
    for family in families:
        variant = family.select(problem, device)
        if variant is not None:
            return family, variant
    raise AssertionError("the general family supports every problem")
