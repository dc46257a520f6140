"""NVRTC compiles the kernel variants to cubins for sm_80 and sm_90 (the sm90 family's for sm_90a only),
on any machine (no GPU needed), and checks what the host and the kernels must agree on.

The options are those cupy.RawModule uses at run time (see _kernels.runtime_nvrtc_options), so ptxas
checks every instruction the runtime would load. Every variant must be spill-free (the Hopper kernels:
at most their recorded spills). The sm_90a variants must also compile without ptxas' warnings that
wgmma was serialized or setmaxnreg ignored, and their SASS (nvdisasm, from the test extras) must show
the HGMMA instructions. ``pytest --compile-report`` prints registers, stack frame and spill bytes per
variant.

Which builds run: a variant is built for the architectures whose devices dispatch can give it to, and
where it adds something the other builds do not check. The sm80 family's 16-bit first tiles for sm_80 at
the largest head dim of each tile shape and at 128, and for sm_90 (the Hopper family's fallback, same
registers) at head dim 128; their score-modified twins for sm_80 at those two; their fallback tiles (for
devices with less shared memory than the H100's) for sm_80, each distinct tile once, plain, at the
largest head dim that falls back to it (it holds no more per thread than that head dim's first tile). The
float32 and float64 kernels' plain first tiles for both architectures at the largest head dim each
serves, the sm80 float32 forward for sm_80 alone, sm_90 running the Hopper one; their flagged variants,
score_mod and tf32, on the largest head dim's first tile only, for sm_90, where they run on the
H100/H200, or sm_80 for the sm80 float32 forward: a flag's code with the tightest registers. The sm90
kernels' score_mod twins at head dims 128 and 256 and on head dim 64's tightest tile (the forward's three
consumers, the backward's 128 queries); their dropout variants alone on the bench's tile (head dim 128)
and with the score_mod flag on the tightest tile (the forward's head dim 256, the backward's 128-query
tile at head dim 64); the general kernels for sm_90 only. The maximum score's flag on the 16-bit, FP8 and
decode kernels, with score_mod on the largest head dim and alone on the Hopper forward's head dim 128.
The decode kernel for sm_90 at head dim 256 only (its stack use differs per architecture; below, its
registers as on sm_80). The variants of a 16-bit kernel differ in their dtype only by an instruction's
type, with the same registers, so bfloat16 is built for every selected tile, flag and architecture and
float16 once per kernel (its first tile, plain, on its first architecture). That keeps the suite near two
minutes on two cores (session 28: 189 builds); ``pytest --all-variants`` builds every variant for both
architectures, and the GPU suite compiles every variant for its device anyway (conftest.py).
"""

import concurrent.futures
import importlib
import itertools
import os
import re
from pathlib import Path

import pytest

from cupyflash import _families, _kernels, _params, _problem
from cupyflash._families import common, general, sm80, sm90
from cupyflash._kvcache import device as kvcache_device

ARCHS = (80, 90)
#: ptxas warnings that mean a wgmma pipeline was serialized (C7509-C7515) or setmaxnreg ignored (C7508).
SERIALIZATION_WARNINGS = re.compile(r"C75(0[89]|1[0-9])")
#: Spill bytes (stores + loads, NVRTC 12) of the sm90 forward variants, (headdim, headdim_v, block_m,
#: score_mod) -> bytes, a ceiling no change may raise. Not zero yet: the producer warpgroup's two issuing threads run at
#: setmaxnreg's 24 registers and keep a few values in local memory (about 100 bytes, every variant),
#: and the consumers of the larger tiles and of the score_mod kernels spill a few values (the
#: consumer-local column of the report; none in the d64, d96 and plain d128 kernels; bench/NOTES.md).
#: Issue 20 changed the producer (its first thread publishes a work tile ahead and decodes the L2
#: sections of the longest-first order): its share moved by -4 to +12 bytes; the consumers' did not grow.
#: The d64 tile of three consumers (block_m 192) runs them at 160 registers: its consumers spill (40
#: local-memory instructions, 47 in the score_mod kernel; bench/NOTES.md). The conditional rescaling
#: (fragment/softmax.cuh, kMaxSlack) moved d256's score_mod kernel 284 -> 300 and d192's 124 -> 132 bytes.
#: The end-aligned query tiles (Sm90Schedule::align_end: the producer's first row of a tile) added 16
#: bytes to every 128-row kernel's producer (the consumers' local accesses did not change); the 192-row
#: kernels' warpgroups that skip unseen key tiles moved them 300 -> 288 and 340 -> 336.
#: The paged-key walk of the 16-bit forward's producer (sm90_load_paged_key_tiles: a loop of its own beside
#: the dense one, run by the whole second producer warp since session 29) adds its own local accesses to
#: the producer's (the consumers' unchanged): +8 to +48 bytes, allowed on every sm90_fwd variant's ceiling
#: below. Session 47 moved the walk's table read and its division by the page size ahead of the ring's
#: waits (a page and a row within it carried per lane a tile ahead): ptxas keeps two of the lanes' box
#: offsets in local memory (L1 hits after the wait, where the division stood), +20 to +32 bytes.
SM90_PAGED_WALK_SPILL = 80
#: The paired forward (sm90_fwd_pairs, session 58: clusters of two CTAs filling their rings together) at
#: head dim 128: its producer also keeps the cluster rank and the work hand-off's index (84 + 148 bytes
#: against sm90_fwd's 72 + 96, NVRTC 12.9); its consumers' local accesses are sm90_fwd's.
SM90_PAIRS_SPILL_CEILING = 232
SM90_SPILL_CEILING = {
    (64, 64, 128, False): 124, (64, 64, 128, True): 124, (64, 64, 192, False): 288, (64, 64, 192, True): 336,
    (96, 96, 128, False): 124, (96, 96, 128, True): 124, (128, 128, 128, False): 124, (128, 128, 128, True): 148,
    (192, 128, 128, False): 164, (192, 128, 128, True): 236, (192, 192, 128, False): 140,
    (192, 192, 128, True): 148, (256, 256, 128, False): 264, (256, 256, 128, True): 316,
}
#: The same for the dropout variants (kDropout: fragment/dropout.cuh's generator calls beside the
#: softmax), measured when they were written (session 23) and with the calls drawn two at a time
#: (session 29: head dims 192 and 256 moved by -72 to +32 bytes): the 128-row tiles at head dims 64, 96
#: and 128 keep the consumers out of local memory without score modifications (and d128 with them
#: at 22); the others take 10-44 consumer local accesses (the 192-row tile, 139, is never selected with
#: dropout).
SM90_DROPOUT_SPILL_CEILING = {
    (64, 64, 128, False): 124, (64, 64, 128, True): 124, (64, 64, 192, False): 680, (64, 64, 192, True): 684,
    (96, 96, 128, False): 124, (96, 96, 128, True): 124, (128, 128, 128, False): 124, (128, 128, 128, True): 236,
    (192, 128, 128, False): 216, (192, 128, 128, True): 348, (192, 192, 128, False): 148,
    (192, 192, 128, True): 200, (256, 256, 128, False): 328, (256, 256, 128, True): 372,
}
#: The same for the variants that keep the maximum score (kMaxScore: two more registers a thread across the
#: loop and the epilogue's reduction), (headdim, headdim_v, block_m, score_mod, dropout) -> bytes,
#: measured when written (session 27): none moves at head dims 64 and 96 on 128-row tiles or in the
#: plain d128 kernel; the others take 8-48 bytes more (consumer local accesses: d128 with a score_mod
#: 9, d256 40; the 192-row tile, 50-108, is never selected with it). Its dropout entries and the 192-row
#: dropout tile's were remeasured in session 31 (after session 30's paired draws; only --all-variants
#: builds them): 4-52 bytes more.
SM90_MAX_SCORE_SPILL_CEILING = {
    (64, 64, 192, False, False): 328, (64, 64, 192, False, True): 560, (64, 64, 192, True, False): 376,
    (64, 64, 192, True, True): 380, (128, 128, 128, True, False): 172, (128, 128, 128, True, True): 240,
    (192, 128, 128, False, False): 188, (192, 128, 128, False, True): 236, (192, 128, 128, True, False): 252,
    (192, 128, 128, True, True): 380, (192, 192, 128, False, False): 148, (192, 192, 128, False, True): 164,
    (192, 192, 128, True, False): 172, (192, 192, 128, True, True): 216, (256, 256, 128, False, False): 264,
    (256, 256, 128, False, True): 348, (256, 256, 128, True, False): 356, (256, 256, 128, True, True): 404,
    **{(d, d, 128, mod, drop): 124 for d in (64, 96) for mod in (False, True) for drop in (False, True)},
    (128, 128, 128, False, False): 124, (128, 128, 128, False, True): 124,
}
#: The same for the FP8 forward (sm90_fwd_fp8), (headdim, max_score) -> bytes, measured when written
#: (session 27): the producer's ~124 as above; at head dim 256 the consumers keep 44 (54 with the maximum
#: score) local-memory accesses, as the 16-bit d256 kernel's score_mod consumers do. Head dim 64 runs three
#: consumers on 160 registers (session 42): 216 (248 with the maximum score), 22 (30) consumer accesses.
SM90_FP8_SPILL_CEILING = {(64, False): 216, (64, True): 248, (128, False): 124, (128, True): 124, (256, False): 300,
                          (256, True): 340}
