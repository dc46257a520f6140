"""The benchmark scripts of bench/ on the CPU (issue 19).

Each script answers ``--help`` without CuPy, and without a GPU, or without CuPy, prints one line (what is
missing, what it needs) and exits with status 2, never a traceback. Those runs happen in two subprocesses
(this machine's CuPy, and a CuPy that does not import), each running every script as ``__main__`` in
turn, so that CuPy's import (a second or more) is paid once. The rest runs the scripts' host-side pieces
in this process with fake timings: the harness's FLOP counts and tables, the rows and reports of bench.py,
masks.py, decode.py and host.py, and host.py's calls on cupyflash's NumPy twin.
"""

import concurrent.futures
import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCRIPTS = ("bench", "masks", "decode", "ring", "host", "compile_time")
#: Arguments of a run that would need the GPU, by script (none needs any).
RUN_ARGS = {}
#: A stand-in for CuPy that cannot be imported, for the "no CuPy" runs.
NO_CUPY = 'raise ImportError("No module named \'cupy\' (hidden by the test)")\n'
#: Runs the scripts as __main__ one after the other in one interpreter, as ``python bench/x.py`` would (bench/
#: first on sys.path), so that CuPy (a second or more to import) is imported once for all of them. It runs
#: nothing where CuPy sees a GPU (the scripts would start measuring). argv: bench/, then a JSON list of
#: [script, args]; prints a JSON object: "gpu", and per job [exit status, stdout, stderr].
RUN_ALL = r"""
import contextlib, io, json, runpy, sys, traceback
bench, jobs = sys.argv[1], json.loads(sys.argv[2])
try:
    import cupy
    gpu = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:
    gpu = False
results = []
sys.path.insert(0, bench)
for script, args in [] if gpu else jobs:
    sys.argv = [f"{bench}/{script}.py", *args]
    out, err, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            status = 1
    results.append([status, out.getvalue(), err.getvalue()])
print(json.dumps({"gpu": gpu, "results": results}))
"""


