"""The benchmark scripts of bench/ on the CPU (issue 19).

Each script answers ``--help`` without CuPy, and without a GPU, or without CuPy, prints one line (what is
missing, what it needs) and exits with status 2, never a traceback. Those runs happen in two subprocesses
(this machine's CuPy, and a CuPy that does not import), each running every script as ``__main__`` in
turn, so that CuPy's import (a second or more) is paid once. The rest runs the scripts' host-side pieces
in this process with fake timings: the harness's FLOP counts and tables, the rows and reports of bench.py,
masks.py, decode.py, host.py and ab.py, the calls host.py and ab.py make (on cupyflash's NumPy twin), and
ab.py's supervision of its worker processes (crashes, hangs, a process that cannot start, a wrong tree)
with fake workers.
"""

import collections
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
SCRIPTS = ("bench", "masks", "decode", "ring", "host", "ab", "compile_time", "tiles", "mma_probe", "rotary", "training",
           "mods", "fp8")
#: Arguments of a run that would need the GPU (ab.py needs two source trees first).
RUN_ARGS = {"ab": ["--old", str(ROOT), "--new", str(ROOT)], "tiles": ["--tiles", "192,128,4"]}
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
    names = ("harness", "bench", "masks", "host", "ab", "decode", "ring", "tiles", "mma_probe", "mods", "training")
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
    assert h.forward_flops(2, 4, 128, 128, 64, True) == 2 * 2 * 4 * 128 * 128 * 64  # half, for equal lengths
    # bottom-right aligned: 128 queries over 256 keys see 128 * 128 + 128^2 / 2 (continuous) of the pairs
    assert h.forward_flops(2, 4, 128, 256, 64, True) == 4 * 2 * 4 * (128 * 256 - 128 * 128 / 2) * 64
    assert h.forward_flops(2, 4, 256, 128, 64, True) == 4 * 2 * 4 * (128 * 128 / 2) * 64
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


