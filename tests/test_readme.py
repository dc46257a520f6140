"""The README's NumPy examples run as written (issue 19: every README example was CuPy, so none ran on a
CPU machine). The blocks marked ``<!-- readme-test: numpy -->`` are extracted and executed, each in a
fresh namespace; their own asserts compare the results with cupyflash.reference."""

import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "README.md")
MARKER = "<!-- readme-test: numpy -->"
#: A marker, then a fenced python block (its body is group 1).
_BLOCK = re.compile(re.escape(MARKER) + r"\s*\n```python\n(.*?)\n```", re.DOTALL)


def _blocks():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    return text, _BLOCK.findall(text)


def test_every_marker_has_its_block():
    """A marker whose block was moved or lost its fence would silently drop out of the test below."""
    text, blocks = _blocks()
    assert len(blocks) == text.count(MARKER) > 0
    body = "\n".join(blocks)
    for name in ("flash_attention(", "flash_attention_backward(", "flash_attention_vjp(", "window_size=",
                 "block_mask=", "flash_attention_varlen(", "flash_attention_with_kvcache(", "merge_attention_states(",
                 "VirtualRing.run("):
        assert f"cupyflash.{name}" in body or name in body, f"the README's NumPy examples no longer show {name}"


@pytest.mark.parametrize("index", range(len(_blocks()[1])))
def test_readme_numpy_example_runs(index):
    code = _blocks()[1][index]
    assert "cupy." not in code.replace("cupyflash.", ""), "a NumPy example must not need CuPy"
    exec(compile(code, f"README.md NumPy example {index + 1}", "exec"), {"__name__": "readme_example"})  # noqa: S102
