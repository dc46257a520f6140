"""Precompiles, in 16 threads, the variants of the tree in the current directory whose dtype is one of
argv[1] (comma-separated; "" for dtype-less helpers) and whose kernel name contains one of argv[2]
(comma-separated), without score or mask functions (argv[3] "plain": only those without flags either): a
bench's or a test file's kernels before they run."""
import sys
import time

from cupyflash import _families, _kernels

t = time.time()
dtypes = set(sys.argv[1].split(","))
names = sys.argv[2].split(",")
plain = sys.argv[3:] == ["plain"]
chosen = [v for v in _families.VARIANTS if (v.dtype or "") in dtypes and any(n in v.kernel.name for n in names)
          and not (plain and any(v.flags))]
_kernels.precompile(chosen, max_workers=16)
print(f"precompiled {len(chosen)} variants in {time.time() - t:.1f} s")
