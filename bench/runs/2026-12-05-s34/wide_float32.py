"""tests/test_gpu_mods.py::test_wide_kernels_with_both_functions[float32-] run twice outside pytest (no
conftest precompile): whether its dv error is the same run to run, in the tree it runs from."""
import os
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import test_gpu_mods  # noqa: E402
from _pytest.monkeypatch import MonkeyPatch  # noqa: E402

for attempt in range(3):
    try:
        test_gpu_mods.test_wide_kernels_with_both_functions("float32", "", MonkeyPatch())
        print(attempt, "passed", flush=True)
    except AssertionError as exc:
        print(attempt, str(exc).splitlines()[0][:200], flush=True)
