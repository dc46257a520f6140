"""Pytest configuration: make ``tests/helpers.py`` importable as ``helpers``, and the fixtures the test
modules share."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def compiled_kernels():
    """Compile every kernel variant once, in parallel, so no GPU test pays for serial compiles."""
    from cupyflash import _families, _kernels

    _kernels.precompile(_families.VARIANTS)
