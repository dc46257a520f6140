"""CUDA sources, compile options and the closed table of kernel variants.

Every kernel is a template instantiated through ``name_expressions``; a :class:`Variant` names every
compile-time parameter, and its ``key`` is used for logs, errors and test ids (the in-process cache is
keyed by device id and Variant).
Sources are read once from ``kernels_cu/``. CuPy's disk cache hashes the source string and options but
not the headers it ``#include``s, so a hash of every file in ``kernels_cu/`` goes into the options.

Nothing here needs a GPU except :func:`get_kernel`, which compiles with ``cupy.RawModule`` for the
current device (memoized per device) and reuses CuPy's disk cache across processes.
"""

import dataclasses
import functools
import hashlib
import os

#: dtype name -> the C++ storage type in the kernels.
CTYPES = {
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float32": "float",
    "float64": "double",
}

#: Short dtype names used in variant keys.
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}

#: Tensor-core forward tiles: head-dim bucket -> (keys per block kBlockN, 16-row m-tiles per warp),
#: preferred first; dispatch takes the first whose shared memory fits the device. Buckets cover headdim
#: and headdim_v up to 256; kernels_cu/tc_tile.cuh derives the rest of the tile. Measured on the H200
#: (bf16, TFLOP/s at seqlen 16384, non-causal / causal, 2026-11-29): headdim 64: (64, 2) 228 / 215
#: against (32, 2) 184 / 172; headdim 128: (32, 2) 241 / 216, (128, 1) 242 / 235, (64, 1) 213 / 209,
#: and (32, 2) needs 87 KB where (128, 1) needs 174 KB; headdim 256: (64, 1) 234 / 239 against
#: (32, 1) 192 / 194.
TC_FWD_TILES = {
    32: ((64, 2),),
    64: ((64, 2),),
    96: ((32, 2),),
    128: ((32, 2),),
    160: ((64, 1), (32, 1)),
    192: ((64, 1), (32, 1)),
    224: ((64, 1), (32, 1)),
    256: ((64, 1), (32, 1)),
}
#: Query rows per CTA of the tensor-core forward (TcFwdTraits::kBlockM).
TC_FWD_BLOCK_M = 128
#: Compute capability from which the mma.sync kernels run.
TC_MIN_CAPABILITY = 80


def tc_fwd_smem_bytes(variant):
    """Dynamic shared memory of a tensor-core forward variant (TcFwdTraits::kSmemBytes).

    Q tile plus 2 or 3 stages of K and V tiles (3 where they fit in 99 KB), rows padded by 8 elements.
    The kernel traps if launched with less than its traits require.
    """
    row_bytes = (variant.headdim + 8) * 2
    q_bytes = TC_FWD_BLOCK_M * row_bytes
    stage_bytes = 2 * variant.block_n * row_bytes
    stages = 3 if q_bytes + 3 * stage_bytes <= 99 * 1024 else 2
    return q_bytes + stages * stage_bytes


def tc_fwd_threads(variant):
    """Threads per CTA of a tensor-core forward variant (TcFwdTraits::kThreads)."""
    return 32 * TC_FWD_BLOCK_M // (16 * variant.m_tiles)


#: Threads per CTA of every general-path kernel, and its tile sizes (kernels_cu/general_tile.cuh).
GENERAL_THREADS = 128
GENERAL_BLOCK_M = 32  # score-tile rows: queries (forward, dQ) or keys (dK/dV) per CTA
GENERAL_CHUNK = 64
#: Rows of the delta preprocess handled by one CTA (one warp each).
DELTA_ROWS_PER_CTA = 4


#: Tensor-core backward tiles: head-dim bucket -> (keys per CTA kBlockN, queries per iteration kBlockM,
#: query buffers kStages), preferred first; dispatch takes the first whose shared memory fits the device.
#: The first fits the H100/H200 (227 KB per block); each later one is there for a smaller budget: the
#: 163 KB of sm_80 or the 99 KB of sm_86/sm_89 (head dims 160 up do not fit the latter and take the
#: general path there). Every tile runs 8 warps.
TC_BWD_TILES = {
    32: ((128, 128, 2), (128, 64, 2)),
    64: ((128, 128, 2), (128, 64, 2), (128, 64, 1)),
    96: ((128, 64, 2), (64, 64, 1)),
    128: ((128, 64, 2), (128, 64, 1), (64, 64, 1)),
    160: ((64, 64, 2),),
    192: ((64, 64, 2), (64, 64, 1)),
    224: ((64, 64, 2), (64, 64, 1)),
    256: ((64, 64, 2), (64, 64, 1)),
}
#: Threads per CTA of the tensor-core backward (TcBwdTraits::kThreads) and of its dQ conversion.
TC_BWD_THREADS = 256
TC_BWD_CONVERT_THREADS = 256