def test_warm_up_runs_its_calls_and_at_least_warm_ms(bench_modules, monkeypatch):
    """The harness's warm-up makes its ``count`` calls, then more until WARM_MS have passed on the host's
    clock (a short kernel's few calls end before the GPU's clocks are up), synchronizing every ten calls
    and at the end; a slow call stops it after ``count``."""
    h = bench_modules.harness
    now = [0.0]
    syncs = []
    monkeypatch.setattr(h.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(h, "synchronize", lambda: syncs.append(now[0]))

    def call(seconds):
        def run():
            now[0] += seconds
        return run

    assert h.warm_up(call(0.001), 3) == 100  # 1 ms calls: 100 of them fill 100 ms
    assert len(syncs) == 11 and syncs[-1] == pytest.approx(0.1)
    syncs.clear()
    assert h.warm_up(call(0.5), 3) == 3  # 500 ms calls: the count alone
    assert len(syncs) == 1
    assert "at least 100 ms" in h.TIMINGS["back-to-back"]
    assert h.warmup_text(h.Settings(3, 20, True, True)) == "warm-up 3 calls and 100 ms"


def test_bench_grid_and_table(bench_modules):
    bench, h = bench_modules.bench, bench_modules.harness
    args = bench.parse_args(["--quick"])
    _, rows, settings, memory = bench.resolve(args)
    assert len(rows) == 8 and not memory and settings.timing == "back-to-back"
    row = rows[0]
    assert (row.dtype, row.headdim, row.causal, row.seqlen, row.batch, row.heads) == ("bf16", 64, False, 1024, 16, 32)
    assert row.flops_fwd == 4 * 16 * 32 * 1024 * 1024 * 64 and row.flops_bwd == 2.5 * row.flops_fwd
    assert bench.resolve(bench.parse_args(["--per-call"]))[2].timing == "per-call"
    tf32 = bench.resolve(bench.parse_args(["--precision", "tf32"]))[2]
    assert bench.settings_precision(bench.build_grid(("fp32",), (64,), (False,), (1024,))[0], tf32) == "tf32"
    assert bench.settings_precision(row, tf32) == "highest" and settings.precision == "highest"
    results = {"cupyflash": {"fwd": h.measured([1.0, 2.0, 30.0], 4e9), "bwd": h.failed(ValueError("no")),
                             "bwd_det": h.skipped("why")},
               "torch_fa2": {"fwd": h.measured([1.0], 1e9), "bwd": h.measured([1.0], 1e9)}}
    lines = bench.table_lines([row], [results], settings)
    header, line = lines[3], lines[4]
    assert len(header) == len(line) == len(lines[2])
    cells = [c.split() for c in line.split("|")]
    assert cells[1] == ["2.0", "n/a", "skip"] and cells[2] == ["-"] and cells[3] == ["1.0", "1.0"]
    assert cells[5] == ["2.00", "-"] and cells[6] == ["-", "-"]
    # float32 rows go to a second table, against torch's memory-efficient and math backends
    wide = bench.build_grid(("fp32",), (128,), (True,), (4096,))[0]
    wide_results = {"cupyflash": {"fwd": h.measured([1.0], 8e9)}, "torch_efficient": {"fwd": h.measured([1.0], 2e9)},
                    "torch_math": {"fwd": h.failed(RuntimeError("out of memory"))}}
    lines = bench.table_lines([row, wide], [results, wide_results], settings)
    assert lines[5] == "" and "eff" in lines[6] and "flash/math" in lines[6]
    cells = [c.split() for c in lines[8].split("|")]
    assert cells[0][:2] == ["fp32", "128"] and cells[3] == ["2.0", "-"] and cells[4] == ["n/a", "-"]
    assert cells[5] == ["4.00", "-"] and cells[6] == ["-", "-"]
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


def test_mods_rows_and_functions(bench_modules):
    """bench/mods.py: its rows' visible pairs (the document rows' against a brute-force count; the ragged
    row's boundaries inside 128-row blocks, the document row's on them), the plan, and its score_mods
    giving the built-ins they are timed against (on the NumPy twin, small sizes)."""
    import dataclasses

    import cupyflash

    mods = bench_modules.mods
    rows = {row.key: row for row in mods.build_rows(quick=True)}
    assert list(rows) == ["softcap", "alibi", "document", "ragged", "relbias"]
    doc = dataclasses.replace(rows["document"], seqlen=96).documents()
    assert doc.shape == (1, 96) and len(numpy.unique(doc)) == mods.DOCUMENTS
    pairs = (doc[0][:, None] == doc[0][None, :]) & numpy.tri(96, dtype=bool)
    assert dataclasses.replace(rows["document"], seqlen=96).visible_pairs() == mods.HEADS * pairs.sum()
    for key, inside in (("document", 0), ("ragged", mods.DOCUMENTS - 1)):
        doc = rows[key].documents()[0]
        starts = numpy.flatnonzero(numpy.diff(doc)) + 1
        assert len(numpy.unique(doc)) == mods.DOCUMENTS and (starts % 128 != 0).sum() == inside, key
        pairs = (doc[:, None] == doc[None, :]) & numpy.tri(doc.size, dtype=bool)
        assert rows[key].visible_pairs() == mods.HEADS * pairs.sum()
    assert rows["softcap"].flops("bwd") == 2.5 * rows["softcap"].flops("fwd")
    plan = "\n".join(mods.plan_lines(list(rows.values()), bench_modules.harness.Settings(3, 20, True, True)))
    assert "target >= 0.85x, >= 2.0x Flex" in plan and "< 1.0 ms" in plan
    rng = numpy.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 24, mods.HEADS, 8)).astype(numpy.float32) for _ in range(3))
    for key, builtin in (("softcap", {"softcap": mods.CAP}), ("alibi", {"alibi_slopes": mods.slopes()})):
        numpy.testing.assert_allclose(cupyflash.flash_attention(q, k, v, score_mod=mods.score_mod_of(rows[key])),
                                      cupyflash.flash_attention(q, k, v, **builtin), rtol=1e-5, atol=1e-6)
    table = rng.standard_normal((mods.HEADS, mods.BUCKETS)).astype(numpy.float32)
    out = cupyflash.flash_attention(q, k, v, score_mod=mods.score_mod_of(rows["relbias"]), score_mod_buffers=(table,))
    assert numpy.isfinite(out).all()


