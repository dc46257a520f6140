"""Pytest configuration: make ``tests/helpers.py`` importable as ``helpers``, the options, the fixtures
the test modules share, and the one place the ``gpu`` mark takes effect: a test (or a param) marked
``gpu`` is skipped cleanly without a GPU, and with one it runs after every kernel variant is compiled
(once per session, in parallel). Conditions of single tests (two GPUs, a Hopper GPU, nvdisasm) stay
with the tests."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from helpers import gpu_available  # noqa: E402 (after the path)

_NO_GPU = pytest.mark.skip(reason="no CUDA GPU available")


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


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(_NO_GPU)


@pytest.fixture(autouse=True)
def _gpu_kernels_compiled(request):
    """Every test marked ``gpu`` runs after :func:`compiled_kernels`."""
    if request.node.get_closest_marker("gpu") is not None:
        request.getfixturevalue("compiled_kernels")