#: The tf32 forward (sm90_fwd_tf32, the same main loop): the producer's 124 bytes only (session 28).
SM90_TF32_SPILL_CEILING = 124
#: The same for the sm90 backward's dropout variants (head dims up to 128), measured when written
#: (session 23): the d96 and d128 consumers keep out of local memory; d64's 128-query tile, which spills
#: without dropout too (96 and 70 consumer local accesses), takes 50 and 78. Session 32's 8-bit draws (one
#: call a loop step, as two a step put six local accesses into d128's consumers) moved d64's plain
#: dropout kernel to 126 (1052 -> 1356 bytes; only --all-variants builds it).
SM90_BWD_DROPOUT_SPILL_CEILING = {
    (64, 64, False): 1356, (64, 64, True): 1168, (96, 96, False): 872, (96, 96, True): 872,
    (128, 128, False): 872, (128, 128, True): 872,
}
#: The same for the float32 Hopper forward (sm90_fwd_planes), head dim -> bytes: the producer's ~150 as
#: above, and at head dim 128 one consumer value kept in local memory across the mask (8-15 local-memory
#: instructions outside the products).
SM90_PLANES_SPILL_CEILING = {64: 176, 128: 184}
#: The same for the float32 Hopper backward (sm90_bwd_planes), head dim -> bytes: its producer's four
#: loops as the 16-bit backward's below (no consumer local memory). At head dim 64 setmaxnreg gives the
#: producer 40 registers (1216 -> 332 bytes); at 128 the consumers need 240 and the producer keeps 24. The
#: lse rows' split into float pairs (split_lse) added 32 bytes to both.
SM90_BWD_PLANES_SPILL_CEILING = {64: 364, 128: 844}
#: The same for the sm90 backward, whose producer warpgroup runs three loops (tiles, lse and delta rows,
#: dQ reductions) at 24 registers, and whose consumers spill a few values in the masked P^T path. The
#: conflict-free dQ stores (four address registers instead of eight) and the alternating whole-tile dQ
#: took d128's consumers from 57 local-memory instructions to 5 (832 -> 624 bytes, score_mod 716 ->
#: 632); d64's masked path moved 1024 -> 1104 (99 -> 119 instructions) by the register allocation, and
#: the 16-byte dK/dV stores moved it again (1104 -> 1020, score_mod 852 -> 916). The ordered sum's
#: rotated walks (a rotation in each producer loop, a turn per tile in the reducing one) added 40-64
#: bytes to the producers (d64 score_mod 916 -> 972; d128 624 -> 664; d256 620 -> 684), while the
#: consumers' local-memory instructions fell (d128, d256: 5 -> 0). The turn waiter (a fourth producer
#: loop, warp 3's, polling the turns ahead of the reducing thread) added about 200 more (d64 1104 ->
#: 1236, score_mod 972 -> 1132; d128 664 -> 824; d256 684 -> 856), the consumers unchanged. Head dim
#: 96's own bucket (the d128 kernel with 96-column products) has d128's producers; head dim 192's (the
#: d256 kernel with three atoms) 832 and 856 bytes, its score_mod consumers 6 local-memory instructions.
#: Session 54's claims of the unzeroed dQ buffers (warp 3's loop walks without the ordered sum too, and the
#: reducing thread stores a tile's first share) added 4-48 bytes to the producers (d128 824 -> 872, d64
#: 1236 -> 1240; the walk ranges of session 53 had taken d128 to 804), the consumers unchanged.
SM90_BWD_SPILL_CEILING = {(64, 64, False): 1240, (64, 64, True): 1144, (96, 96, False): 872, (96, 96, True): 872,
                          (128, 128, False): 872, (128, 128, True): 872, (192, 192, False): 856, (192, 192, True): 880,
                          (256, 256, False): 856, (256, 256, True): 864}