def test_ring_shards_are_rows_of_one_problem(bench_modules):
    """bench/ring.py: each rank draws only its rows (zigzag or contiguous), and they are the shards
    cupyflash.zigzag_shard (or a contiguous split) cuts from the whole problem rank 0 draws; q and dout
    have the query heads, k and v the kv heads (GQA), and the four tensors differ."""
    import cupyflash

    ring = bench_modules.ring
    args = types.SimpleNamespace(heads=4, heads_k=2, headdim=8)
    seqlen, world = 4 * ring.ROW_BLOCK, 4
    whole = ring._problem(numpy, [(0, seqlen)], args, numpy.float32, seed=3)
    assert [x.shape for x in whole] == [(1, seqlen, 4, 8), (1, seqlen, 2, 8), (1, seqlen, 2, 8), (1, seqlen, 4, 8)]
    assert not numpy.array_equal(whole[0], whole[3]) and not numpy.array_equal(whole[1], whole[2])
    rows = seqlen // world
    for layout in ("zigzag", "contiguous"):
        for rank in range(world):
            shard = ring._problem(numpy, ring._spans(seqlen, world, rank, layout), args, numpy.float32, seed=3)
            for x, part in zip(whole, shard):
                want = (cupyflash.zigzag_shard(x, world, rank) if layout == "zigzag"
                        else x[:, rank * rows:(rank + 1) * rows])
                numpy.testing.assert_array_equal(part, want)


