"""Kernel families: one object per family and direction says what it supports for a problem and its
operands on a device (``select`` returns a variant or None) and plans it (``plan`` writes its buffers,
argument structs and launches into a cupyflash._plan.PlanBuilder). Dispatch takes the first family that
supports the problem, before anything is planned: a family never hands a problem on once chosen. A new
family (a Hopper kernel, an FP8 one) is a new module here and an entry in these tuples.

Importing this package needs CuPy but no GPU: the tables and variants are plain data.

The environment variable ``CUPYFLASH_FAMILY`` (``sm90``, ``sm80`` or ``general``) makes dispatch start at
that family, skipping the ones before it: the tests and the benchmark run one problem on several paths
of one GPU with it. A family that does not support the problem still hands it on to the next.
"""

import os

from . import common, general, sm80, sm90

#: Environment variable naming the first family dispatch may use, and the families' names in dispatch
#: order (a direction without the named family starts at the next one it has).
FAMILY_VARIABLE = "CUPYFLASH_FAMILY"
FAMILY_NAMES = ("sm90", "sm80", "general")

#: Families in dispatch order, per direction; the general family supports every problem.
FORWARD = (sm90.FORWARD, sm80.FORWARD, general.FORWARD)
BACKWARD = (sm90.BACKWARD, sm80.BACKWARD, general.BACKWARD)


def _kernels():
    from .._kvcache import device as kvcache

    seen = {}
    others = [common.VARLEN_CHECK_FILL, common.DROPOUT_MASK, common.ROTARY, common.MAX_SCORE_DECODE, common.FINISH_EXACT,
              *kvcache.KERNELS]
    for kernel in [k for family in FORWARD + BACKWARD for k in family.kernels] + others:
        seen.setdefault(kernel.name, kernel)
    return tuple(seen.values())


def __getattr__(name):
    """KERNELS, every kernel template, and VARIANTS, the closed table of their variants (dispatch, the
    compile-everything test and error messages use it): built on first use, since they name the KV-cache
    kernels, whose module imports this package."""
    if name == "KERNELS":
        globals()["KERNELS"] = _kernels()
        return globals()["KERNELS"]
    if name == "VARIANTS":
        globals()["VARIANTS"] = tuple(v for kernel in __getattr__("KERNELS") for v in kernel.variants())
        return globals()["VARIANTS"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def forced(families):
    """``families`` from the one ``CUPYFLASH_FAMILY`` names (all of them when it is unset or empty)."""
    name = os.environ.get(FAMILY_VARIABLE, "")
    if not name:
        return families
    if name not in FAMILY_NAMES:
        raise ValueError(f"{FAMILY_VARIABLE}={name!r}: expected one of {', '.join(FAMILY_NAMES)} or unset")
    skipped = FAMILY_NAMES[: FAMILY_NAMES.index(name)]
    return tuple(f for f in families if f.name not in skipped)


def select(families, problem, device, operands):
    """The first family of ``families`` (from the one ``CUPYFLASH_FAMILY`` names) that supports ``problem``
    and its ``operands`` (arrays or plan slots, as the kernels will read them) on ``device``, and its
    variant. A problem with a score_mod or a mask_mod goes to the families whose kernels compile them
    (``user_functions``); one with paged keys (a block table) to those that read them (``paged_keys``)."""
    user = problem.user_score is not None or problem.user_mask is not None
    for family in forced(families):
        if user and not getattr(family, "user_functions", False):
            continue
        if problem.block_table is not None and not getattr(family, "paged_keys", False):
            continue  # (the host asks for paged keys only where the sm90 family takes them)
        variant = family.select(problem, device, operands)
        if variant is not None:
            return family, variant
    name = os.environ.get(FAMILY_VARIABLE, "")
    if name:
        raise NotImplementedError(f"{FAMILY_VARIABLE}={name!r}: no family from {name} on takes this problem "
                                  f"({problem.dtype.name} inputs; float8_e4m3fn inputs run on the sm90 family only); "
                                  "unset it to let dispatch choose")
    # (The host sends FP8 inputs and paged keys to dispatch only where the sm90 family takes them.)
    raise AssertionError("the general family supports every problem")
