"""CUDA sources, compile options, and the kernel templates with their closed table of variants.

A :class:`Kernel` is one C++ template of ``kernels_cu/``: its source file, the dtypes it is built for and
its template parameters (integer tile parameters, then boolean flags). A :class:`Variant` fixes every
parameter; its ``key`` names them all (``sm80_fwd_bf16_d128_n32_m2_mod_0_top_0``) and is used for logs, errors
and test ids, and its ``name_expression`` instantiates it through NVRTC's ``name_expressions``. The
kernel families (``cupyflash/_families``) declare their kernels; ``cupyflash._families.VARIANTS`` is
the union of their tables.

Sources are read once from ``kernels_cu/``. CuPy's disk cache hashes the source string and options but
not the headers it ``#include``s, so a hash of every file in ``kernels_cu/`` goes into the options.
Nothing here needs a GPU except :func:`get_kernel`, which compiles with ``cupy.RawModule`` for the
current device (memoized per device) and reuses CuPy's disk cache across processes.
"""

import dataclasses
import functools
import hashlib
import itertools
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

ALL_DTYPES = tuple(CTYPES)
HALF_DTYPES = ("float16", "bfloat16")

#: Template parameters as they appear in variant keys.
_KEY_PREFIX = {"headdim": "d", "headdim_v": "v", "block_n": "n", "m_tiles": "m", "block_m": "q", "stages": "s",
               "score_mod": "mod", "tf32": "tf32", "dropout": "drop", "max_score": "top",
               "float32_tables": "f32tab", "vectors": "vec"}


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A C++ kernel template: ``cupyflash::<name><storage type, *tile values, *flags>``.

    ``tiles`` is the closed table of the integer ``tile_params``' values; every combination of the
    boolean ``flags`` is built for every tile and dtype, but those ``excludes(tile, flags)`` names (a
    function of the tile and the {flag: value} dict; None: none). A template without a storage type has no
    ``dtypes`` (its variants' dtype is None). ``arch`` names the one target of a kernel that uses
    architecture-specific instructions (``"90a"``: wgmma, setmaxnreg), None for kernels built for
    whatever device runs them. ``user_functions``: its last template arguments are the generated structs
    of a score_mod and a mask_mod (:class:`UserCode`); ``user_required``: it is built only with them
    (and has no variants in the closed table).
    """

    name: str
    source_file: str
    dtypes: tuple
    tile_params: tuple = ()
    tiles: tuple = ((),)
    flags: tuple = ()
    arch: str = None
    excludes: object = None
    user_functions: bool = False
    user_required: bool = False

    def variant(self, dtype=None, tile=(), user=None, **flags):
        """The variant of ``dtype`` and ``tile`` with the given flags (missing flags are False), built after
        ``user`` (a :class:`UserCode`, or None) when the template takes user functions."""
        unknown = set(flags) - set(self.flags)
        if unknown:
            raise ValueError(f"{self.name} has no flags {sorted(unknown)}")
        if user is not None and not self.user_functions:
            raise ValueError(f"{self.name} takes no score_mod or mask_mod")
        if user is None and self.user_required:
            raise ValueError(f"{self.name} is built for a score_mod or mask_mod only")
        values = tuple(bool(flags.get(f, False)) for f in self.flags)
        if self._excluded(tuple(tile), values):
            raise ValueError(f"{self.name} is not built with tile {tuple(tile)} and flags {dict(zip(self.flags, values))}")
        return Variant(self, dtype, tuple(tile), values, user)

    def variants(self):
        """Every variant of the template (none for a template built only with user functions)."""
        if self.user_required:
            return ()
        return tuple(
            Variant(self, dtype, tile, flags)
            for dtype in (self.dtypes or (None,))
            for tile in self.tiles
            for flags in itertools.product((False, True), repeat=len(self.flags))
            if not self._excluded(tile, flags)
        )

    def _excluded(self, tile, flags):
        return self.excludes is not None and self.excludes(tile, dict(zip(self.flags, flags)))


@dataclasses.dataclass(frozen=True)
class UserCode:
    """The C++ generated from a score_mod and a mask_mod (cupyflash/_trace.py's kernel_source), compiled
    ahead of a kernel's source: the kernel then takes ``cupyflash::UserScore`` and ``cupyflash::UserMask``
    (or ``NoUserScore``, ``NoUserMask`` for the one it lacks) as its last template arguments. ``key``, a
    hash of the two traced keys, names it in variant keys: the expressions, never the Python functions."""

    key: str
    source: str
    score: bool
    mask: bool
    fast: bool = False

    @property
    def template_args(self):
        return ("cupyflash::UserScore" if self.score else "cupyflash::NoUserScore",
                "cupyflash::UserMask" if self.mask else "cupyflash::NoUserMask")


_user_codes = {}


def user_code(score, mask, fast=False):
    """The :class:`UserCode` of traced score_mod ``score`` and mask_mod ``mask`` (either may be None, not
    both), made once per pair of keys; ``fast``: the score_mod's float functions in their fast forms (the
    16-bit tensor-core kernels', whose roundings are coarser than the approximations')."""
    key = (None if score is None else score.key, None if mask is None else mask.key, bool(fast and score is not None))
    code = _user_codes.get(key)
    if code is None:
        from . import _trace

        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
        code = _user_codes.setdefault(key, UserCode(digest, _trace.kernel_source(score, mask, key[2]), score is not None,
                                                    mask is not None, key[2]))
    return code


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compiled kernel: a template and every parameter it takes (``user``: the generated code of the
    score and mask functions it is built with, or None)."""

    kernel: Kernel
    dtype: str
    tile: tuple = ()
    flags: tuple = ()
    user: UserCode = None

    def param(self, name):
        """Value of a tile parameter or flag by name."""
        if name in self.kernel.tile_params:
            return self.tile[self.kernel.tile_params.index(name)]
        return self.flags[self.kernel.flags.index(name)]

    @property
    def key(self):
        """Name used for caches, logs, errors and test ids, e.g. ``sm80_fwd_bf16_d128_n32_m2_mod_0_top_0``."""
        key = self.kernel.name + (f"_{SHORT_DTYPE[self.dtype]}" if self.dtype else "")
        key += "".join(f"_{_KEY_PREFIX[n]}{v}" for n, v in zip(self.kernel.tile_params, self.tile))
        key += "".join(f"_{_KEY_PREFIX[n]}_{int(v)}" for n, v in zip(self.kernel.flags, self.flags))
        if self.user is not None:
            key += f"_fn{self.user.key}"
        return key

    @property
    def source_file(self):
        return self.kernel.source_file

    @property
    def source(self):
        """The source string NVRTC compiles: the kernel's file, after the user functions' code if any."""
        text = source(self.kernel.source_file)
        return text if self.user is None else self.user.source + text

    @property
    def name_expression(self):
        args = [CTYPES[self.dtype]] if self.dtype else []
        args += [*(str(v) for v in self.tile), *("true" if f else "false" for f in self.flags)]
        if self.user is not None:
            args += self.user.template_args
        return f"cupyflash::{self.kernel.name}<{', '.join(args)}>" if args else f"cupyflash::{self.kernel.name}"


def kernel_dir():
    """Directory holding the CUDA sources (inside the installed package, or beside it in a checkout)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "kernels_cu"), os.path.join(os.path.dirname(here), "kernels_cu")):
        if os.path.isfile(os.path.join(candidate, "common", "dtypes.cuh")):
            return candidate
    raise RuntimeError(f"cupyflash: CUDA sources (kernels_cu/) not found next to {here}; the installation is broken")


@functools.lru_cache(maxsize=None)
def _sources():
    directory = kernel_dir()
    files = {}
    for folder, _, names in sorted(os.walk(directory)):
        for name in sorted(names):
            if name.endswith((".cu", ".cuh")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    files[os.path.relpath(path, directory).replace(os.sep, "/")] = f.read()
    return dict(sorted(files.items()))


def source(source_file):
    """The source string of a ``.cu`` file (headers come through ``-I``)."""
    return _sources()[source_file]


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


def compile_options(arch=None):
    """Options cupyflash passes to ``cupy.RawModule`` (CuPy appends its include paths, -ftz and -arch).

    ``arch`` (a kernel's own target, e.g. ``"90a"``) adds ``-arch=sm_<arch>``: NVRTC keeps that target's
    suffix when CuPy's own ``-arch=sm_90`` follows.
    """
    options = (f"-I{kernel_dir()}", f"-DCUPYFLASH_SRC_HASH={source_hash()}")
    return options + ((f"-arch=sm_{arch}",) if arch else ())


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
            code=variant.source,
            options=compile_options(variant.kernel.arch),
            name_expressions=(variant.name_expression,),
        )
        try:
            kernel = module.get_function(variant.name_expression)
        except cupy.cuda.compiler.CompileException as exc:
            raise RuntimeError(f"cupyflash: compiling kernel {variant.key} failed:\n{exc}") from exc
        kernel = _kernels.setdefault(cache_key, kernel)
    return kernel


def builds_for(variant, capability):
    """Whether ``variant`` runs on a device of compute ``capability`` (e.g. 90): sm_90a kernels only on 90."""
    arch = variant.kernel.arch
    return arch is None or int(arch.rstrip("a")) == capability


def precompile(variants, max_workers=8):
    """Compile those of ``variants`` that run on the current device in parallel threads (NVRTC runs
    without the GIL)."""
    import concurrent.futures

    import cupy

    device = cupy.cuda.Device().id
    capability = int(cupy.cuda.Device().compute_capability)
    variants = [v for v in variants if builds_for(v, capability)]

    def build(variant):
        with cupy.cuda.Device(device):
            return get_kernel(variant)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        list(pool.map(build, variants))


def runtime_nvrtc_options(arch, kernel_arch=None):
    """The full NVRTC option list ``cupy.RawModule`` uses for ``compile_options(kernel_arch)`` on an
    ``arch`` device.

    Mirrors CuPy's assembly: its include paths and ``--std=c++17`` around our options, then ``-ftz=true``,
    ``-arch=sm_<arch>`` (a cubin, so ptxas checks every instruction) and
    ``--device-as-default-execution-space``.
    """
    from cupy._core import core

    return core.assemble_cupy_compiler_options(compile_options(kernel_arch)) + (
        "-ftz=true",
        f"-arch=sm_{arch}",
        "--device-as-default-execution-space",
    )


def compile_offline(variants, arch):
    """Compile ``variants`` (all of one source file and user code) to one cubin for ``sm_<arch>`` with NVRTC alone
    (kernels with an ``arch`` of their own build for that target, on an ``arch`` device: ``"90a"`` on 90).

    One program for many variants parses the sources once. Needs no GPU. Returns ``(cubin_bytes,
    ptxas_log, lowered)``, ``lowered`` mapping each variant to its mangled name in the log (which holds
    ptxas' registers, stack frame and spill bytes per kernel). Raises RuntimeError with the compiler log
    on failure.
    """
    from cupy_backends.cuda.libs import nvrtc

    variants = tuple(variants)
    texts = {v.source for v in variants}
    if len(texts) != 1:
        raise ValueError(f"compile_offline takes variants of one source file and user code, got "
                         f"{sorted({v.key for v in variants})}")
    kernel_arch = variants[0].kernel.arch
    options = runtime_nvrtc_options(arch, kernel_arch) + ("--ptxas-options=-v",)
    program = nvrtc.createProgram(texts.pop(), variants[0].source_file, (), ())
    try:
        for v in variants:
            nvrtc.addNameExpression(program, v.name_expression)
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as exc:
            keys = ", ".join(v.key for v in variants)
            raise RuntimeError(
                f"cupyflash: {keys} do not compile for sm_{arch}:\n{nvrtc.getProgramLog(program)}"
            ) from exc
        lowered = {v: nvrtc.getLoweredName(program, v.name_expression) for v in variants}
        # CuPy's getCUBIN drops the cubin's last byte (the ELF's zero padding), which disassemblers need.
        return nvrtc.getCUBIN(program) + b"\0", nvrtc.getProgramLog(program), lowered
    finally:
        nvrtc.destroyProgram(program)