def test_tiles_rows_and_dry_run(bench_modules, capsys):
    tiles = bench_modules.tiles
    args = tiles.parse_args(["--headdim", "96", "--tiles", "192,64,3", "128,128,2", "--seqlens", "2048,32768",
                             "--causal", "1"])
    assert args.tiles == [(192, 64, 3), (128, 128, 2)]
    assert tiles.rows(args) == [(2048, 8, 21, True), (32768, 1, 21, True)]
    with pytest.raises(SystemExit):
        tiles.parse_args(["--tiles", "192,128"])
    assert tiles.main(["--tiles", "192,128,4", "--seqlens", "1024", "--causal", "0,1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "head dim 64, bf16" in out and "  1024  " in out and "  1024c" in out


def _fragment_a00_b00(name, a, b):
    """Row 0 of A and column 0 of B from mma_probe's lane registers, read back through the PTX fragment
    maps (lane = 4 g + t): f64 m8n8k4 a0 = A[g][t], b0 = B[t][g]; tf32 m16n8k8 a0 = A[g][t], a2 = A[g][t + 4],
    b0 = B[t][g], b1 = B[t + 4][g]; bf16 m16n8k16 a0 = A[g][2t, 2t + 1], a2 = A[g][2t + 8, 2t + 9], b0 = B[2t,
    2t + 1][g], b1 = B[2t + 8, 2t + 9][g], low half first."""
    import ml_dtypes

    if name == "f64":
        return [a[t] for t in range(4)], [b[t] for t in range(4)]
    if name == "tf32":
        af, bf = a.view(numpy.float32).reshape(32, 4), b.view(numpy.float32).reshape(32, 2)
        row = [af[t, 0] for t in range(4)] + [af[t, 2] for t in range(4)]
        return row, [bf[t, 0] for t in range(4)] + [bf[t, 1] for t in range(4)]

    def halves(word):
        return list(numpy.array([word & 0xFFFF, word >> 16], numpy.uint16).view(ml_dtypes.bfloat16).astype(numpy.float64))

    a, b = a.reshape(32, 4), b.reshape(32, 2)
    row = [x for t in range(4) for x in halves(int(a[t, 0]))] + [x for t in range(4) for x in halves(int(a[t, 2]))]
    col = [x for t in range(4) for x in halves(int(b[t, 0]))] + [x for t in range(4) for x in halves(int(b[t, 1]))]
    return row, col


def _nvrtc_compiles(source, label, arch):
    """Compiles ``source`` to a cubin for ``arch`` with NVRTC alone; the test fails with its log otherwise."""
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(source, f"{label}.cu", (), ())
    try:
        nvrtc.compileProgram(program, (f"--gpu-architecture={arch}",))
    except nvrtc.NVRTCError:
        pytest.fail(f"{label}: {nvrtc.getProgramLog(program)}")
    finally:
        nvrtc.destroyProgram(program)


def test_mma_probe_sources_and_operands(bench_modules):
    """The probe's kernels compile for sm_80 (sm_90 and sm_90a for the Hopper shapes and wgmma) with NVRTC
    alone (the inline mma.sync and wgmma instructions included), and its operands put the case's values
    in row 0 of A against ones in column 0 of B, so that d[0][0] is c plus their sum."""
    probe = bench_modules.mma_probe
    for name in probe.TYPES:
        for source in (probe.throughput_source(name), probe.rounding_source(name)):
            _nvrtc_compiles(source, name, "sm_80")
        values = [0.75 * 2.0**-23, 0.25 * 2.0**-23, 0.375 * 2.0**-23]
        row, col = _fragment_a00_b00(name, *probe.operand_layout(name, values))
        assert float(numpy.dot(row, col)) == sum(values), name
        assert list(row[: len(values)]) == values and not any(row[len(values):]), name
    for name in probe.WGMMA:
        _nvrtc_compiles(probe.wgmma_rounding_source(name), f"wgmma {name}", "sm_90a")
    for name in probe.SM90_TYPES:
        for source in (probe.throughput_source(name), probe.rounding_source(name)):
            _nvrtc_compiles(source, name, "sm_90")
        # the assumed maps cover each element of A, B and D once
        k = probe.ALL_TYPES[name][8]
        A, B = numpy.arange(16 * k).reshape(16, k) + 1.0, numpy.arange(k * 8).reshape(k, 8) + 1.0
        a, b = probe.f64_fragments(name, A, B)
        assert sorted(a.ravel()) == sorted(A.ravel()) and sorted(b.ravel()) == sorted(B.ravel()), name
        D = numpy.arange(128.0).reshape(16, 8)
        d = numpy.array([[D[g + 8 * (i // 2), 2 * t + i % 2] for i in range(4)] for g, t in (divmod(n, 4) for n in range(32))])
        assert (probe.f64_result(d) == D).all(), name
    # the exact FMA chain: 1 + 2^-53 + 2^-53 rounds to 1 one FMA at a time and to 1 + 2^-52 from the
    # other end, where 2^-53 + 2^-53 is exact first
    a, b = [1.0, 2.0**-53, 2.0**-53], [1.0, 1.0, 1.0]
    assert probe.fma_chain(a, b, 0.0, probe.ORDERS["FMAs in column order"](3)) == 1.0
    assert probe.fma_chain(a, b, 0.0, probe.ORDERS["FMAs in reverse order"](3)) == 1.0 + 2.0**-52


def test_training_rounds_take_each_rounds_ratio(bench_modules, monkeypatch):
    """training.py --rounds: the features' order reverses every other round, and a feature's ratio is the
    median over rounds of its time over the plain call's in the same round, so a drift between rounds
    (here the GPU slower by half in the second round) moves no ratio."""
    training = bench_modules.training
    orders = []

    def fake_rows(seqlen, causal, settings, features):
        orders.append(tuple(features))
        slow = 1.5 if len(orders) == 2 else 1.0
        cost = {"plain": 1.0, "sinks": 1.02, "max_score": 1.03, "dropout": 1.4}
        def measurement(ms):
            return {"median_ms": ms, "tflops": 1 / ms, "times_ms": [ms]}

        return [(f, d, measurement(cost[f] * slow * (2.5 if d == "backward" else 1.0)))
                for f in features for d in ("forward", "backward") if not (f == "max_score" and d == "backward")]

    monkeypatch.setattr(training, "_rows", fake_rows)
    rows = training._rounds(4096, False, None, 3)
    assert orders == [training.FEATURES, training.FEATURES[::-1], training.FEATURES]
    ratios = {(f, d): r for f, d, _, r in rows}
    assert ratios == pytest.approx({("plain", "forward"): 1.0, ("plain", "backward"): 1.0, ("sinks", "forward"): 1.02,
                                    ("sinks", "backward"): 1.02, ("max_score", "forward"): 1.03,
                                    ("dropout", "forward"): 1.4, ("dropout", "backward"): 1.4})
    assert [(f, d) for f, d, _, _ in rows][:3] == [("plain", "forward"), ("plain", "backward"), ("sinks", "forward")]
    # The time shown is the median of the rounds' medians (1.0 x cost, not the slow round's 1.5 x), as
    # harness.combine_rounds gives it, with every round's median kept.
    dropout = {f: m for f, d, m, _ in rows if d == "forward"}["dropout"]
    assert dropout["median_ms"] == pytest.approx(1.4)
    assert dropout["round_medians_ms"] == pytest.approx([1.4, 2.1, 1.4])
    # With two rounds, the middle of the two (not the slower one, as the upper-middle round gave).
    orders.clear()
    rows = training._rounds(4096, False, None, 2)
    assert {f: m["median_ms"] for f, d, m, _ in rows if d == "forward"}["dropout"] == pytest.approx(1.75)


def test_decode_table(bench_modules):
    results = {"decode": [{"batch": 8, "context": 32768, "dense": 3.98, "page16": 3.84, "page1": 3.841, "fa2": None}],
               "prefill": {"seqlen_q": 512, "context": 32768, "kvcache": 627.2, "dense_forward": 639.0},
               "calls": {"call_us": 27.94, "graph_replay_us": 13.3}}
    lines = bench_modules.decode.table_lines(results)
    assert "| 8 x 32768 | 3.98 | 3.84 | 3.84 | n/a | n/a |" in lines
    assert lines[-2] == "Chunked prefill 512 x 32768 causal, TFLOP/s: kvcache 627, dense forward 639"
    assert lines[-1] == "Decode call (batch 1, 4k): 27.9 us per call from Python, 13.3 us per graph replay"
    cascade = {"requests": 64, "prefix": 8192, "own": 512, "splits": 8, "shared_ms": 0.2, "prefix_ms": 0.1,
               "own_ms": 0.05, "merge_ms": 0.02, "unshared_ms": 0.8, "speedup": 4.0}
    assert bench_modules.decode.table_lines({"cascade": cascade}) == [
        "", "Cascade 64 x (8192 shared in 8 parts + 512 own): 0.200 ms shared, 0.800 ms unshared, 4.00x (alone: "
        "prefix parts 0.100, own 0.050, merges 0.020 ms)"]
    mla = [{"heads": 16, "ms": 0.2, "tbs": 3.0198, "tflops": 57.4, "general_ms": 2.5, "general_tbs": 0.2416}]
    assert bench_modules.decode.table_lines({"mla": mla})[-1] == "| 16 | 0.200 | 3.02 | 57 | 2.500 | 0.24 |"


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
                                              "decode_paged", "prefill"]
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
    assert "targets met: 1 of 8" in lines  # the prefill row has no target
    prefill = next(line for line in lines if line.startswith("prefill chunk"))
    assert prefill.split()[-8:] == ["-"] * 8
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


def test_ab_rows(bench_modules):
    ab, h = bench_modules.ab, bench_modules.harness
    assert len(ab.ROWS) == len(ab.ROWS_BY_KEY) == 40
    for group in {row.group for row in ab.ROWS}:
        assert len({row.family for row in ab.ROWS if row.group == group}) == 1, group
    assert {row.family for row in ab.ROWS if row.key.startswith("sm80_")} == {"sm80"}
    assert [row.key for row in ab.select_rows(True, None)] == list(ab.QUICK)
    assert [row.key for row in ab.select_rows(False, ("bwd_d128*",))] == ["bwd_d128", "bwd_d128_causal",
                                                                          "bwd_d128_causal_det", "bwd_d128_causal_window"]
    with pytest.raises(ValueError, match="matches no row"):
        ab.select_rows(True, ("bwd_d64",))
    rows = ab.ROWS_BY_KEY
    assert rows["fwd_d128_causal"].work == (h.pair_flops(4 * 16 * 4096 * 4097 // 2, 128), "FLOP")
    assert rows["bwd_d64"].work[0] == 2.5 * 4 * 4 * 32 * 4096 * 4096 * 64
    assert rows["decode_b8_32k"].work == (8 * 32768 * 8 * 128 * 2 * 2, "B")
    assert rows["prefill_512_32k"].visible_pairs == 32 * (512 * (32768 - 512) + 512 * 513 // 2)
    assert rows["bwd_d128_causal_window"].visible_pairs == 4 * 16 * h.window_pairs(4096, 4096, 1024, 0)
    assert rows["fwd_gqa"].kv_heads == 8 and "h32/8" in rows["fwd_gqa"].label
    assert rows["decode_b1_131k"].rate_text(0.134) == "4.01 TB/s"
    assert rows["fwd_d128"].rate_text(1.0) == "550 TF/s"
    assert ab.input_set_count(64 << 20, 50 << 20) == 3 and ab.input_set_count(1 << 20, 50 << 20) == ab.MAX_INPUT_SETS
    assert ab.input_set_count(1 << 30, 0) == 1
    assert ab.timed_calls(1.0) == 50 and ab.timed_calls(100.0) == ab.MIN_CALLS and ab.timed_calls(0.0) == ab.MAX_CALLS
    assert ab.alibi_slopes(8)[-1] == numpy.float32(2.0**-8)
    with pytest.raises(SystemExit):
        ab.parse_args(["--old", str(ROOT)])
    with pytest.raises(SystemExit):
        ab.parse_args(["--old", str(ROOT), "--new", str(BENCH)])  # bench/ holds no cupyflash/


def _entry(ms, sample=(1.0, 2.0)):
    return {"median_ms": ms, "times_ms": [ms], "sample": list(sample)}


def test_ab_report(bench_modules):
    ab = bench_modules.ab
    rows = [ab.ROWS_BY_KEY[key] for key in ("fwd_d128", "bwd_d128", "decode_b8_32k", "general_fwd_fp32")]
    rounds = {
        "fwd_d128": {"old": [_entry(1.0), _entry(1.01), _entry(0.99)], "new": [_entry(0.9)] * 3},
        "bwd_d128": {"old": [_entry(2.0)] * 3, "new": [_entry(2.1), _entry(2.1), _entry(2.1, (1.0, 3.0))]},
        "decode_b8_32k": {"old": [_entry(0.27)] * 3, "new": [_entry(0.2754, (1.0, 2.001))] * 3},
        "general_fwd_fp32": {"old": [_entry(0.4)] * 3, "new": [{"error": "RuntimeError: no kernel"}] * 3},
    }
    summaries = {row.key: ab.summarize(row, rounds[row.key]) for row in rows}
    fwd, bwd, decode, general = (summaries[row.key] for row in rows)
    assert fwd["ratio"] == pytest.approx(0.9) and not fwd["slower"] and fwd["old"]["spread"] == pytest.approx(0.02)
    assert bwd["slower"] and not bwd["noisy"] and bwd["difference"] == 0.0
    assert decode["ratio"] == pytest.approx(1.02) and not decode["slower"]
    assert decode["difference"] == pytest.approx(0.001 / 5**0.5) and not decode["mismatch"]
    assert general["ratio"] is None and general["new"]["errors"] == ["RuntimeError: no kernel"]
    lines = ab.table_lines(rows, summaries, 3)
    assert lines[-1].startswith("slowest row: bwd_d128 (bwd bf16 d128 s4096 b4 h16): new/old 1.050")
    assert "rows slower by more than 2%: 1 of 3 compared: bwd_d128" in lines
    assert any("general_fwd_fp32 (new): RuntimeError: no kernel" in line for line in lines)
    bwd_line = next(line for line in lines if line.startswith("bwd bf16 d128"))
    assert "SLOWER" in bwd_line and "2.000" in bwd_line and "2.100" in bwd_line
    assert "new failed" in next(line for line in lines if line.startswith("general fwd fp32"))
    mismatch = ab.summarize(rows[0], {"old": [_entry(1.0, (1.0, 2.0))], "new": [_entry(1.0, (1.0, float("nan")))]})
    assert mismatch["mismatch"] and "MISMATCH" in ab.flag_text(mismatch)
    versions = {name: ab.Version(name, ROOT, ROOT / "cache") for name in ab.VERSIONS}
    compiled = {"old": {"fwd_d128": {"first_call_s": 2.5}}, "new": {}}
    document = json.loads(json.dumps(ab.record(types.SimpleNamespace(rounds=3), versions, rows, compiled, rounds,
                                               {"old": {"default": {"device": "fake"}}}, 12.0)))
    assert [row["key"] for row in document["rows"]] == [row.key for row in rows]
    assert document["rows"][0]["compile"] == {"old": {"first_call_s": 2.5}, "new": None}
    assert "sample" not in document["rows"][0]["rounds"]["old"][0]
    assert document["rows"][1]["summary"]["slower"] and document["versions"]["old"]["environment"]["default"]


#: A fake ab.py worker: ``python -c FAKE_WORKER progress key...``; each key says what the row does.
FAKE_WORKER = r"""
import json, os, sys, time
progress, keys = sys.argv[1], sys.argv[2:]
with open(progress, "a") as f:
    def emit(**event):
        f.write(json.dumps(event) + "\n")
        f.flush()
    if keys[0] == "unstartable":
        print("ImportError: the tree is broken")
        sys.exit(1)
    if keys[0] == "wrong_tree":
        emit(event="fatal", error="cupyflash was imported from elsewhere")
        sys.exit(4)
    emit(event="env", device="fake", family=os.environ.get("CUPYFLASH_FAMILY", ""))
    for key in keys:
        emit(event="start", row=key)
        if key.startswith("crash"):
            print("Segmentation fault (fake)")
            os._exit(139)
        if key.startswith("hang"):
            time.sleep(60)
        emit(event="result", row=key, median_ms=1.0)
"""


@pytest.fixture
def fake_workers(bench_modules, monkeypatch, tmp_path):
    ab = bench_modules.ab
    monkeypatch.setattr(ab, "worker_command", lambda version, mode, progress, keys: [sys.executable, "-c", FAKE_WORKER,
                                                                                     str(progress), *keys])
    monkeypatch.setattr(ab, "ROW_TIMEOUT_S", 1.0)
    monkeypatch.setattr(ab, "POLL_S", 0.05)
    return ab, ab.Version("new", tmp_path, tmp_path / "cache")


def _rows(*keys, family=""):
    return [types.SimpleNamespace(key=key, family=family) for key in keys]


def test_ab_worker_restarts_after_a_crash_and_a_hang(fake_workers, tmp_path):
    ab, version = fake_workers
    environment, results = ab.run_worker(version, _rows("a", "crash1", "b", "hang1", "c", family="sm80"), "time",
                                         tmp_path, "t")
    assert environment == {"device": "fake", "family": "sm80"}
    assert [results[key].get("median_ms") for key in ("a", "b", "c")] == [1.0, 1.0, 1.0]
    assert results["crash1"]["broken"]
    assert "exit status 139 during this row: Segmentation fault (fake)" in results["crash1"]["error"]
    assert results["hang1"]["broken"] and "killed after 1.0 s without progress" in results["hang1"]["error"]


def test_ab_worker_that_cannot_start(fake_workers, tmp_path):
    ab, version = fake_workers
    _, results = ab.run_worker(version, _rows("unstartable", "a"), "time", tmp_path, "t")
    assert all("before its first row: ImportError: the tree is broken" in results[key]["error"] for key in ("unstartable", "a"))
    _, results = ab.run_worker(version, _rows("wrong_tree", "a"), "time", tmp_path, "t")
    assert results["a"] == {"error": "cupyflash was imported from elsewhere", "broken": True}


def test_ab_rounds_skip_broken_rows(fake_workers, tmp_path, capsys):
    ab, version = fake_workers
    rows = _rows("a", "crash1")
    rounds, environments = ab.run_rounds({"old": version, "new": version}, rows, 2, tmp_path)
    assert [len(rounds["a"][name]) for name in ("old", "new")] == [2, 2]
    assert [len(rounds["crash1"][name]) for name in ("old", "new")] == [1, 1]
    assert environments["old"]["default"]["device"] == "fake"
    assert "round 2/2 new" in capsys.readouterr().out


def test_ab_version_environment(bench_modules, tmp_path, monkeypatch):
    ab = bench_modules.ab
    other = tmp_path / "other"
    (other / "cupyflash").mkdir(parents=True)
    (other / "cupyflash" / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(other), "/some/lib"]))
    monkeypatch.setenv("CUPYFLASH_FAMILY", "general")
    version = ab.Version("old", tmp_path / "tree", tmp_path / "cache")
    env = version.environment("")
    assert env["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "tree"), "/some/lib"])
    assert env["CUPY_CACHE_DIR"] == str(tmp_path / "cache") and "CUPYFLASH_FAMILY" not in env
    assert version.environment("sm80")["CUPYFLASH_FAMILY"] == "sm80"
    assert ab.tree_problem(ROOT) is None and "no cupyflash" in ab.tree_problem(tmp_path)
    assert len(ab.tree_digest(ROOT)) == 64


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


def _small(row):
    """The row at a size NumPy computes in milliseconds, its kind, options, dtype and head dim kept."""
    import dataclasses

    heads = {"heads": 2, "heads_k": 1} if row.heads_k else {"heads": 1}
    if row.op in ("decode", "prefill"):
        return dataclasses.replace(row, batch=2, context=64, seqlen=8, **heads)
    return dataclasses.replace(row, batch=1, seqlen=128, lengths=(50, 17, 61) if row.lengths else (), **heads)


def test_ab_rows_call_the_public_api(numpy_as_cupy, monkeypatch):
    modules, timed = numpy_as_cupy
    ab = modules.ab
    monkeypatch.setattr(ab, "WARMUP", 0)
    for row in ab.ROWS:
        entry = ab.run_row(_small(row), "time")
        assert "error" not in entry, (row.key, entry)
        assert entry["median_ms"] == 1.0 and entry["sets"] == 1
        assert 0 < len(entry["sample"]) <= ab.SAMPLES and all(numpy.isfinite(entry["sample"])), row.key
    assert timed[:2] == [ab.ESTIMATE_CALLS, 50]  # 1 ms estimated: 50 calls for 50 ms
    row = _small(ab.ROWS_BY_KEY["bwd_varlen"])
    assert ab.run_row(row, "time")["sample"] == ab.output_sample(ab.make_call(row, 0)[0]())  # inputs from the row's seed
    assert set(ab.run_row(row, "compile")) == {"first_call_s"}


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


def test_ab_worker_main(numpy_as_cupy, monkeypatch, tmp_path):
    modules, _ = numpy_as_cupy
    ab, h = modules.ab, modules.harness
    keys = ("fwd_d64_causal", "decode_b8_32k_paged16")
    monkeypatch.setattr(ab, "ROWS_BY_KEY", {key: _small(ab.ROWS_BY_KEY[key]) for key in keys})
    monkeypatch.setattr(ab, "WARMUP", 0)
    monkeypatch.setattr(h, "require_gpu", lambda *args, **kwargs: None)
    monkeypatch.setattr(h, "environment", lambda torch: {"device": "numpy", "command": "x", "torch": None})
    progress = tmp_path / "progress.jsonl"
    import cupyflash

    tree = Path(cupyflash.__file__).resolve().parent.parent
    assert ab.worker_main("time", str(tree), progress, keys) == 0
    events = ab.read_events(progress)
    assert [e["event"] for e in events] == ["env", "start", "result", "start", "result"]
    assert events[0]["device"] == "numpy" and "command" not in events[0]
    assert [e["row"] for e in events[1:]] == [keys[0], keys[0], keys[1], keys[1]]
    assert all("median_ms" in e for e in events[2::2])
    assert ab.worker_main("time", str(tmp_path), tmp_path / "wrong.jsonl", keys) == ab.EXIT_WRONG_TREE
    assert ab.read_events(tmp_path / "wrong.jsonl")[0]["event"] == "fatal"


def test_rounds_balance_the_systems_order_and_take_the_median_of_medians(bench_modules):
    h = bench_modules.harness
    for n, rounds in ((4, 4), (3, 6), (5, 10), (2, 2)):
        systems = [f"s{i}" for i in range(n)]
        orders = [h.balanced_order(systems, r) for r in range(rounds)]
        assert all(sorted(order) == systems for order in orders)
        # Every system in every place equally often, and right after every other system equally often.
        places = collections.Counter((s, order.index(s)) for order in orders for s in order)
        assert set(places.values()) == {rounds // n} and len(places) == n * n
        follows = collections.Counter((order[i - 1], order[i]) for order in orders for i in range(1, n))
        assert len(follows) == n * (n - 1) and set(follows.values()) == {rounds // n}
    assert h.balanced_order([], 3) == [] and h.balanced_order(["a"], 5) == ["a"]
    rounds = [h.measured([1.0, 3.0, 2.0], 4e9), h.measured([4.0, 5.0, 6.0], 4e9), h.measured([1.5], 4e9)]
    combined = h.combine_rounds(rounds)
    assert combined["round_medians_ms"] == [2.0, 5.0, 1.5] and combined["median_ms"] == 2.0
    assert combined["tflops"] == pytest.approx(4e9 / 2.0 / 1e9) and len(combined["times_ms"]) == 7
    error = h.failed(ValueError("out of memory"))
    assert h.combine_rounds([rounds[0], error, h.skipped("x")]) is error
    assert h.combine_rounds([h.measured([2.0], 1e9)])["median_ms"] == 2.0
    assert bench_modules.bench.parse_args(["--rounds", "3"]).rounds == 3
    with pytest.raises(SystemExit):
        bench_modules.bench.parse_args(["--rounds", "0"])
    assert bench_modules.mods.parse_args(["--rounds", "2"]).rounds == 2


def test_run_rounds_times_each_system_in_the_balanced_orders(bench_modules, monkeypatch):
    """harness.run_rounds (bench.py's and mods.py's rows): each round calls the systems in that round's
    balanced order, memory released before each call, and combines each system's rounds per direction."""
    h = bench_modules.harness
    calls, released = [], []
    monkeypatch.setattr(h, "release_cached_memory", lambda peers=None: released.append(peers))
    times = {"a": [1.0, 3.0, 2.0], "b": [4.0, 6.0, 5.0], "c": [7.0, 7.0, 9.0]}

    def system(name):
        def call():
            calls.append(name)
            t = times[name][sum(c == name for c in calls) - 1]
            return {"fwd": h.measured([t], 1e9), "bwd": h.measured([2 * t], 1e9)}
        return call

    out = h.run_rounds({name: system(name) for name in times}, 3, peers="p")
    assert calls == [s for r in range(3) for s in h.balanced_order(list(times), r)]
    assert released == ["p"] * 9
    assert {name: out[name]["fwd"]["median_ms"] for name in times} == {"a": 2.0, "b": 5.0, "c": 7.0}
    assert out["c"]["bwd"]["round_medians_ms"] == [14.0, 14.0, 18.0]