#: The decode kernel at head dim 256 runs at 255 registers, and ptxas keeps a few values on the stack
#: (up to 40 bytes, varying with every edit), most stored before its key loop and loaded after it:
#: allowed up to these ceilings, bytes and local-memory instructions inside the loop
#: (_loop_local_accesses; an L1 hit per 64-key tile; sm_80 has one, sm_90 none). (head dim bucket) ->
#: value; other buckets none.
KVC_SPILL_CEILING = {256: 64}
#: The float64 forward (sm80_fwd_dmma) keeps an 8-byte stack frame at head dims 64 and 128 with no spill
#: (found in session 35, when the test began checking frames apart from spills): allowed, no larger.
SM80_FP64_STACK_CEILING = 8
KVC_LOOP_LOCAL_CEILING = {256: 2}
#: Variants per NVRTC program, and the relative compile cost of the large kernels.
_CHUNK = 12
_COST = {"sm80_bwd": 8, "sm80_fwd": 5, "sm90_fwd": 6, "sm90_bwd": 6}


#: The H100/H200's per-block shared memory: the sm80 family's tiles that do not fit it serve smaller devices.
_SM90_SMEM = 227 * 1024


def _archs(variant, everything=False):
    """The architectures a variant is built for: its own target's, or those of ARCHS whose devices can
    select it (see the module docstring)."""
    archs = tuple(a for a in ARCHS if _kernels.builds_for(variant, a))
    if everything:
        return archs
    wide = {sm80.FWD_FP32: sm80.FWD_FP32_TILES, sm80.FWD_FP64: sm80.FWD_FP64_TILES,
            sm80.BWD_FP32: sm80.BWD_FP32_TILES, sm80.BWD_FP64: sm80.BWD_FP64_TILES}
    flags = dict(zip(variant.kernel.flags, variant.flags))
    if flags.get("max_score"):
        # The maximum score's registers with the score_mod flag on the largest head dim's first tile (the
        # tightest), and alone on the Hopper forward's bench tile (head dim 128), in the 16-bit, FP8 and
        # decode kernels (sm_80's for the decode kernel, its tighter); not beside dropout or tf32, nor in the float32
        # and float64 forwards, which hold the same two registers a thread (--all-variants builds those).
        if variant.kernel in (sm80.FWD_FP32, sm80.FWD_FP64, sm90.FWD_PLANES, sm90.FWD_TF32):
            return ()  # (the tf32 forward's epilogue is the FP8 forward's, built with the flag)
        others = {f for f, on in flags.items() if on and f != "max_score"}
        largest = max(variant.kernel.tiles, key=lambda tile: tile[0])
        bench = variant.kernel is sm90.FWD and variant.param("headdim") == 128
        tightest = others == {"score_mod"} or not others and "score_mod" not in variant.kernel.flags
        if tightest and variant.tile == largest or not others and bench:
            twin = _archs(variant.kernel.variant(variant.dtype, variant.tile, **dict(flags, max_score=False)))
            return twin[:1] if variant.kernel is kvcache_device.DECODE else twin
        return ()
    if variant.kernel in wide or variant.kernel in (sm90.FWD_PLANES, sm90.BWD_PLANES):
        # The float32 forward of sm80 serves compute capabilities other than 9.0 (which runs sm90's).
        home = (80,) if variant.kernel is sm80.FWD_FP32 else archs
        if any(variant.flags):
            # Flags on the largest head dim's first tile, where registers are tightest, for sm_90 (where
            # they run on the H100/H200) or the kernel's home; other tiles build plain.
            largest = max(variant.kernel.tiles, key=lambda tile: tile[0])
            return (home[-1],) if variant.tile == largest else ()
        if variant.kernel in wide:
            tiles = wide[variant.kernel]
            if variant.tile[1:] != tiles[variant.param("headdim")][0]:
                return _fallback(variant, tiles, lambda bucket: tiles[bucket][0])
            # A first tile at the largest head dim it serves (its registers bound the smaller ones').
            if variant.param("headdim") != max(d for d, choices in tiles.items() if choices[0] == variant.tile[1:]):
                return ()
        return home
    if variant.kernel in (sm90.FWD, sm90.BWD) and variant.param("score_mod") and not variant.param("dropout"):
        # The score modifications' registers on the bench's head dim (128), the largest, and head dim 64's
        # tiles of the tightest registers (the forward's three consumers, the backward's 128 queries).
        headdim = variant.param("headdim")
        tight = headdim == 64 and (variant.kernel is sm90.BWD or variant.param("block_m") == 192)
        return archs if headdim in (128, 256) or tight else ()
    if variant.kernel is kvcache_device.DECODE and variant.param("headdim") != 256:
        return archs[:1]  # registers as on sm_80 but at head dim 256, whose stack use differs per architecture
    if variant.kernel in (general.FWD, general.DQ, general.DKDV):
        # SIMT code, the same on both (tests/test_compile.py's sm_75 test builds it for older GPUs too):
        # registers on the newer.
        return archs[-1:]
    if variant.kernel in (sm90.FWD, sm90.BWD) and variant.param("dropout"):
        # Dropout alone on the bench's tile (head dim 128, whose consumers keep out of local memory with it),
        # and with the score_mod flag on the tile of the tightest registers (the forward's largest head dim,
        # the backward's 128-query tile at head dim 64); the others with --all-variants (ceilings in
        # SM90_DROPOUT_SPILL_CEILING and SM90_BWD_DROPOUT_SPILL_CEILING).
        tightest = 256 if variant.kernel is sm90.FWD else 64
        selected = variant.param("headdim") == (tightest if variant.param("score_mod") else 128)
        return archs if selected else ()
    if variant.kernel not in (sm80.FWD, sm80.BWD):
        return archs
    tiles = sm80.FWD_TILES if variant.kernel is sm80.FWD else sm80.BWD_TILES

    def first_fit(bucket):
        return next(t for t in tiles[bucket] if _smem(variant.kernel.variant(variant.dtype, (bucket, *t))) <= _SM90_SMEM)

    if variant.tile[1:] != first_fit(variant.param("headdim")):
        return _fallback(variant, tiles, first_fit)
    # On sm_90 the sm80 kernels are the Hopper family's fallback (operands a TMA cannot read), their
    # registers as on sm_80: built there for the bench's head dim (128). The score-modified twins add the
    # same few registers at every head dim: built for sm_80 at 128 and the largest head dim. The other
    # plain first tiles for sm_80 at the largest head dim each tile shape serves (registers grow with the
    # head dim on one tile shape, as for the fallback tiles).
    headdim = variant.param("headdim")
    if headdim not in (128, max(tiles)):
        largest = max(d for d in tiles if first_fit(d) == variant.tile[1:])
        return () if variant.param("score_mod") or headdim != largest else (80,)
    return (80,) if variant.param("score_mod") or headdim != 128 else archs


