"""A plain ``pip install .`` has NumPy and ml_dtypes but no CuPy: the NumPy path must work there and never
import CuPy (issue 19: ``flash_attention_with_kvcache`` and ``python -m cupyflash`` raised
``ModuleNotFoundError: cupy``). Each test runs a fresh interpreter in which importing cupy fails, as it
does where CuPy is not installed."""

import os
import subprocess
import sys
import textwrap

import pytest

import cupyflash

#: The checkout (or install) under test, first on the child's path.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cupyflash.__file__)))

#: A sitecustomize that makes ``import cupy`` fail (``None`` in sys.modules raises ModuleNotFoundError),
#: before anything else runs.
_NO_CUPY = 'import sys\nsys.modules["cupy"] = None\n'

#: The main job, as ``python -m cupyflash`` runs it (runpy is what ``-m`` uses); its failure is reported and
#: the child goes on to the functions.
_MAIN_JOB = textwrap.dedent("""
    import runpy
    import traceback

    try:
        runpy.run_module("cupyflash", run_name="__main__", alter_sys=True)
        status = "no exit"
    except SystemExit as exc:
        status = exc.code
    except Exception:
        traceback.print_exc()
        status = "an exception"
    print(f"main job exit status {status}")
""")

#: A NumPy call of every public function, each checked against cupyflash.reference (float64, tiny sizes).
_EVERY_FUNCTION = textwrap.dedent("""
    import sys

    import numpy as np

    import cupyflash
    from cupyflash import reference

    called = set()

    def check(name, got, want, tol=1e-12):
        called.add(name)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)

    rng = np.random.default_rng(0)
    b, s, h, hk, d = 2, 12, 4, 2, 8
    q, dout = rng.standard_normal((b, s, h, d)), rng.standard_normal((b, s, h, d))
    k, v = rng.standard_normal((b, s, hk, d)), rng.standard_normal((b, s, hk, d))
    want_out, want_lse = reference.attention(q, k, v, causal=True)
    want_grads = reference.attention_backward(dout, q, k, v, causal=True)

    out, lse = cupyflash.flash_attention(q, k, v, causal=True, return_lse=True)
    check("flash_attention", out, want_out)
    check("flash_attention", lse, want_lse)
    for got, want in zip(cupyflash.flash_attention_backward(dout, q, k, v, out, lse, causal=True), want_grads):
        check("flash_attention_backward", got, want)
    out, vjp = cupyflash.flash_attention_vjp(q, k, v, causal=True)
    check("flash_attention_vjp", out, want_out)
    check("flash_attention_vjp", vjp(dout)[0], want_grads[0])

    cu = np.array([0, s, 2 * s], np.int32)
    packed = [x.reshape(b * s, *x.shape[2:]) for x in (q, k, v, dout)]
    out, lse = cupyflash.flash_attention_varlen(*packed[:3], cu, cu, causal=True, return_lse=True)
    check("flash_attention_varlen", out, want_out.reshape(b * s, h, d))
    grads = cupyflash.flash_attention_varlen_backward(packed[3], *packed[:3], out, lse, cu, cu, causal=True)
    check("flash_attention_varlen_backward", grads[1], want_grads[1].reshape(b * s, hk, d))
    out, vjp = cupyflash.flash_attention_varlen_vjp(*packed[:3], cu, cu, causal=True)
    check("flash_attention_varlen_vjp", vjp(packed[3])[2], want_grads[2].reshape(b * s, hk, d))

    keep = cupyflash.dropout_mask(5, (b, h, s, s), 0.25, offset=2)
    check("dropout_mask", keep.mean(), 0.75, tol=0.1)
    check("dropout_rate", cupyflash.dropout_rate(0.1), 26 / 256)
    sinks = rng.standard_normal(h).astype(np.float32)
    out, top = cupyflash.flash_attention(q, k, v, causal=True, sinks=sinks, dropout_p=0.25, dropout_seed=5,
                                         dropout_offset=2, return_max_score=True)
    check("flash_attention", out, reference.attention(q, k, v, causal=True, sinks=sinks, dropout_p=0.25,
                                                      dropout_mask=keep)[0])

    angles = rng.standard_normal((s, d // 2))
    rotated = cupyflash.apply_rotary(q, np.cos(angles), np.sin(angles), interleaved=True)
    check("apply_rotary", rotated, reference.apply_rotary(q, np.cos(angles), np.sin(angles),
                                                          np.broadcast_to(np.arange(s), (b, s)), interleaved=True))

    mask = cupyflash.BlockMask.longformer(s, block_size=(4, 4), window_blocks=0, global_blocks=1)
    check("BlockMask.longformer", cupyflash.flash_attention(q, k, v, block_mask=mask),
          reference.attention(q, k, v, block_mask=mask)[0])
    mask = cupyflash.BlockMask.bigbird(s, block_size=(4, 4), random_blocks=1, heads=h, seed=3)
    check("BlockMask.bigbird", cupyflash.flash_attention(q, k, v, block_mask=mask),
          reference.attention(q, k, v, block_mask=mask)[0])
    mask = cupyflash.BlockMask.from_dense(np.eye(3, dtype=bool)[None, None], block_size=(4, 4))
    check("BlockMask.from_dense", cupyflash.flash_attention(q, k, v, block_mask=mask),
          reference.attention(q, k, v, block_mask=mask)[0])

    a = cupyflash.flash_attention(q, k[:, :5], v[:, :5], return_lse=True)
    c = cupyflash.flash_attention(q, k[:, 5:], v[:, 5:], return_lse=True)
    full = reference.attention(q, k, v)
    check("merge_attention_states", cupyflash.merge_attention_states(*a, *c)[0], full[0])
    check("merge_attention_states_stacked",
          cupyflash.merge_attention_states_stacked(np.stack([a[0], c[0]]), np.stack([a[1], c[1]]))[1], full[1])

    k_cache, v_cache = np.zeros((b, 16, hk, d)), np.zeros((b, 16, hk, d))
    k_cache[:, :s - 1], v_cache[:, :s - 1] = k[:, :s - 1], v[:, :s - 1]
    out = cupyflash.flash_attention_with_kvcache(q[:, -1:], k_cache, v_cache, k=k[:, -1:], v=v[:, -1:],
                                                 cache_seqlens=s - 1, causal=True)
    check("flash_attention_with_kvcache", out, want_out[:, -1:])
    check("flash_attention_with_kvcache", k_cache[:, :s], k)

    world = 3
    shard = lambda x, r: cupyflash.zigzag_shard(x, world, r, axis=1)

    def rank(ring):
        r = ring.rank
        out, vjp = cupyflash.ring_flash_attention_vjp(shard(q, r), shard(k, r), shard(v, r), ring, causal=True,
                                                      layout="zigzag")
        out2, lse = cupyflash.ring_flash_attention(shard(q, r), shard(k, r), shard(v, r), ring, causal=True,
                                                   layout="zigzag", return_lse=True)
        grads = cupyflash.ring_flash_attention_backward(shard(dout, r), shard(q, r), shard(k, r), shard(v, r), out2,
                                                        lse, ring, causal=True, layout="zigzag")
        return out, vjp(shard(dout, r)), grads

    results = cupyflash.VirtualRing.run(world, rank)
    check("VirtualRing", len(results), world)
    check("ring_flash_attention_vjp", cupyflash.zigzag_unshard([r[0] for r in results]), want_out, 1e-10)
    check("ring_flash_attention", cupyflash.zigzag_unshard([r[1][0] for r in results]), want_grads[0], 1e-10)
    check("ring_flash_attention_backward", cupyflash.zigzag_unshard([r[2][1] for r in results]), want_grads[1],
          1e-10)
    check("zigzag_shard", shard(q, 0)[:, :2], q[:, :2])
    check("zigzag_unshard", cupyflash.zigzag_unshard([shard(q, r) for r in range(world)]), q)

    q8, descale = cupyflash.quantize_fp8(q)
    check("quantize_fp8", q8.astype(np.float64) * descale[:, None, :, None], q, 2.0**-4 * np.abs(q).max())

    public = {n for n in cupyflash.__all__ if callable(getattr(cupyflash, n)) and n != "BlockMask"}
    public |= {"BlockMask.from_dense", "BlockMask.longformer", "BlockMask.bigbird"}
    assert public <= called, f"not called: {sorted(public - called)}"
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "cupy" and sys.modules[m] is not None)
    assert not loaded and "cupyflash._cuda" not in sys.modules and "cupyflash._families" not in sys.modules, loaded
    print("every public function ran without CuPy")
""")


