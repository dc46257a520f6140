"""Pytest configuration: make ``tests/helpers.py`` importable as ``helpers``, the options, and the fixtures
the test modules share."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def pytest_addoption(parser):
    parser.addoption("--all-variants", action="store_true",
                     help="test_compile: build every kernel variant for every architecture (see its docstring)")
    parser.addoption("--compile-report", action="store_true",
                     help="test_compile: print registers, stack frame and spill bytes of every build")


@pytest.fixture(scope="session")
def compiled_kernels():
    """Compile every kernel variant once, in parallel, so no GPU test pays for serial compiles."""
    from cupyflash import _families, _kernels

    _kernels.precompile(_families.VARIANTS)
