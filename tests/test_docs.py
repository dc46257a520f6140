"""The docs match the code (issue 19): every public function and builder has numpydoc Parameters and
Returns sections that name each of its parameters, and the docstrings and the README state the same
measured cost of the deterministic backward."""

import inspect
import os
import re

import pytest

import cupyflash
from cupyflash import _api

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "README.md")

PUBLIC = {name: getattr(cupyflash, name) for name in cupyflash.__all__
          if inspect.isfunction(getattr(cupyflash, name))}
PUBLIC.update({f"BlockMask.{m}": getattr(cupyflash.BlockMask, m) for m in ("from_dense", "longformer", "bigbird")})
PUBLIC.update({f"VirtualRing.{m}": getattr(cupyflash.VirtualRing, m) for m in ("create", "run")})


def _section(doc, title):
    """The body lines of a numpydoc section (up to the next section's title), or None."""
    lines = inspect.cleandoc(doc).splitlines()
    titles = [i for i in range(len(lines) - 1) if lines[i].strip() and set(lines[i + 1]) == {"-"}]
    for n, i in enumerate(titles):
        if lines[i] == title:
            return lines[i + 2:titles[n + 1] if n + 1 < len(titles) else len(lines)]
    return None


def _documented(doc):
    """Parameter names of the Parameters section: entries start at column 0 (``a, b : type`` or ``a, b``)."""
    names = set()
    for line in _section(doc, "Parameters") or []:
        match = re.match(r"(\w+(?:, \w+)*)\s*(?::|$)", line)
        if match and not line.startswith(" "):
            names.update(match.group(1).split(", "))
    return names


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_docstrings_document_every_parameter(name):
    """Regression: BlockMask.bigbird and .longformer had no Parameters or Returns sections, and
    zigzag_unshard's docstring omitted axis."""
    function = PUBLIC[name]
    doc = function.__doc__
    assert _section(doc, "Parameters") is not None, f"{name}: no Parameters section"
    assert _section(doc, "Returns") is not None, f"{name}: no Returns section"
    wanted = [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]
    missing = [p for p in wanted if p not in _documented(doc)]
    assert not missing, f"{name}: parameters not documented: {missing}"


def _deterministic_cost(text):
    """(range, details) of "N-M% ... Hopper backward (details; bench/NOTES.md)" in ``text``, the details
    holding at least one more percentage."""
    text = " ".join(text.split())
    match = re.search(r"(\d+-\d+)% [^.;]{0,40}Hopper backward \(([^()]*\d+%[^()]*); `?bench/NOTES\.md`?\)", text)
    return match and match.groups()


def test_deterministic_cost_is_the_same_in_the_docstrings_and_the_readme():
    """Regression: the docstrings said 8-14% (an older measurement), the README 4-19%."""
    with open(README, encoding="utf-8") as f:
        readme = _deterministic_cost(f.read())
    assert readme is not None, "the README no longer states the deterministic mode's cost"
    assert _deterministic_cost(_api._DETERMINISTIC_DOC) == readme
    for function in (cupyflash.flash_attention_backward, cupyflash.flash_attention_vjp,
                     cupyflash.flash_attention_varlen_backward, cupyflash.flash_attention_varlen_vjp):
        assert _deterministic_cost(function.__doc__) == readme, function.__name__
