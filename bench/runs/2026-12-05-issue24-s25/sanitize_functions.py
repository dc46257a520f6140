"""tests/sanitize_attention.py's functions() alone (the kernels built with score and mask functions), for
compute-sanitizer: `python bench/runs/2026-12-05-issue24-s25/sanitize_functions.py sm90:bfloat16`."""

import os
import sys
from pathlib import Path

source = Path(__file__).resolve().parents[3] / "tests" / "sanitize_attention.py"
text = source.read_text()
namespace = {"__name__": "sanitize_functions"}
exec(compile(text[:text.index("DTYPES = {")], str(source), "exec"), namespace)  # the definitions only
import ml_dtypes  # noqa: E402
import numpy  # noqa: E402

dtypes = {"bfloat16": ml_dtypes.bfloat16, "float16": numpy.float16, "float32": numpy.float32, "float64": numpy.float64}
for arg in sys.argv[1:]:
    family, dtype = arg.split(":")
    os.environ["CUPYFLASH_FAMILY"] = family
    namespace["functions"](dtypes[dtype])
namespace["cupy"].cuda.Device().synchronize()
print("sanitize_functions: done")