def tc_bwd_smem_bytes(variant):
    """Dynamic shared memory of a tensor-core backward variant (TcBwdTraits::kSmemBytes).

    K and V tiles (block_n rows), ``stages`` buffers of Q and dO (block_m rows), rows padded by 8
    elements; P^T and dS^T (block_n x block_m, padded by 8); ``stages`` buffers of lse and delta.
    """
    row_bytes = (variant.headdim + 8) * 2
    tiles = (2 * variant.block_n + 2 * variant.stages * variant.block_m) * row_bytes
    probs = 2 * variant.block_n * (variant.block_m + 8) * 2
    return tiles + probs + 2 * variant.stages * variant.block_m * 4


#: Integer template parameters, as they appear in variant keys.
_KEY_PREFIX = {"headdim": "d", "block_n": "n", "m_tiles": "m", "block_m": "q", "stages": "s"}
_HALF_DTYPES = ("float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Family:
    """A kernel template: its source file, the dtypes it is built for and its template parameters.

    The template takes the storage type, then the integer ``tile_params`` (each instantiation's
    values are one entry of ``tiles``), then the causal flag when ``takes_causal``.
    """

    source_file: str
    dtypes: tuple
    takes_causal: bool
    tile_params: tuple = ()
    tiles: tuple = ((),)


FAMILIES = {
    "general_fwd": Family("general_fwd.cu", tuple(CTYPES), True),
    "general_bwd_delta": Family("general_bwd.cu", tuple(CTYPES), False),
    "general_bwd_dq": Family("general_bwd.cu", tuple(CTYPES), True),
    "general_bwd_dkdv": Family("general_bwd.cu", tuple(CTYPES), True),
    "tc_fwd": Family(
        "tc_fwd.cu", _HALF_DTYPES, True, ("headdim", "block_n", "m_tiles"),
        tuple((d, *tile) for d, choices in TC_FWD_TILES.items() for tile in choices),
    ),
    "tc_bwd": Family(
        "tc_bwd.cu", _HALF_DTYPES, True, ("headdim", "block_n", "block_m", "stages"),
        tuple((d, *tile) for d, choices in TC_BWD_TILES.items() for tile in choices),
    ),
    "tc_bwd_dq_convert": Family("tc_bwd.cu", _HALF_DTYPES, False),
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compiled kernel: a family and every template parameter it takes."""

    family: str
    dtype: str
    causal: bool = False
    tile: tuple = ()  # values of the family's tile_params

    def _param(self, name):
        return self.tile[FAMILIES[self.family].tile_params.index(name)]

    @property
    def headdim(self):
        """Head-dim bucket of a tensor-core variant."""
        return self._param("headdim")

    @property
    def block_n(self):
        """Keys per block of a tensor-core forward variant, keys per CTA of a backward one."""
        return self._param("block_n")

    @property
    def m_tiles(self):
        """16-row m-tiles per warp of a tensor-core forward variant."""
        return self._param("m_tiles")

    @property
    def block_m(self):
        """Queries per iteration of a tensor-core backward variant."""
        return self._param("block_m")

    @property
    def stages(self):
        """Query buffers of a tensor-core backward variant."""
        return self._param("stages")

    @property
    def key(self):
        """Name used for caches, logs, errors and test ids, e.g. ``tc_fwd_bf16_d128_n32_m2_causal_1``."""
        family = FAMILIES[self.family]
        key = f"{self.family}_{SHORT_DTYPE[self.dtype]}"
        key += "".join(f"_{_KEY_PREFIX[name]}{value}" for name, value in zip(family.tile_params, self.tile))
        if family.takes_causal:
            key += f"_causal_{int(self.causal)}"
        return key

    @property
    def source_file(self):
        return FAMILIES[self.family].source_file

    @property
    def name_expression(self):
        family = FAMILIES[self.family]
        args = [CTYPES[self.dtype], *(str(value) for value in self.tile)]
        if family.takes_causal:
            args.append("true" if self.causal else "false")
        return f"cupyflash::{self.family}<{', '.join(args)}>"


def _all_variants():
    return tuple(
        Variant(name, dtype, causal, tile)
        for name, family in FAMILIES.items()
        for dtype in family.dtypes
        for tile in family.tiles
        for causal in ((False, True) if family.takes_causal else (False,))
    )


def tc_headdim_bucket(headdim, headdim_v, buckets=tuple(TC_FWD_TILES)):
    """Smallest of ``buckets`` covering both head dims, or None when both do not fit the largest."""
    needed = max(headdim, headdim_v)
    return next((bucket for bucket in sorted(buckets) if bucket >= needed), None)


#: The closed table of variants: dispatch, the compile-everything test and error messages use it.
VARIANTS = _all_variants()


def kernel_dir():
    """Directory holding the CUDA sources (inside the installed package, or beside it in a checkout)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "kernels_cu"), os.path.join(os.path.dirname(here), "kernels_cu")):
        if os.path.isfile(os.path.join(candidate, "dtypes.cuh")):
            return candidate
    raise RuntimeError(f"cupyflash: CUDA sources (kernels_cu/) not found next to {here}; the installation is broken")