def _fallback(variant, tiles, first_fit):
    """The builds of a fallback tile (one that serves devices with less shared memory than the H100's:
    ``tiles`` maps head-dim buckets to their tiles, ``first_fit(bucket)`` is the tile an H100 takes).

    A fallback tile holds no more per thread than its bucket's first fit (fewer stages, or fewer keys or
    queries per CTA), and its registers grow with the head dim, so each distinct fallback tile is built
    once, plain, for sm_80, at the largest head dim that falls back to it."""
    shape = variant.tile[1:]
    largest = max(d for d, choices in tiles.items() if shape in choices and shape != first_fit(d))
    return (80,) if variant.param("headdim") == largest and not any(variant.flags) else ()


def _smem(variant):
    return (sm80.fwd_smem_bytes if variant.kernel is sm80.FWD else sm80.bwd_smem_bytes)(variant)


def _built(variants, everything):
    """The (variant, architecture) builds of the suite (see the module docstring)."""
    if everything:
        return [(v, a) for v in variants for a in _archs(v, True)]
    builds = []
    for v in variants:
        if v.kernel.dtypes == _kernels.HALF_DTYPES and v.dtype == "float16":
            # bfloat16's builds cover every tile, flag and architecture with the same registers; float16
            # is built once per kernel: its first tile, plain, on its first architecture.
            if v.tile == v.kernel.tiles[0] and not any(v.flags):
                builds.append((v, _archs(v, True)[0]))
            continue
        builds += [(v, a) for a in _archs(v)]
    return builds


def _nvdisasm():
    """The nvdisasm of the nvidia-cuda-nvdisasm wheel (test extras), or one on PATH; None without."""
    import glob
    import shutil
    import site

    for root in site.getsitepackages() + [site.getusersitepackages()]:
        found = sorted(glob.glob(os.path.join(root, "nvidia", "**", "bin", "nvdisasm"), recursive=True))
        if found:
            return found[-1]
    return shutil.which("nvdisasm")


def test_sass_checks_have_their_disassembler():
    """The local-memory limits of the decode loop and the Hopper consumers (and the HGMMA counts) read the
    SASS through nvdisasm, which the test extras install: without it those limits would pass unchecked."""
    assert _nvdisasm() is not None, "no nvdisasm: pip install nvidia-cuda-nvdisasm (the test extras name it)"


def _sass_functions(cubin):
    """{mangled name: SASS text} of a cubin, through nvdisasm."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_nvdisasm(), "-c", f.name], check=True, capture_output=True, text=True).stdout
    functions = {}
    for chunk in re.split(r"\n\s*\.text\.", text)[1:]:
        name = chunk[: chunk.index(":")].strip()
        functions[name] = chunk
    return functions


def _report(variants, arch):
    cubin, log, lowered = _kernels.compile_offline(variants, arch)
    warnings = SERIALIZATION_WARNINGS.findall(log)
    assert not warnings, f"ptxas serialized wgmma or ignored setmaxnreg for {[v.key for v in variants]}:\n{log}"
    sections = {}
    for chunk in log.split("Compiling entry function '")[1:]:
        name = chunk[: chunk.index("'")]
        registers = re.search(r"Used (\d+) registers", chunk)
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", chunk)]
        stack = [int(n) for n in re.findall(r"(\d+) bytes stack frame", chunk)]
        assert registers, f"no ptxas report for {name} on sm_{arch}:\n{chunk}"
        sections[name] = {"registers": int(registers.group(1)), "spill_bytes": sum(spills), "stack_bytes": max(stack, default=0)}
    hgmma = consumer_local = loop_local = None
    # Decode variants with a stack frame: where in the SASS it is used (without one, nowhere).
    decode = [v for v in variants if v.kernel in (kvcache_device.DECODE, kvcache_device.DECODE_FP8)
              and sections[lowered[v]]["stack_bytes"]]
    if (any(v.kernel.arch for v in variants) or decode) and _nvdisasm() is not None:
        functions = _sass_functions(cubin)
        if any(v.kernel.arch for v in variants):
            # HGMMA: 16-bit products; QGMMA ... .E4M3.E4M3: FP8 ones.
            hgmma = {v: len(re.findall(r"\bHGMMA\.|\bQGMMA\.\S*E4M3\.E4M3", functions.get(lowered[v], ""))) for v in variants}
            # (of the warp-specialized kernels: the e4m3 decode kernel is sm_90a for its cvt alone, and the
            # MLA one's two warpgroups both compute, with no setmaxnreg)
            consumer_local = {v: _consumer_local_accesses(functions.get(lowered[v], "")) for v in variants
                              if v.kernel not in (kvcache_device.DECODE_FP8, kvcache_device.MLA_SM90)}
        loop_local = {v: _loop_local_accesses(functions[lowered[v]]) for v in decode}
    result = {(v.key, arch): sections[lowered[v]] for v in variants}
    for v in variants:
        result[(v.key, arch)]["hgmma"] = hgmma[v] if hgmma else None
        result[(v.key, arch)]["consumer_local"] = consumer_local.get(v) if consumer_local else None
        result[(v.key, arch)]["loop_local"] = loop_local.get(v) if loop_local else None
    return result


def _loop_local_accesses(sass):
    """Local-memory instructions of the decode kernel's key loop: from the label that the branch after
    the loop's last tensor-core product jumps back to, up to that branch."""
    lines = sass.splitlines()
    last = max(i for i, line in enumerate(lines) if "HMMA" in line)
    branch = next(i for i in range(last, len(lines)) if re.search(r"\bBRA\b", lines[i]))
    label = re.search(r"`\((\.L_x_\d+)\)", lines[branch]).group(1)
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(label + ":"))
    assert start < last, "the branch after the decode loop's last product is no longer its back edge; update this check"
    return sum(1 for line in lines[start:branch] if re.search(r"\b(LDL|STL)\b", line))


def _consumer_local_accesses(sass):
    """Local-memory instructions of a warp-specialized kernel's consumer warpgroups: those between the
    consumers' setmaxnreg (TRY_ALLOC) and the producer's (DEALLOC), which follows them in the SASS."""
    lines = sass.splitlines()
    start = next(i for i, line in enumerate(lines) if "USETMAXREG.TRY_ALLOC" in line)
    end = next(i for i, line in enumerate(lines) if "USETMAXREG.DEALLOC" in line)
    assert start < end, "the consumers' code no longer precedes the producer's; update this check"
    return sum(1 for line in lines[start:end] if re.search(r"\b(LDL|STL)\b", line))


