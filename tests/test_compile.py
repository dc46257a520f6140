"""NVRTC compiles every kernel variant to a cubin for sm_80 and sm_90, on any machine (no GPU needed).

The options are those cupy.RawModule uses at run time (see _kernels.runtime_nvrtc_options), so ptxas
checks every instruction the runtime would load. The report lists registers, stack frame and spill
bytes per variant; every variant is required to be spill-free.
"""

import concurrent.futures
import re

import pytest

from cupyflash import _kernels

ARCHS = (80, 90)


def _report(variant, arch):
    _, log = _kernels.compile_offline(variant, arch)
    registers = re.search(r"Used (\d+) registers", log)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    stack = [int(n) for n in re.findall(r"(\d+) bytes stack frame", log)]
    assert registers, f"no ptxas report for {variant.key} on sm_{arch}:\n{log}"
    return {"registers": int(registers.group(1)), "spill_bytes": sum(spills), "stack_bytes": max(stack, default=0)}


@pytest.fixture(scope="module")
def reports():
    jobs = [(v, arch) for v in _kernels.VARIANTS for arch in ARCHS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: _report(*job), jobs))
    return {(v.key, arch): r for (v, arch), r in zip(jobs, results)}


def test_every_variant_compiles_without_spills(reports, capsys):
    with capsys.disabled():
        print("\nvariant                              arch  regs  stack  spill")
        for (key, arch), r in sorted(reports.items()):
            print(f"{key:<36} sm_{arch}  {r['registers']:>4}  {r['stack_bytes']:>5}  {r['spill_bytes']:>5}")
    spilled = {k: r for k, r in reports.items() if r["spill_bytes"] or r["stack_bytes"]}
    assert not spilled, f"variants with spills or stack frames: {spilled}"
    assert len(reports) == len(_kernels.VARIANTS) * len(ARCHS)


def test_variant_table_is_closed_and_named():
    keys = [v.key for v in _kernels.VARIANTS]
    assert len(set(keys)) == len(keys)
    for name, family in _kernels.FAMILIES.items():
        for dtype in family.dtypes:
            for tile in family.tiles:
                for causal in (False, True) if family.takes_causal else (False,):
                    assert _kernels.Variant(name, dtype, causal, tile) in _kernels.VARIANTS
    assert _kernels.Variant("general_fwd", "bfloat16", True).key == "general_fwd_bf16_causal_1"
    assert _kernels.Variant("general_fwd", "float32", False).name_expression == "cupyflash::general_fwd<float, false>"
    tc = _kernels.Variant("tc_fwd", "bfloat16", True, (128, 32, 2))
    assert tc.key == "tc_fwd_bf16_d128_n32_m2_causal_1"
    assert tc.name_expression == "cupyflash::tc_fwd<__nv_bfloat16, 128, 32, 2, true>"
    bwd = _kernels.Variant("tc_bwd", "float16", False, (64, 128, 64, 2))
    assert bwd.key == "tc_bwd_fp16_d64_n128_q64_s2_causal_0"
    assert bwd.name_expression == "cupyflash::tc_bwd<__half, 64, 128, 64, 2, false>"
    convert = _kernels.Variant("tc_bwd_dq_convert", "bfloat16")
    assert convert.key == "tc_bwd_dq_convert_bf16"
    assert convert.name_expression == "cupyflash::tc_bwd_dq_convert<__nv_bfloat16>"


@pytest.mark.parametrize("headdim, headdim_v, bucket", [(1, 1, 32), (32, 32, 32), (33, 8, 64), (59, 111, 128), (40, 200, 224), (256, 256, 256), (257, 64, None)])
def test_tc_headdim_bucket(headdim, headdim_v, bucket):
    assert _kernels.tc_headdim_bucket(headdim, headdim_v) == bucket


def test_header_edit_changes_compile_options(tmp_path, monkeypatch):
    """Regression: CuPy's disk cache does not hash #included headers, so the options must change."""
    import shutil

    copy = tmp_path / "kernels_cu"
    shutil.copytree(_kernels.kernel_dir(), copy)
    monkeypatch.setattr(_kernels, "kernel_dir", lambda: str(copy))
    _kernels._sources.cache_clear()
    _kernels.source_hash.cache_clear()
    try:
        before = _kernels.compile_options()
        with open(copy / "softmax.cuh", "a", encoding="utf-8") as f:
            f.write("\n// edited\n")
        _kernels._sources.cache_clear()
        _kernels.source_hash.cache_clear()
        after = _kernels.compile_options()
    finally:
        monkeypatch.undo()
        _kernels._sources.cache_clear()
        _kernels.source_hash.cache_clear()
    assert before != after
    assert any(o.startswith("-DCUPYFLASH_SRC_HASH=") for o in after)


def test_python_smem_sizes_match_the_traits():
    """The host sizes the dynamic shared memory of the tensor-core kernels from Python formulas that
    mirror TcFwdTraits/TcBwdTraits; NVRTC checks each against the C++ value, so drift fails here, in CI,
    instead of trapping on a GPU."""
    from cupy_backends.cuda.libs import nvrtc

    lines = ['#include "tc_tile.cuh"', '#include "tc_bwd_tile.cuh"']
    for v in _kernels.VARIANTS:
        if v.family == "tc_fwd":
            traits, size = f"TcFwdTraits<__half, {v.headdim}, {v.block_n}, {v.m_tiles}>", _kernels.tc_fwd_smem_bytes(v)
        elif v.family == "tc_bwd":
            traits = f"TcBwdTraits<__half, {v.headdim}, {v.block_n}, {v.block_m}, {v.stages}>"
            size = _kernels.tc_bwd_smem_bytes(v)
        else:
            continue
        lines.append(f'static_assert(cupyflash::{traits}::kSmemBytes == {size}, "{v.key}");')
    program = nvrtc.createProgram("\n".join(lines), "smem_check.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(program, _kernels.runtime_nvrtc_options(90))
        except nvrtc.NVRTCError:
            pytest.fail(nvrtc.getProgramLog(program))
    finally:
        nvrtc.destroyProgram(program)