@functools.lru_cache(maxsize=None)
def _sources():
    directory = kernel_dir()
    files = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith((".cu", ".cuh")):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                files[name] = f.read()
    return files


def source(variant):
    """The source string of a variant's ``.cu`` file (headers come through ``-I``)."""
    return _sources()[variant.source_file]


@functools.lru_cache(maxsize=None)
def source_hash():
    """Hash of every file in ``kernels_cu/``: edits to any header change the compile options."""
    digest = hashlib.sha256()
    for name, text in _sources().items():
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def compile_options():
    """Options cupyflash passes to ``cupy.RawModule`` (CuPy appends its include paths, -ftz and -arch)."""
    return (f"-I{kernel_dir()}", f"-DCUPYFLASH_SRC_HASH={source_hash()}")


_kernels = {}


def get_kernel(variant):
    """The compiled ``cupy.RawKernel`` of ``variant`` on the current device (memoized per device).

    Thread-safe: two threads asking for the same new variant may both compile it (CuPy's disk cache
    makes the second cheap) and the first one stored wins.
    """
    import cupy

    cache_key = (cupy.cuda.Device().id, variant)
    kernel = _kernels.get(cache_key)
    if kernel is None:
        module = cupy.RawModule(
            code=source(variant), options=compile_options(), name_expressions=(variant.name_expression,)
        )
        try:
            kernel = module.get_function(variant.name_expression)
        except cupy.cuda.compiler.CompileException as exc:
            raise RuntimeError(f"cupyflash: compiling kernel {variant.key} failed:\n{exc}") from exc
        kernel = _kernels.setdefault(cache_key, kernel)
    return kernel


def precompile(variants=VARIANTS, max_workers=8):
    """Compile ``variants`` for the current device in parallel threads (NVRTC runs without the GIL)."""
    import concurrent.futures

    import cupy

    device = cupy.cuda.Device().id

    def build(variant):
        with cupy.cuda.Device(device):
            return get_kernel(variant)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        list(pool.map(build, variants))


def runtime_nvrtc_options(arch):
    """The full NVRTC option list ``cupy.RawModule`` uses for ``compile_options()`` on an ``arch`` device.

    Mirrors CuPy's assembly: its include paths and ``--std=c++17`` around our options, then ``-ftz=true``,
    ``-arch=sm_<arch>`` (a cubin, so ptxas checks every instruction) and
    ``--device-as-default-execution-space``.
    """
    from cupy._core import core

    return core.assemble_cupy_compiler_options(compile_options()) + (
        "-ftz=true",
        f"-arch=sm_{arch}",
        "--device-as-default-execution-space",
    )


def compile_offline(variant, arch):
    """Compile ``variant`` to a cubin for ``sm_<arch>`` with NVRTC alone (no GPU needed).

    Returns ``(cubin_bytes, ptxas_log)``; the log holds ptxas' registers, stack frame and spill bytes.
    Raises RuntimeError with the compiler log on failure.
    """
    from cupy_backends.cuda.libs import nvrtc

    options = runtime_nvrtc_options(arch) + ("--ptxas-options=-v",)
    program = nvrtc.createProgram(source(variant), variant.source_file, (), ())
    try:
        nvrtc.addNameExpression(program, variant.name_expression)
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(
                f"cupyflash: {variant.key} does not compile for sm_{arch}:\n{nvrtc.getProgramLog(program)}"
            ) from exc
        return nvrtc.getCUBIN(program), nvrtc.getProgramLog(program)
    finally:
        nvrtc.destroyProgram(program)