@pytest.fixture(scope="module")
def builds(request):
    return _built(_families.VARIANTS, request.config.getoption("--all-variants"))


@pytest.fixture(scope="module")
def compiled(builds):
    """The ptxas reports of every build, then of the kernels built with score and mask functions
    (:func:`_user_function_jobs`), compiled in one pool: the small programs of the second fill the
    cores the first's last large ones leave idle."""

    def group(build):  # (one program per source file, device and target: kvcache.cu holds both kinds)
        v, arch = build
        return (v.source_file, arch, v.kernel.arch or "")

    groups = [[v for v, _ in bs] for _, bs in itertools.groupby(sorted(builds, key=group), key=group)]
    archs = [arch for (_, arch, _), _ in itertools.groupby(sorted(builds, key=group), key=group)]
    # Programs of a dozen variants (of any dtype) each: a program's front end costs about a second, so
    # fewer programs save that, and there are still enough to keep every core busy to the end; the
    # largest kernels go first.
    jobs = [(vs[i : i + _CHUNK], arch) for vs, arch in zip(groups, archs) for i in range(0, len(vs), _CHUNK)]
    jobs.sort(key=lambda job: -sum(_COST.get(v.kernel.name, 1) for v in job[0]))
    user_jobs = _user_function_jobs()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0)) or 2) as pool:
        results = list(pool.map(lambda job: _report(*job[:2]), jobs + user_jobs))
    return ({key: r for result in results[:len(jobs)] for key, r in result.items()},
            list(zip(user_jobs, results[len(jobs):])))


@pytest.fixture(scope="module")
def reports(compiled):
    return compiled[0]


def test_every_variant_compiles_without_spills(reports, builds, request, capsys):
    if request.config.getoption("--compile-report"):
        with capsys.disabled():
            print("\nvariant                                  arch  regs  stack  spill  consumer-local")
            for (key, arch), r in sorted(reports.items()):
                local = "" if r.get("consumer_local") is None else f"  {r['consumer_local']:>5}"
                print(f"{key:<40} sm_{arch}  {r['registers']:>4}  {r['stack_bytes']:>5}  {r['spill_bytes']:>5}{local}")
    ceiling = {v.key: (SM90_DROPOUT_SPILL_CEILING if v.param("dropout") else SM90_SPILL_CEILING)[
        (v.param("headdim"), v.param("headdim_v"), v.param("block_m"), v.param("score_mod"))]
        for v in sm90.FWD.variants() if not v.param("max_score")}
    ceiling.update({v.key: SM90_MAX_SCORE_SPILL_CEILING[(v.param("headdim"), v.param("headdim_v"), v.param("block_m"),
                                                        v.param("score_mod"), v.param("dropout"))]
                    for v in sm90.FWD.variants() if v.param("max_score")})
    for v in sm90.FWD.variants():
        ceiling[v.key] += SM90_PAGED_WALK_SPILL
    ceiling.update({v.key: SM90_PAIRS_SPILL_CEILING for v in sm90.FWD_PAIRS.variants()})
    ceiling.update({v.key: (SM90_BWD_DROPOUT_SPILL_CEILING if v.param("dropout") else SM90_BWD_SPILL_CEILING)[
        (v.param("headdim"), v.param("headdim_v"), v.param("score_mod"))] for v in sm90.BWD.variants()})
    ceiling.update({v.key: SM90_PLANES_SPILL_CEILING[v.param("headdim")] for v in sm90.FWD_PLANES.variants()})
    ceiling.update({v.key: SM90_FP8_SPILL_CEILING[(v.param("headdim"), v.param("max_score"))]
                    for v in sm90.FWD_FP8.variants()})
    ceiling.update({v.key: SM90_TF32_SPILL_CEILING for v in sm90.FWD_TF32.variants()})
    ceiling.update({v.key: SM90_BWD_PLANES_SPILL_CEILING[v.param("headdim")] for v in sm90.BWD_PLANES.variants()})
    for v in (*kvcache_device.DECODE.variants(), *kvcache_device.DECODE_FP8.variants()):
        ceiling[v.key] = KVC_SPILL_CEILING.get(v.param("headdim"), 0)
    spilled = {k: r for k, r in reports.items() if r["spill_bytes"] > ceiling.get(k[0], 0)}
    assert not spilled, f"variants with spills (above the recorded ceilings): {spilled}"
    # Stack frames: where spills are allowed, as large as they; elsewhere none.
    ceiling.update({v.key: max(ceiling.get(v.key, 0), SM80_FP64_STACK_CEILING) for v in sm80.FWD_FP64.variants()})
    framed = {k: r for k, r in reports.items() if r["stack_bytes"] > ceiling.get(k[0], 0)}
    assert not framed, f"variants with stack frames (above the recorded ceilings): {framed}"
    loop_ceiling = {v.key: KVC_LOOP_LOCAL_CEILING.get(v.param("headdim"), 0)
                    for v in (*kvcache_device.DECODE.variants(), *kvcache_device.DECODE_FP8.variants())}
    in_loop = {k: r for k, r in reports.items() if (r.get("loop_local") or 0) > loop_ceiling.get(k[0], 0)}
    assert not in_loop, f"decode variants whose key loop accesses local memory (above the ceilings): {in_loop}"
    assert len(reports) == len(builds)