@pytest.fixture(scope="module")
def without_cupy(tmp_path_factory):
    """One child interpreter in which ``import cupy`` fails: the main job (as ``python -m cupyflash``
    runs it), then every public function. (One child for both: starting one costs about a second.)"""
    folder = tmp_path_factory.mktemp("without_cupy")
    (folder / "sitecustomize.py").write_text(_NO_CUPY)
    (folder / "child.py").write_text(_MAIN_JOB + _EVERY_FUNCTION)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), _PACKAGE_ROOT]))
    return subprocess.run([sys.executable, "child.py"], env=env, cwd=folder, capture_output=True, text=True,
                          timeout=120, check=False)


def test_main_job_runs_without_cupy(without_cupy):
    """Regression: ``python -m cupyflash`` crashed in its kvcache check where CuPy is not installed."""
    output = without_cupy.stdout + without_cupy.stderr
    assert "main job exit status 0" in without_cupy.stdout, output
    assert "CuPy is not installed" in without_cupy.stdout, output
    assert "kvcache float32   paged decode" in without_cupy.stdout and "self-check passed" in without_cupy.stdout


def test_every_public_function_runs_on_numpy_without_cupy(without_cupy):
    """Regression: the kvcache call imported its split limit from the CuPy kernel module."""
    assert without_cupy.returncode == 0, without_cupy.stdout + without_cupy.stderr
    assert "every public function ran without CuPy" in without_cupy.stdout