def _environment(pythonpath):
    """This environment with ``pythonpath`` put first on PYTHONPATH, and no CUPYFLASH_FAMILY."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*(str(p) for p in pythonpath), *inherited])}
    env.pop("CUPYFLASH_FAMILY", None)
    return env


def _run_all(pythonpath, jobs):
    """(whether CuPy sees a GPU, a CompletedProcess per job) of the jobs [script, args] run by RUN_ALL."""
    done = subprocess.run([sys.executable, "-c", RUN_ALL, str(BENCH), json.dumps(jobs)], capture_output=True,
                          text=True, env=_environment(pythonpath), cwd=ROOT, timeout=120, check=True)
    report = json.loads(done.stdout.splitlines()[-1])
    return report["gpu"], [subprocess.CompletedProcess(job, *result) for job, result in zip(jobs, report["results"])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every script with the arguments of a run on this machine's CuPy, and with --help and a run under a
    CuPy that does not import; two interpreters, at once."""
    hidden = tmp_path_factory.mktemp("no_cupy")
    (hidden / "cupy").mkdir()
    (hidden / "cupy" / "__init__.py").write_text(NO_CUPY)
    run_jobs = [[script, RUN_ARGS.get(script, [])] for script in SCRIPTS]
    help_jobs = [[script, ["--help"]] for script in SCRIPTS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        here = pool.submit(_run_all, [ROOT], run_jobs)
        no_cupy = pool.submit(_run_all, [hidden, ROOT], help_jobs + run_jobs)
        gpu, ran = here.result()
        _, ran_without_cupy = no_cupy.result()
    results = {"gpu": gpu}
    results.update({(script, "run"): result for script, result in zip(SCRIPTS, ran)})
    results.update({(script, "help"): result for script, result in zip(SCRIPTS, ran_without_cupy)})
    results.update({(script, "no_cupy"): result for script, result in zip(SCRIPTS, ran_without_cupy[len(SCRIPTS):])})
    return results


def _one_line_exit(result, script):
    """The result of a script that could not run: status 2, no traceback, the last stderr line its message."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(f"{script}.py needs "), result.stderr
    return lines


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(runs, script):
    result = runs[script, "help"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {script}.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_gpu_exits_with_one_line(runs, script):
    if runs["gpu"]:
        pytest.skip("this machine has a GPU: the scripts would run")
    lines = _one_line_exit(runs[script, "run"], script)
    assert "needs a CUDA GPU" in lines[-1] or "CuPy is not importable" in lines[-1]


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_cupy_exits_with_one_line(runs, script):
    result = runs[script, "no_cupy"]
    lines = _one_line_exit(result, script)
    assert len(lines) == 1 and result.stdout == ""
    assert "CuPy is not importable" in lines[0] and "install cupy-cuda12x or cupy-cuda13x" in lines[0]


# ------------------------------------------------------------------------------ the scripts as modules


@pytest.fixture(scope="module")
def bench_modules():
    """bench/'s scripts imported as modules (bench/ first on sys.path, as ``python bench/x.py`` has it)."""
    names = ("harness", "bench", "masks", "host", "decode", "ring")
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    sys.path.insert(0, str(BENCH))
    try:
        yield types.SimpleNamespace(**{name: importlib.import_module(name) for name in names})
    finally:
        sys.path.remove(str(BENCH))
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def _visible_mask(seqlen_q, seqlen_k, left, right):
    """Query i sees key j iff d - left <= j <= d + right, d = i + seqlen_k - seqlen_q (-1: unbounded)."""
    diagonal = numpy.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    keys = numpy.arange(seqlen_k)[None, :]
    visible = numpy.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        visible &= keys >= diagonal - left
    if right >= 0:
        visible &= keys <= diagonal + right
    return visible


def test_flop_formulas(bench_modules):
    h = bench_modules.harness
    assert h.forward_flops(2, 4, 128, 256, 64, False) == 4 * 2 * 4 * 128 * 256 * 64
    assert h.forward_flops(2, 4, 128, 256, 64, True) == 2 * 2 * 4 * 128 * 256 * 64
    assert h.backward_flops(10.0) == 25.0
    assert h.pair_flops(1000, 128) == 4 * 128 * 1000
    rng = numpy.random.default_rng(0)
    for seqlen_q, seqlen_k in ((97, 113), (113, 97), (1, 203), (64, 64)):
        for left, right in ((-1, -1), (-1, 0), (5, 0), (17, 3), (0, -1)):
            want = int(_visible_mask(seqlen_q, seqlen_k, left, right).sum())
            assert h.window_pairs(seqlen_q, seqlen_k, left, right) == want, (seqlen_q, seqlen_k, left, right)
    layout = rng.random((1, 3, 4, 5)) < 0.5
    dense = numpy.repeat(numpy.repeat(layout, 32, axis=2), 32, axis=3)[..., :100, :150]
    assert h.block_pairs(layout, (32, 32), 100, 150, 2, 3) == 2 * int(dense.sum())
    assert h.varlen_pairs((3, 5)) == 9 + 25
    assert h.varlen_pairs((3, 5), (-1, 0)) == 6 + 15
    assert h.random_block_layout(0.0, 0, 2, 3, 3).sum() == 2 * 3  # the diagonal only


def test_bench_grid_and_table(bench_modules):
    bench, h = bench_modules.bench, bench_modules.harness
    args = bench.parse_args(["--quick"])
    _, rows, settings, memory = bench.resolve(args)
    assert len(rows) == 8 and not memory and settings.timing == "back-to-back"
    row = rows[0]
    assert (row.dtype, row.headdim, row.causal, row.seqlen, row.batch, row.heads) == ("bf16", 64, False, 1024, 16, 32)
    assert row.flops_fwd == 4 * 16 * 32 * 1024 * 1024 * 64 and row.flops_bwd == 2.5 * row.flops_fwd
    assert bench.resolve(bench.parse_args(["--per-call"]))[2].timing == "per-call"
    results = {"cupyflash": {"fwd": h.measured([1.0, 2.0, 30.0], 4e9), "bwd": h.failed(ValueError("no")),
                             "bwd_det": h.skipped("why")},
               "torch_fa2": {"fwd": h.measured([1.0], 1e9), "bwd": h.measured([1.0], 1e9)}}
    lines = bench.table_lines([row], [results], settings)
    header, line = lines[3], lines[4]
    assert len(header) == len(line) == len(lines[2])
    cells = [c.split() for c in line.split("|")]
    assert cells[1] == ["2.0", "n/a", "skip"] and cells[2] == ["-"] and cells[3] == ["1.0", "1.0"]
    assert cells[5] == ["2.00", "-"] and cells[6] == ["-", "-"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--dtypes", "bf16,fp8"])


def test_masks_rows(bench_modules):
    masks = bench_modules.masks
    rows = {row.key: row for row in masks.build_rows(quick=False)}
    assert len(rows) == 7 and len(masks.build_rows(quick=True)) == 6
    assert rows["window"].visible_pairs / rows["window"].area == pytest.approx(0.0606, abs=1e-4)
    assert rows["causal"].visible_pairs == 16 * 16384 * 16385 // 2
    assert rows["varlen"].flops_fwd == 4 * 128 * 16 * sum(n * n for n in rows["varlen"].lengths)
    assert 0.25 < rows["block25"].visible_pairs / rows["block25"].area < 0.27
    plan = "\n".join(masks.plan_lines(list(rows.values()), bench_modules.harness.Settings(3, 20, True, True), "out"))
    assert "block-sparse 25%" in plan and "max_seqlen_q = max_seqlen_k" in plan


def test_decode_table(bench_modules):
    results = {"decode": [{"batch": 8, "context": 32768, "dense": 3.98, "page16": 3.84, "page1": 3.841, "fa2": None}],
               "prefill": {"seqlen_q": 512, "context": 32768, "kvcache": 627.2, "dense_forward": 639.0},
               "calls": {"call_us": 27.94, "graph_replay_us": 13.3}}
    lines = bench_modules.decode.table_lines(results)
    assert "| 8 x 32768 | 3.98 | 3.84 | 3.84 | n/a | n/a |" in lines
    assert lines[-2] == "Chunked prefill 512 x 32768 causal, TFLOP/s: kvcache 627, dense forward 639"
    assert lines[-1] == "Decode call (batch 1, 4k): 27.9 us per call from Python, 13.3 us per graph replay"


def test_grouped_table_notes(bench_modules):
    h = bench_modules.harness
    groups = (("", (("name", -6, lambda item: item),)), ("A", (("x", 4, lambda item: "1"), ("y", 4, lambda item: "2"))))
    lines = h.grouped_table(groups, [("ab",), ("cd",)],
                            note=lambda label, item: "n/a (none)" if label == "A" and item == "cd" else None)
    assert lines[1] == "name   |    x    y"
    assert lines[2] == "ab     |    1    2" and lines[3] == "cd     | n/a (none)"


def test_host_rows_and_table(bench_modules):
    host, h = bench_modules.host, bench_modules.harness
    assert [row.key for row in host.ROWS] == ["fwd", "fwd_512", "bwd", "bwd_det", "varlen", "decode_append", "decode",
                                              "decode_paged"]
    assert {row.key: row.target_us for row in host.ROWS}["decode_paged"] == 15
    results = {"fwd": {"cupyflash": {"us": 20.0, "gpu_us": 3.0, "loops_us": [20.0]},
                       "torch_fa2": {"us": 15.5, "gpu_us": 3.0, "loops_us": [15.5]}},
               "bwd": {"cupyflash": {"us": 50.0, "gpu_us": 45.0, "loops_us": [50.0]}},
               "varlen": {"cupyflash": h.failed(RuntimeError("boom"))}}
    lines = host.table_lines(host.ROWS, results, 500, 5)
    fwd = next(line for line in lines if line.startswith("forward (1, 128"))
    assert fwd.split()[-8:] == ["20.0", "3.0", "25", "0.80", "15.5", "3.0", "-", "-"]
    bwd = next(line for line in lines if line.startswith("backward (1, 128"))
    assert "1.25*" in bwd
    assert "targets met: 1 of 8" in lines
    assert any("bwd: device time 45.0 us" in line for line in lines)
    assert any("varlen: n/a (RuntimeError: boom)" in line for line in lines)
    stats = {("~", 0, "<built-in method cupy.cuda.driver.launchKernel>"): (1000, 1000, 0.1, 0.1, {}),
             ("/lib/cupy/_creation/basic.py", 7, "empty"): (1500, 1500, 0.1, 0.1, {}),
             ("/lib/ctypes/__init__.py", 9, "cast"): (500, 500, 0.1, 0.1, {}),
             ("/repo/cupyflash/_api.py", 1, "flash_attention"): (500, 500, 0.1, 0.1, {}), ("x.py", 1, "f"): (1, 1, 0, 0, {})}
    assert host.driver_call_lines(stats, list(stats), 500) == [
        "    3.00  /lib/cupy/_creation/basic.py:7(empty)", "    2.00  {built-in method cupy.cuda.driver.launchKernel}",
        "    1.00  /lib/ctypes/__init__.py:9(cast)"]
    assert host.parse_args(["--profile", "bwd"]).profile == "bwd"
    with pytest.raises(SystemExit):
        host.parse_args(["--profile", "nothing"])


# ------------------------------------------------------------------- the calls, on cupyflash's NumPy twin


@pytest.fixture
def numpy_as_cupy(bench_modules, monkeypatch):
    """CuPy replaced by NumPy (the calls then run cupyflash's NumPy twin) and the harness's device steps by
    stand-ins that call the timed function once: what ab.py and host.py build and call, checked against the
    public API on the CPU. cupyflash modules first imported under the stand-in are dropped afterwards."""
    fake = types.ModuleType("cupy")
    fake.__path__ = []  # a package, for cupyflash's `from cupy.cuda import function`
    fake.ndarray = type("NoDeviceArray", (), {})  # no array is a CuPy array: cupyflash takes the NumPy path
    fake.asarray, fake.asnumpy, fake.full = numpy.asarray, numpy.asarray, numpy.full
    fake.random = types.SimpleNamespace(RandomState=numpy.random.default_rng)
    fake.cuda = types.ModuleType("cupy.cuda")
    fake.cuda.function = fake.cuda.driver = types.SimpleNamespace()  # imported by cupyflash._families
    fake.cuda.runtime = types.SimpleNamespace(getDeviceProperties=lambda device: {"l2CacheSize": 0}, getDevice=lambda: 0)
    fake.cuda.Device = lambda: types.SimpleNamespace(id=0)
    loaded = {name for name in sys.modules if name.split(".")[0] == "cupyflash"}
    package = sys.modules.get("cupyflash")
    attributes = set(vars(package)) if package is not None else set()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake.cuda)
    h = bench_modules.harness
    timed = []

    def time_queued(call, calls, host_ms):
        call()
        timed.append(calls)
        return [1.0] * calls

    for name, stand_in in (("synchronize", lambda: None), ("release_cached_memory", lambda peers=None: None),
                           ("host_ms_per_call", lambda call: (call(), 0.01)[1]), ("time_queued", time_queued),
                           ("host_loop", lambda call, calls: (call(), 2e-5)[1])):
        monkeypatch.setattr(h, name, stand_in)
    yield bench_modules, timed
    for name in [name for name in sys.modules if name.split(".")[0] == "cupyflash" and name not in loaded]:
        del sys.modules[name]
    for attribute in set(vars(package)) - attributes if package is not None else ():
        delattr(package, attribute)


def test_host_rows_call_the_public_api(numpy_as_cupy, monkeypatch):
    import dataclasses

    modules, _ = numpy_as_cupy
    host = modules.host
    monkeypatch.setattr(host, "WARMUP", 0)
    for row in host.ROWS:
        small = dataclasses.replace(row, shape=(1, 64, 2, 64)) if row.kind in ("fwd", "bwd") else row
        entry = host.measure(small, "cupyflash", None, calls=2, repeats=2)
        assert entry == {"us": 20.0, "loops_us": [20.0, 20.0], "gpu_us": 1000.0}, (row.key, entry)
    lines = host.profile(dataclasses.replace(host.ROWS[0], shape=(1, 64, 2, 64)), calls=2)
    assert sum("by tottime" in line or "by cumulative" in line for line in lines) == 2
    assert lines[-1].startswith("CuPy and ctypes functions of those lists, calls per call (2 calls):")