def _user_function_jobs():
    """Kernels built with a score_mod (a float and an int buffer, gathers, a sigmoid gate) and a mask_mod
    (a document mask), as (variants, arch, spill ceiling, consumer local-access ceiling) jobs.

    The Hopper forward's consumers keep the functions nearly out of local memory (the mask_mod is
    evaluated into bits per pair of rows in a loop of its own, fragment/scores.cuh): this gated bias's
    sigmoid per score cost 10-22 local accesses as the register allocation fell (session 25; 0 in session
    26; 14 before session 46, 2 with its mask_mod's loads unpredicated), the built-in softcap
    kernel's 3 (a document mask, a table bias or a softcap alone: 0). The Hopper backward with a softcap
    inside the mask: 4 (2 with one row's bits per loop; the built-in's 0), 6 since the mask_mod's loop
    is unrolled 4 times (one word spilled and reloaded once a query tile, outside the tile's loops); an
    additive bias with its table gradient (frozen tiles summing theirs, the others read back from the
    dS^T buffer) inside the mask: 12. The sm80 backward adding an additive bias's table gradient beside
    the mask's bits spills 72 bytes at head dim 128 (40 before its frozen tiles' second copy of the
    probabilities; 24 with session 46's unpredicated mask_mod loads). Since session 47's element bits
    (from_mask_mod's words read in place of the function, UserMaskAt::from_words) the gated forward's
    consumers take 19 local accesses (2 before) and the Hopper backward with the document mask alone,
    which reads them too, 14 (2 before). Measured in session 26; the other families'
    variants with functions compiled without spills then (bench/NOTES.md), and CI's time goes to these."""
    import numpy as np

    from cupyflash import _trace, mods

    def score(s, b, h, qi, ki, table, shift):
        return s * mods.sigmoid(table[h, mods.clip(ki - qi + shift[0], 0, 256)]) + table[h, 0]

    def mask(b, h, qi, ki, doc):
        return (doc[b, qi] == doc[b, ki]) & (ki <= qi)

    user_mask = _trace.trace(mask, "mask", [(np.dtype(np.int32), 2)])
    gated = _trace.trace(score, "score", [(np.dtype(np.float32), 2), (np.dtype(np.int32), 1)])
    user = _kernels.user_code(gated, user_mask)
    # The 16-bit tensor-core kernels take the fast forms (user_mod.cuh's user_fast_*).
    fast = _kernels.user_code(gated, user_mask, fast=True)
    capped = _kernels.user_code(_trace.trace(lambda s, b, h, qi, ki: 30.0 * mods.tanh(s / 30.0), "score", []), user_mask,
                                fast=True)
    additive = _kernels.user_code(_trace.trace(lambda s, b, h, qi, ki, t: s + t[h, mods.clip(ki - qi + 128, 0, 256)],
                                               "score", [(np.dtype(np.float32), 2)]), user_mask, fast=True)
    blocks = common.MASK_MOD_BLOCKS.variant(user=_kernels.user_code(None, user_mask))
    bits = common.MASK_MOD_BITS.variant(user=_kernels.user_code(None, user_mask))
    mask_only = _kernels.user_code(None, user_mask, fast=True)
    return [([bits], 80, 0, None),
            ([sm90.BWD.variant("bfloat16", (128, 128, 64, 2), user=mask_only)], 90, None, 14),
            ([general.DQ.variant("float64", user=user), general.DKDV.variant("float64", user=user)], 90, 0, None),
            ([sm90.FWD.variant("bfloat16", (128, 128, 128, 128, 2), user=fast)], 90, None, 22),
            ([sm90.BWD.variant("bfloat16", (128, 128, 64, 2), user=capped)], 90, None, 6),
            ([sm80.BWD.variant("bfloat16", (128, 128, 64, 2), user=additive)], 80, 72, None),
            ([sm90.BWD.variant("bfloat16", (128, 128, 64, 2), user=additive)], 90, None, 12),
            ([blocks], 80, 0, None)]


def test_user_function_variants_compile_without_spills(compiled):
    """The kernels of :func:`_user_function_jobs` within their ceilings; the variant keys and name
    expressions name the generated code."""
    for (variants, _, spill_ceiling, local_ceiling), report in compiled[1]:
        for key, r in report.items():
            assert key[0].endswith(f"_fn{variants[0].user.key}")
            if spill_ceiling is not None:
                assert r["spill_bytes"] <= spill_ceiling and (spill_ceiling or not r["stack_bytes"]), (key, r)
            if local_ceiling is not None:
                assert r["consumer_local"] is None or r["consumer_local"] <= local_ceiling, (key, r)
    blocks = compiled[1][-1][0][0][0]
    assert blocks.name_expression == "cupyflash::mask_mod_blocks<cupyflash::NoUserScore, cupyflash::UserMask>"
    bits = compiled[1][0][0][0][0]
    assert bits.name_expression == "cupyflash::mask_mod_bits<cupyflash::NoUserScore, cupyflash::UserMask>"
    with pytest.raises(ValueError, match="only"):
        common.MASK_MOD_BLOCKS.variant()
    with pytest.raises(ValueError, match="only"):
        common.MASK_MOD_BITS.variant()


def test_kernels_of_older_gpus_compile_for_sm75():
    """The kernels that serve GPUs older than sm_80 (the general family, the row, check, dropout, rotary and
    maximum-score kernels, the KV cache's general path) compile for sm_75: their headers must not use
    sm_80's instructions (__reduce_max_sync, cp.async). Plain variants, float32 and bfloat16."""
    tensor_cores = {sm80.FWD, sm80.BWD, sm80.FWD_FP32, sm80.FWD_FP64, sm80.BWD_FP32, sm80.BWD_FP64, sm80.PLANES,
                    kvcache_device.DECODE, kvcache_device.MLA}
    selected = [v for v in _families.VARIANTS if v.kernel.arch is None and v.kernel not in tensor_cores
                and not any(v.flags) and v.dtype in (None, "float32", "bfloat16")]
    by_file = {}
    for v in selected:
        by_file.setdefault(v.source_file, []).append(v)
    assert {"general/fwd.cu", "general/bwd.cu", "kvcache/kvcache.cu", "common/max_score.cu"} <= set(by_file)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0)) or 2) as pool:
        reports = list(pool.map(lambda vs: _report(vs, 75), by_file.values()))
    assert sum(len(r) for r in reports) == len(selected)


def test_every_kernel_and_dtype_is_built():
    """The suite's selection still builds every kernel of every dtype, every flag of every kernel (the
    maximum score's beside score_mod, the others in every combination), every tile or (a fallback
    tile) its shape at a larger head dim, and every sm80 tile where the H100's shared memory selects it
    (its plain variant)."""
    builds = _built(_families.VARIANTS, everything=False)
    built = {(v.kernel.name, v.dtype, a) for v, a in builds}
    for v in _families.VARIANTS:
        if not _archs(v):  # flags off the tile that carries them, or a fallback tile built at a larger head dim
            assert any(w.kernel == v.kernel and not any(w.flags) and
                       (w.tile == v.tile or w.tile[1:] == v.tile[1:] and w.tile[0] > v.tile[0]) for w, _ in builds), v.key
            flags = dict(zip(v.kernel.flags, v.flags))
            if flags.get("max_score") and v.kernel in (sm80.FWD_FP32, sm80.FWD_FP64, sm90.FWD_PLANES, sm90.FWD_TF32):
                continue  # the maximum score of the float32 and float64 forwards: --all-variants (_archs)
            combination = v.flags if not flags.get("max_score") else tuple(f in ("score_mod", "max_score") for f in flags)
            assert any((w.kernel, w.flags) == (v.kernel, combination) for w, _ in builds), v.key
            continue
        assert (v.kernel.name, v.dtype, _archs(v)[0]) in built, v.key
        assert any((w.kernel, w.tile, w.flags) == (v.kernel, v.tile, v.flags) for w, _ in builds), v.key
    first_tiles = {(d, tiles[0]) for d, tiles in sm80.FWD_TILES.items()}
    assert all(a == 80 or (v.param("headdim"), v.tile[1:]) in first_tiles
               for v, a in builds if v.kernel is sm80.FWD)


