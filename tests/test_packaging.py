"""The sdist and its metadata (issue 19): the sdist carries the test suite with its support files, and
the metadata names the license, the Python versions and the project's address. Builds the sdist offline
in a temporary folder with the setuptools of this environment (about a second)."""

import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """(member names relative to the sdist's top folder, PKG-INFO text) of a fresh sdist of ROOT."""
    if not os.path.exists(os.path.join(ROOT, "setup.cfg")):
        pytest.skip("not a source tree (no setup.cfg beside tests/)")
    out = tmp_path_factory.mktemp("sdist")
    # egg_info --egg-base keeps the build's egg-info out of the source tree.
    command = [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "egg_info", "--egg-base", str(out),
               "sdist", "--dist-dir", str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    (archive,) = out.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        names = [m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name and m.isfile()]
        top = tar.getmembers()[0].name.split("/")[0]
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    return set(names), pkg_info


def test_sdist_carries_the_test_support_files(sdist):
    """Regression: tests/conftest.py, helpers.py and cases.py were missing, so no test ran from an sdist."""
    names, _ = sdist
    wanted = {f"tests/{f}" for f in os.listdir(os.path.join(ROOT, "tests")) if f.endswith(".py")}
    assert {"tests/conftest.py", "tests/helpers.py", "tests/cases.py"} <= wanted
    assert wanted <= names, f"missing from the sdist: {sorted(wanted - names)}"
    assert {"LICENSE", "README.md", "tools/gen_wgmma.py", "bench/ring.py", "kernels_cu/generated/wgmma_ops.cuh",
            "kernels_cu/sm90/fwd.cu"} <= names
    assert not [n for n in names if n.endswith(".pyc") or n.startswith("bench/runs/")]


def test_metadata_has_license_python_versions_and_urls(sdist):
    """Regression: the metadata had no license file, Python-version classifiers or URLs."""
    _, pkg_info = sdist
    lines = set(pkg_info.splitlines())
    # Newer setuptools write an SPDX license as License-Expression.
    assert lines & {"License: BSD-3-Clause", "License-Expression: BSD-3-Clause"}
    assert {"License-File: LICENSE", "Requires-Python: >=3.9",
            "Home-page: https://github.com/cupyflash/cupyflash",
            "Project-URL: Source, https://github.com/cupyflash/cupyflash",
            "Classifier: License :: OSI Approved :: BSD License",
            "Classifier: Topic :: Scientific/Engineering"} <= lines
    versions = {line.rsplit(":: ", 1)[1] for line in lines if line.startswith("Classifier: Programming Language :: Python :: 3.")}
    assert versions == {"3.9", "3.10", "3.11", "3.12", "3.13"}