@pytest.mark.skipif(_nvdisasm() is None, reason="no nvdisasm (pip install nvidia-cuda-nvdisasm)")
def test_hopper_variants_run_on_hgmma(reports):
    """Every sm_90a variant built's SASS holds the warpgroup products (a serialized or mis-targeted build would
    show HMMA or none), at least one per k-step of S = Q K^T and of O += P V."""
    built = {key for key, arch in reports if arch == 90}
    for v in sm90.FWD.variants():
        if v.key not in built:
            continue  # the fp16 twin of a bf16 tile (test_every_kernel_and_dtype_is_built)
        steps = v.param("headdim") // 16 + v.param("block_n") // 16
        assert reports[(v.key, 90)]["hgmma"] >= steps, (v.key, reports[(v.key, 90)])
    for v in sm90.FWD_PLANES.variants():
        if v.key not in built:
            continue  # a flagged variant off the largest tile (test_every_kernel_and_dtype_is_built)
        # Six bfloat16 products per k-step of S and of O += P V (three for "tf32").
        products = 3 if v.param("tf32") else 6
        steps = v.param("headdim") // 16 + v.param("block_n") // 16
        assert reports[(v.key, 90)]["hgmma"] >= products * steps, (v.key, reports[(v.key, 90)])
    for v in sm90.FWD_FP8.variants():
        if v.key not in built:
            continue
        steps = v.param("headdim") // 32 + v.param("block_n") // 32  # k32: QGMMA ... E4M3.E4M3
        assert reports[(v.key, 90)]["hgmma"] >= steps, (v.key, reports[(v.key, 90)])
    for v in sm90.FWD_TF32.variants():
        if v.key not in built:
            continue
        steps = v.param("headdim") // 8 + v.param("block_n") // 8  # k8: HGMMA ... F32.TF32
        assert reports[(v.key, 90)]["hgmma"] >= steps, (v.key, reports[(v.key, 90)])
    for v in sm90.BWD.variants():
        if v.key not in built:
            continue
        # S^T and dP^T (head-dim steps), dV and dK (query steps), dQ (key steps).
        steps = (v.param("headdim") + v.param("headdim_v")) // 16 + 2 * v.param("block_m") // 16 + sm90.bwd_block_n(v) // 16
        assert reports[(v.key, 90)]["hgmma"] >= steps, (v.key, reports[(v.key, 90)])
    for v in kvcache_device.MLA_SM90.variants():
        # S over 576 columns (36 k-steps), and each warpgroup's two O += P V over a tile's 64 keys.
        assert reports[(v.key, 90)]["hgmma"] >= 576 // 16 + 2 * 64 // 16, (v.key, reports[(v.key, 90)])
    for v in sm90.BWD_PLANES.variants():
        if v.key not in built:
            continue
        # Six products (three for "tf32") per k-step of S^T and dP^T (head-dim steps), dV and dK (query
        # steps) and each warpgroup's dQ share (key steps: one share at head dim 64, two above).
        products = 3 if v.param("tf32") else 6
        block = sm90.BWD_PLANES_BLOCK
        steps = 2 * v.param("headdim") // 16 + 2 * block // 16 + (1 if v.param("headdim") <= 64 else 2) * block // 16
        assert reports[(v.key, 90)]["hgmma"] >= products * steps, (v.key, reports[(v.key, 90)])


def test_generated_wgmma_header_is_current():
    """kernels_cu/generated/wgmma_ops.cuh is what tools/gen_wgmma.py writes."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "gen_wgmma.py")
    spec = importlib.util.spec_from_file_location("gen_wgmma", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    with open(gen.path(), encoding="utf-8") as f:
        assert f.read() == gen.generate(), "run python tools/gen_wgmma.py"


def test_variant_table_is_closed_and_named():
    keys = [v.key for v in _families.VARIANTS]
    assert len(set(keys)) == len(keys)
    for kernel in _families.KERNELS:
        for dtype in kernel.dtypes:
            for tile in kernel.tiles:
                for flags in itertools.product((False, True), repeat=len(kernel.flags)):
                    built = _kernels.Variant(kernel, dtype, tile, flags) in _families.VARIANTS
                    assert built != kernel._excluded(tile, flags), (kernel.name, tile, flags)
    general = _families.general.FWD.variant("float32", dropout=True)
    assert general.key == "general_fwd_fp32_drop_1"
    assert general.name_expression == "cupyflash::general_fwd<float, true>"
    tc = sm80.FWD.variant("bfloat16", (128, 32, 2), score_mod=True)
    assert tc.key == "sm80_fwd_bf16_d128_n32_m2_mod_1_top_0"
    assert tc.name_expression == "cupyflash::sm80_fwd<__nv_bfloat16, 128, 32, 2, true, false>"
    bwd = sm80.BWD.variant("float16", (64, 128, 64, 2))
    assert bwd.key == "sm80_bwd_fp16_d64_n128_q64_s2_mod_0"
    assert bwd.name_expression == "cupyflash::sm80_bwd<__half, 64, 128, 64, 2, false>"
    convert = common.DQ_CONVERT.variant("bfloat16")
    assert convert.key == "bwd_dq_convert_bf16"
    assert convert.name_expression == "cupyflash::bwd_dq_convert<__nv_bfloat16>"
    user = _kernels.UserCode("0123456789ab", "", True, False)
    built = _families.general.DQ.variant("float64", user=user)
    assert built.key == "general_bwd_dq_fp64_drop_0_fn0123456789ab"
    assert built.name_expression == ("cupyflash::general_bwd_dq<double, false, cupyflash::UserScore, "
                                     "cupyflash::NoUserMask>")
    with pytest.raises(ValueError, match="no score_mod"):
        common.DQ_CONVERT.variant("bfloat16", user=user)
    with pytest.raises(ValueError, match="no flags"):
        sm80.FWD.variant("float16", (128, 32, 2), causal=True)


@pytest.mark.parametrize("headdim, headdim_v, bucket", [(1, 1, 32), (32, 32, 32), (33, 8, 64), (59, 111, 128),
                                                        (40, 200, 224), (256, 256, 256), (257, 64, None)])
def test_headdim_bucket(headdim, headdim_v, bucket):
    assert sm80.headdim_bucket(headdim, headdim_v) == bucket


@pytest.mark.parametrize("script", ["sanitize_mbarrier", "sanitize_named_barrier"])
def test_sanitize_probe_kernels_compile(script):
    """The hand-off kernels of tests/sanitize_mbarrier.py and tests/sanitize_named_barrier.py (run under
    racecheck on a GPU) build for sm_90a from the kernels' own primitives, so they cannot drift from them
    unnoticed."""
    from cupy_backends.cuda.libs import nvrtc

    module = importlib.import_module(script)
    program = nvrtc.createProgram(module.SOURCE, "handoff.cu", (), ())
    try:
        nvrtc.compileProgram(program, _kernels.runtime_nvrtc_options(90, "90a"))
    except nvrtc.NVRTCError as exc:
        raise AssertionError(nvrtc.getProgramLog(program)) from exc
    assert nvrtc.getCUBIN(program)


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
        with open(copy / "common" / "softmax.cuh", "a", encoding="utf-8") as f:
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


def _static_asserts(lines, includes, arch=None):
    """Compiles ``lines`` of static_asserts after ``includes`` with the runtime's NVRTC options."""
    from cupy_backends.cuda.libs import nvrtc

    source = "\n".join([f'#include "{name}"' for name in includes] + lines)
    program = nvrtc.createProgram(source, "checks.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(program, _kernels.runtime_nvrtc_options(90, arch))
        except nvrtc.NVRTCError:
            pytest.fail(nvrtc.getProgramLog(program))
    finally:
        nvrtc.destroyProgram(program)


#: The folders of kernels_cu/ each folder may include (besides itself): the layers of ARCHITECTURE.md.
KERNEL_LAYERS = {"common": set(), "generated": set(), "fragment": {"common"}, "general": {"common"},
                 "sm80": {"common", "fragment"}, "sm90": {"common", "fragment", "generated", "sm80"},
                 "kvcache": {"common", "fragment", "generated", "sm80", "sm90"}}


def test_kernel_folders_include_only_their_layers():
    root = Path(_kernels.kernel_dir())
    assert {p.name for p in root.iterdir() if p.is_dir()} == set(KERNEL_LAYERS)
    wrong = []
    for folder, allowed in KERNEL_LAYERS.items():
        for path in sorted((root / folder).iterdir()):
            for line in path.read_text().splitlines():
                match = re.match(r'\s*#include\s+"([^/"]+)/', line)
                if match and match.group(1) not in allowed | {folder}:
                    wrong.append(f"{folder}/{path.name}: {line.strip()}")
    assert not wrong, "includes across layers:\n" + "\n".join(wrong)


def test_family_facts_match_the_kernels():
    """Each family states its constants once in Python (tiles, threads, shared memory of every variant,
    limits) and once in C++; NVRTC checks every pair with a static_assert, so drift fails here, in CI,
    instead of trapping or reading out of bounds on a GPU."""
    for facts, arch in ((general.cxx_facts(), None), (sm80.cxx_facts(), None), (kvcache_device.cxx_facts(), None),
                        (sm90.cxx_facts(), "90a")):
        headers, values = facts
        lines = [f'static_assert({expr} == {value}, "{expr}");' for expr, value in values.items()]
        _static_asserts(lines, headers, arch)
    # The fewest rows a CTA takes, which the checks size the grid limit with, is the general family's.
    assert _problem.GRID_TILE_ROWS == min(general.BLOCK_M, sm80.FWD_BLOCK_M,
                                      *(t[0] for tiles in sm90.FWD_TILES.values() for t in tiles),
                                      *(sm90.bwd_block_n(v) for v in sm90.BWD.variants()))


def test_argument_structs_match_params_cuh():
    """Every struct of kernels_cu/common/params.cuh has the size, and every field the offset, of its NumPy
    mirror in cupyflash/_params.py (CuPy copies the NumPy bytes into the launch as they are); so has the
    Hopper forward's Sm90FwdMaps (cupyflash/_families/sm90.py's MAPS), whose fields past the tensor maps the
    plans fill by name.

    NVRTC has no constant offsetof, so a kernel stores the values and ptxas' constant folding puts them
    in the PTX, which is read back."""
    from cupy_backends.cuda.libs import nvrtc

    expected = []
    lines = ['#include <cuda/std/cstddef>', '#include "common/params.cuh"', '#include "common/checks.cu"',
             '#include "common/dropout_mask.cu"', '#include "common/rotary.cu"', '#include "common/max_score.cu"',
             '#include "common/mask_mod_blocks.cu"', '#include "common/exact_sum.cu"', '#include "common/merge.cu"',
             '#include "sm90/fwd_mainloop.cuh"',
             "using namespace cupyflash;",
             'extern "C" __global__ void layout(unsigned long long* out) {']
    for name, dtype in {**_params.STRUCTS, "Sm90FwdMaps": sm90.MAPS}.items():
        expected.append((f"sizeof {name}", dtype.itemsize))
        lines.append(f"    out[{len(expected) - 1}] = sizeof({name});")
        for field, (_, offset) in dtype.fields.items():
            expected.append((f"{name}.{field}", offset))
            lines.append(f"    out[{len(expected) - 1}] = offsetof({name}, {field});")
    lines.append("}")
    options = tuple(o for o in _kernels.runtime_nvrtc_options(90) if not o.startswith("-arch")) + ("-arch=compute_90",)
    program = nvrtc.createProgram("\n".join(lines), "layout.cu", (), ())
    try:
        nvrtc.compileProgram(program, options)
        ptx = nvrtc.getPTX(program).decode()
    finally:
        nvrtc.destroyProgram(program)
    start = ptx.index(".entry layout(")  # the kernels of the included sources are in the PTX too
    ptx = ptx[start:ptx.index("\n}\n", start)]
    constants = dict(re.findall(r"mov\.u64\s+(%rd\d+), (\d+);", ptx))
    stores = re.findall(r"st\.global\.u64\s+\[%rd\d+\+?(\d*)\], (%rd\d+|\d+);", ptx)
    stored = {int(at or 0) // 8: int(constants.get(value, value)) for at, value in stores}
    assert len(stored) == len(expected), ptx
    mismatches = [(what, value, stored[i]) for i, (what, value) in enumerate(expected) if stored[i] != value]
    assert not mismatches, f"(field, NumPy, C++) that differ: {mismatches}"
