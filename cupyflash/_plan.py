"""Plans: a CUDA call prepared once for its layout and launched for every call of that layout.

A call's layout is what its checks and its setup depend on: the kinds, shapes, strides, dtypes,
devices and 16-byte alignment of its arrays, and its other arguments with their types. A plan holds
everything a call of one layout needs except the addresses of its arrays: the argument structs of its
kernels with every size, stride and option filled, the tensor maps, the launches (function, grid,
block, shared memory) and the sizes of the outputs and the workspace. Running it for arrays of that
layout takes the outputs and the workspace from CuPy's pool in one allocation, writes the arrays'
addresses into the structs and the tensor maps (cuTensorMapReplaceAddress where one changed), zeroes
the workspace the kernels do not, and launches on the current stream: a few microseconds of host
time, where the checks and the setup of a call take about a hundred.

The launches go as one CUDA graph (:class:`_Graph`): per run, each kernel node takes its arguments
from the plan's buffer (cuGraphExecKernelNodeSetParams, about 1.2 us) and the graph is launched once
(about 2.8 us for three kernels), where a launch per kernel costs about 4.5 us on the H200's host
(bench/NOTES.md). A stream that is being captured into a user's graph gets the kernel launches
themselves (a graph launch is not captured), with the zeroing on the call's own memory.

Generating a run and making a graph pay off only for a plan that runs again, so a plan's first run
is interpreted (loops over its words and launches, the kernels launched one by one): a plan that runs
once (a ring step's, the KV-cache general path's) costs no more. Its second run generates the
straight-line run and, outside a capture, makes the graph; a plan whose second run is captured makes
its graph at the first run outside a capture after that.

A plan is built by the code that would run the call (the families of cupyflash/_families): it writes
its structs as always, but through :class:`Slot` placeholders, whose addresses are sentinels the
builder finds again in the structs' bytes. So a plan never confuses two arrays that happened to share an
address when it was built (``flash_attention(q, q, q)``), and an input the kernels cannot read as it is
(a layout they copy) is copied again on every run. An input's parts (the stacked parts of a merge) can
be slots of their own (:meth:`PlanBuilder.view`), whose words a run writes as the input's address plus
the part's offset: no array per part.

Plans are cached by the public API (cupyflash/_api.py) in a :class:`PlanCache` per thread and device:
a plan's argument buffer is rewritten by every run, and its functions belong to one device.
"""

import ctypes
import functools
import threading

import numpy

#: Sentinel addresses: 0xFFF7A5A5 in the high word cannot be a device address, and as a pair of int32 or
#: a double it is no value a struct field takes.
_SENTINEL = 0xFFF7A5A5 << 32
#: The dropout seed a plan is built with (a DropoutArg's 64-bit seed; kernels_cu/common/dropout.cuh): its
#: words, and the 32-bit offset after each, are per-run scalars (Plan.dropout_scalars). 4 past the slots'
#: base, so the slots' scan (multiples of 8) passes over it.
DROPOUT_SEED = _SENTINEL + 4
#: Alignment of the buffers inside a call's allocation (CuPy's pool aligns the allocation to 512), and of
#: the structs inside a plan's argument buffer (a CUtensorMap is 64-byte aligned).
_BUFFER_ALIGN = 256
_STRUCT_ALIGN = 64


#: Kinds of workspace (PlanBuilder._buffers): zeroed before every launch of the plan's kernels, or
#: zeroed once and left zero by them.
ZEROED = "zeroed"
KEPT_ZERO = "kept zero"


def _aligned(n, alignment):
    return -(-n // alignment) * alignment


class _Address:
    """What a kernel argument builder reads of ``x.data``: the address."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class Slot:
    """An array of a plan being built: an input (shape, strides and dtype of the array the kernels read,
    after its conversion; ``aligned16`` from the first call's address) or an output or workspace buffer
    (C-contiguous, at an offset of the call's allocation). Its address is a sentinel."""

    def __init__(self, index, shape, dtype, strides=None, aligned16=True):
        self.index = index
        self.shape = tuple(shape)
        self.dtype = numpy.dtype(dtype)
        self.ndim = len(self.shape)
        self.size = int(numpy.prod(self.shape, dtype=numpy.int64))
        if strides is None:
            strides, step = [], self.dtype.itemsize
            for n in reversed(self.shape):
                strides.append(step)
                step *= max(n, 1)
            strides = tuple(reversed(strides))
        self.strides = tuple(strides)
        self.nbytes = self.size * self.dtype.itemsize
        self.aligned16 = aligned16
        self.data = _Address(_SENTINEL + 8 * index)


def aligned16(x):
    """Whether the address of ``x`` (an array or a :class:`Slot`) is a multiple of 16 bytes."""
    return x.aligned16 if isinstance(x, Slot) else x.data.ptr % 16 == 0


class _TensorMap:
    """A CUtensorMap in a plan's argument buffer, of the array in one slot: encoded for the first address
    it is given, then moved to each new address with cuTensorMapReplaceAddress."""

    __slots__ = ("address", "encode", "current")

    def __init__(self, address, encode):
        self.address = address  # of the 128 bytes in the argument buffer
        self.encode = encode    # ptr -> the encoded map's 128 bytes
        self.current = None

    def point(self, ptr):
        if ptr == self.current:
            return
        if self.current is None:
            ctypes.memmove(self.address, self.encode(ptr), 128)
        else:
            result = _replace_address()(ctypes.c_void_p(self.address), ctypes.c_void_p(ptr))
            if result != 0:
                raise RuntimeError(f"cupyflash: cuTensorMapReplaceAddress failed with CUresult {result}")
        self.current = ptr


@functools.lru_cache(maxsize=None)
def _replace_address():
    function = ctypes.CDLL("libcuda.so.1").cuTensorMapReplaceAddress
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


class _Launch:
    """One kernel launch: the driver function, the launch shape, and the kernelParams array of pointers
    to its arguments in the plan's buffer (the driver copies their bytes at the launch)."""

    __slots__ = ("function", "shape", "params", "params_address")

    def __init__(self, function, grid, threads, smem, addresses):
        self.function = function
        self.shape = (*grid, threads, 1, 1, smem)
        self.params = numpy.array(addresses, numpy.uint64)
        self.params_address = self.params.ctypes.data


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS (the v1 layout of cuGraphAddKernelNode and cuGraphExecKernelNodeSetParams)."""

    _fields_ = [("func", ctypes.c_void_p), ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint),
                ("grid_z", ctypes.c_uint), ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint),
                ("block_z", ctypes.c_uint), ("smem", ctypes.c_uint), ("kernel_params", ctypes.c_void_p),
                ("extra", ctypes.c_void_p)]


class _MemsetNodeParams(ctypes.Structure):
    """CUDA_MEMSET_NODE_PARAMS."""

    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("element_size", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


@functools.lru_cache(maxsize=None)
def _graph_driver():
    """The driver's graph functions, with their argument types."""
    lib = ctypes.CDLL("libcuda.so.1")
    p, pp, u64 = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_ulonglong
    functions = {"cuGraphCreate": [pp, ctypes.c_uint], "cuGraphDestroy": [p],
                 "cuGraphAddKernelNode": [pp, p, pp, ctypes.c_size_t, p],
                 "cuGraphAddMemsetNode": [pp, p, pp, ctypes.c_size_t, p, p],
                 "cuGraphInstantiateWithFlags": [pp, p, u64], "cuGraphExecDestroy": [p],
                 "cuGraphExecKernelNodeSetParams": [p, p, p], "cuCtxGetCurrent": [pp]}
    table = {}
    for name, argtypes in functions.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
        table[name] = function
    return table


def _check(result, what):
    if result != 0:
        raise RuntimeError(f"cupyflash: {what} failed with CUresult {result}")


class _Graph:
    """A plan's launches as one executable CUDA graph on the current device: a memset node zeroing the
    first ``memset_nbytes`` of the plan's own counters (memory it keeps: launches of one executable
    graph never overlap, so the counters are never shared by two running launches), then the kernel
    nodes in launch order, each after the one before. The rest of the ``counters_nbytes`` (counters the
    kernels leave zero) is zeroed once, on ``stream``, before the graph's first launch there; later
    launches on any stream come after that one. ``nodes`` are (graph exec, node, params) triples for
    cuGraphExecKernelNodeSetParams, whose params point at the plan's kernelParams arrays."""

    def __init__(self, launches, counters_nbytes, memset_nbytes, stream):
        import cupy
        from cupy.cuda import runtime

        driver = _graph_driver()
        self._driver = driver
        self.counters = cupy.cuda.alloc(counters_nbytes) if counters_nbytes else None
        if counters_nbytes > memset_nbytes:
            runtime.memsetAsync(self.counters.ptr + memset_nbytes, 0, counters_nbytes - memset_nbytes, stream)
        self._graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()
        _check(driver["cuGraphCreate"](ctypes.byref(self._graph), 0), "cuGraphCreate")
        previous = None
        if memset_nbytes:
            context = ctypes.c_void_p()
            _check(driver["cuCtxGetCurrent"](ctypes.byref(context)), "cuCtxGetCurrent")
            memset = _MemsetNodeParams(self.counters.ptr, 0, 0, 1, memset_nbytes, 1)
            previous = ctypes.c_void_p()
            _check(driver["cuGraphAddMemsetNode"](ctypes.byref(previous), self._graph, None, 0, ctypes.byref(memset),
                                                  context), "cuGraphAddMemsetNode")
        self._params, nodes = [], []
        for step in launches:
            grid_x, grid_y, grid_z, block_x, block_y, block_z, smem = step.shape
            params = _KernelNodeParams(step.function, grid_x, grid_y, grid_z, block_x, block_y, block_z, smem,
                                       step.params_address, None)
            node = ctypes.c_void_p()
            after = ctypes.byref(previous) if previous is not None else None
            _check(driver["cuGraphAddKernelNode"](ctypes.byref(node), self._graph, after, int(previous is not None),
                                                  ctypes.byref(params)), "cuGraphAddKernelNode")
            self._params.append(params)
            nodes.append(node)
            previous = node
        _check(driver["cuGraphInstantiateWithFlags"](ctypes.byref(self.exec), self._graph, 0),
               "cuGraphInstantiateWithFlags")
        self.nodes = tuple((self.exec, node, ctypes.byref(params)) for node, params in zip(nodes, self._params))

    def __del__(self):
        try:
            if self.exec:
                self._driver["cuGraphExecDestroy"](self.exec)
            if self._graph:
                self._driver["cuGraphDestroy"](self._graph)
        except Exception:  # noqa: BLE001 (at interpreter exit the driver may be gone)
            pass


class PlanBuilder:
    """Collects a plan: its inputs (the order of :meth:`input` calls is the order a run takes them in),
    outputs and workspace, argument structs, tensor maps and launches."""

    def __init__(self):
        self._slots = []         # every Slot, by index
        self._converts = []      # per input: None, or the function that makes it readable
        self._inputs = []        # slot indices of the inputs, in order
        self._buffers = []       # (slot index, offset, kind: None, ZEROED or KEPT_ZERO)
        self._nbytes = 0
        self._structs = []       # numpy size-1 arrays, filled by the caller
        self._maps = []          # (struct, field, slot index, encode)
        self._launches = []      # (function, grid, threads, smem, structs)
        self._int32_fields = []  # (struct, byte offset) of per-run int32 scalars
        self._views = []         # (view slot index, input slot index, byte offset)
        self._keep = []

    def input(self, array=None, convert=None):
        """A slot for the next input; ``convert`` (e.g. cupy.ascontiguousarray), when given, is applied to
        the array on every run, and ``array`` is the first call's (already converted) array. None: the
        call has no such array (a run is given None in its place); returns None."""
        if array is None:
            self._inputs.append(None)
            self._converts.append(None)
            return None
        slot = Slot(len(self._slots), array.shape, array.dtype, array.strides, array.data.ptr % 16 == 0)
        self._slots.append(slot)
        self._inputs.append(slot.index)
        self._converts.append(convert)
        return slot

    def view(self, slot, offset, shape, strides):
        """A slot for the array of ``shape`` and ``strides`` (bytes) that starts ``offset`` bytes into the
        input of ``slot`` (a part of a stacked input): a run writes that input's address plus
        ``offset`` wherever the structs hold the view's."""
        assert slot.index in self._inputs, "views are of inputs"
        view = Slot(len(self._slots), shape, slot.dtype, strides, slot.aligned16 and offset % 16 == 0)
        self._slots.append(view)
        self._views.append((view.index, slot.index, offset))
        return view

    def output(self, shape, dtype):
        """A buffer of the call's allocation that the run returns (:meth:`build` says in which order)."""
        return self._buffer(shape, dtype, None)

    def workspace(self, shape, dtype, zeroed=False):
        """A buffer of the call's allocation, zeroed before the launches when ``zeroed``."""
        return self._buffer(shape, dtype, ZEROED if zeroed else None)

    def counters(self, count):
        """``count`` int32 counters that are zero before the launches and that the kernels leave zero (the
        last CTA to count sets its counter back): the graph zeroes them once, when it is made, where a
        zeroed workspace takes a memset node every launch. Zeroed in the call's allocation on the
        kernel-launch path, as a zeroed workspace is."""
        return self._buffer((count,), numpy.int32, KEPT_ZERO)

    def _buffer(self, shape, dtype, kind):
        slot = Slot(len(self._slots), shape, dtype)
        self._slots.append(slot)
        self._buffers.append((slot.index, self._nbytes, kind))
        self._nbytes = _aligned(self._nbytes + max(slot.nbytes, 1), _BUFFER_ALIGN)
        return slot

    def struct(self, dtype):
        """A zeroed argument struct (a size-1 array) for the caller to fill; its bytes are copied into the
        plan's argument buffer by :meth:`build`."""
        struct = numpy.zeros(1, dtype)
        self._structs.append(struct)
        return struct

    def int32_field(self, struct, path):
        """A per-run int32 argument: the field at ``path`` (names, outer first) of ``struct``. Returns its
        position among the plan's scalars."""
        dtype, offset = struct.dtype, 0
        for name in path:
            dtype, at = dtype.fields[name][:2]
            offset += at
        self._int32_fields.append((struct, offset))
        return len(self._int32_fields) - 1

    def tensor_map(self, struct, field, slot, encode):
        """The CUtensorMap in ``struct[field]`` (128 bytes) addresses the array of ``slot``; ``encode(ptr)``
        returns its bytes for an address."""
        self._maps.append((struct, field, slot.index, encode))

    def keep(self, *objects):
        """Keeps objects whose device memory the structs point at (block-sparse lists) alive."""
        self._keep.extend(objects)

    def launch(self, function, grid, threads, structs, smem=0):
        """A launch of the driver function ``function`` with the argument structs ``structs`` (in the
        kernel's parameter order)."""
        self._launches.append((function, tuple(int(g) for g in grid), int(threads), int(smem), tuple(structs)))

    def build(self, outputs):
        """The :class:`Plan`; a run returns the arrays of the output slots ``outputs``, in that order."""
        return Plan(self, outputs)


class Plan:
    """A call prepared for one layout (see the module docstring). ``plan(*inputs, scalars=())`` runs it
    on the current stream: ``inputs`` in the builder's order (None where the call has no such array),
    ``scalars`` the int32 arguments of :meth:`PlanBuilder.int32_field`, then those of dropout's seed and
    offset (:meth:`dropout_scalars`); returns the outputs.

    ``run`` is the same function without the method call (the public API's hot path calls it; it is
    replaced after the first run, and again when the plan makes its graph), ``source`` the Python it
    generated (None before the second run) and ``namespace`` the constants that names (for reading)."""

    __slots__ = ("_buffer", "_words", "_ints", "_inputs", "_buffers", "_zeroed", "_zeroed_nbytes", "_memset_nbytes",
                 "_launches", "_outputs", "_nbytes", "_scalars", "_dropout_fields", "_keep", "_graph", "run", "source",
                 "namespace", "__weakref__")

    def __init__(self, builder, outputs):
        # One argument buffer for every struct, each 64-byte aligned (the buffer too).
        offsets, size = [], 0
        for struct in builder._structs:
            offsets.append(size)
            size = _aligned(size + struct.nbytes, _STRUCT_ALIGN)
        raw = numpy.zeros(size + _STRUCT_ALIGN, numpy.uint8)
        start = (-raw.ctypes.data) % _STRUCT_ALIGN
        self._buffer = raw[start:start + size]
        self._words, self._ints = memoryview(self._buffer).cast("Q"), memoryview(self._buffer).cast("i")
        base = self._buffer.ctypes.data
        placed = {}
        for struct, offset in zip(builder._structs, offsets):
            self._buffer[offset:offset + struct.nbytes] = struct.view(numpy.uint8)
            placed[id(struct)] = offset
        # Where each slot's address goes: the buffer's words that hold its sentinel.
        words = {}
        sentinels = self._buffer.view(numpy.uint64) - numpy.uint64(_SENTINEL)
        for index in numpy.flatnonzero(sentinels < numpy.uint64(8 * len(builder._slots))):
            slot = int(sentinels[index]) // 8
            if int(sentinels[index]) % 8 == 0:
                words.setdefault(slot, []).append(int(index))
        maps = {}
        for struct, field, slot, encode in builder._maps:
            address = base + placed[id(struct)] + struct.dtype.fields[field][1]
            maps.setdefault(slot, []).append(_TensorMap(address, encode))
        # Per input: its words, its tensor maps, its convert, and the words of its views with their offsets.
        views = {}
        for view, parent, offset in builder._views:
            assert view not in maps, "views have no tensor maps"
            views.setdefault(parent, []).extend((w, offset) for w in words.get(view, ()))
        self._inputs = tuple((tuple(words.get(s, ())), tuple(maps.get(s, ())), convert, tuple(views.get(s, ())))
                             for s, convert in zip(builder._inputs, builder._converts))
        self._buffers = tuple((tuple(words.get(s, ())), tuple(maps.get(s, ())), offset)
                              for s, offset, kind in builder._buffers if kind is None)
        # Zeroed workspaces and counters: in the call's allocation when the kernels are launched, else in
        # the graph's own memory (_Graph) at these offsets, those its memset node zeroes first.
        zeroed, counters = [], 0
        for wanted in (ZEROED, KEPT_ZERO):
            for s, offset, kind in builder._buffers:
                if kind == wanted:
                    nbytes = builder._slots[s].nbytes
                    zeroed.append((tuple(words.get(s, ())), tuple(maps.get(s, ())), offset, counters, nbytes))
                    counters = _aligned(counters + max(nbytes, 1), _BUFFER_ALIGN)
            if wanted == ZEROED:
                self._memset_nbytes = counters
        self._zeroed, self._zeroed_nbytes = tuple(zeroed), counters
        offset_of = {s: offset for s, offset, _ in builder._buffers}
        self._outputs = tuple((slot.shape, slot.dtype, offset_of[slot.index]) for slot in outputs)
        self._nbytes = max(builder._nbytes, 1)
        self._scalars = tuple((placed[id(struct)] + offset) // 4 for struct, offset in builder._int32_fields)
        # Dropout's seed and offset, after the builder's scalars: the two int32 halves of each DROPOUT_SEED
        # word and the offset that follows it.
        seeds = numpy.flatnonzero(self._buffer.view(numpy.uint64) == numpy.uint64(DROPOUT_SEED))
        self._scalars += tuple(int(i) for w in seeds for i in (2 * w, 2 * w + 1, 2 * w + 2))
        self._dropout_fields = len(seeds)
        self._launches = tuple(_Launch(function, grid, threads, smem, [base + placed[id(s)] for s in structs])
                               for function, grid, threads, smem, structs in builder._launches)
        self._keep = tuple(builder._keep)
        # The graph is made by the second run, or the first after it outside a capture (making one may
        # allocate).
        self._graph = None
        self.source = self.namespace = None
        self.run = self._first_run

    def dropout_scalars(self, seed, offset):
        """The ``scalars`` of a run with dropout's ``seed`` (in [0, 2^64)) and ``offset`` (in [0, 2^32)),
        for a plan built with the seed :data:`DROPOUT_SEED` (and no int32 fields of its builder's)."""
        words = tuple(x - (x >> 31 << 32) for x in (seed & 0xFFFFFFFF, seed >> 32, offset))  # as int32
        return words * self._dropout_fields

    def __call__(self, *inputs, scalars=()):
        return self.run(*inputs, scalars=scalars)

    def _first_run(self, *inputs, scalars=()):
        """The first run, interpreted; the next one generates the plan's run."""
        self.run = self._second_run
        return self._interpret(inputs, scalars)

    def _second_run(self, *inputs, scalars=()):
        """Makes the graph (outside a capture) and the generated run, then runs it."""
        import cupy
        from cupy.cuda import runtime

        stream = cupy.cuda.get_current_stream().ptr
        if not runtime.streamIsCapturing(stream):
            self._graph = _Graph(self._launches, self._zeroed_nbytes, self._memset_nbytes, stream)
        self.run = self._compile()
        return self.run(*inputs, scalars=scalars)

    def _make_graph(self, *inputs, scalars=()):
        """Makes the plan's graph, then runs the plan with it (the first run outside a capture of a plan
        whose run was generated in one)."""
        import cupy

        self._graph = _Graph(self._launches, self._zeroed_nbytes, self._memset_nbytes,
                             cupy.cuda.get_current_stream().ptr)
        self.run = self._compile()
        return self.run(*inputs, scalars=scalars)

    def _interpret(self, inputs, scalars):
        """A run that launches the kernels one by one, its words and maps written by loops: the direct
        path of :meth:`_compile`'s code, without generating it."""
        import cupy
        from cupy.cuda import driver, runtime

        stream = cupy.cuda.get_current_stream().ptr
        words, converted = self._words, []
        for x, (at, maps, convert, shifted) in zip(inputs, self._inputs):
            if not at and not maps and not shifted:
                continue
            if convert is not None:
                x = convert(x)
                converted.append(x)  # kept until the launches
            _point(words, x.data.ptr, at, maps)
            for index, offset in shifted:
                words[index] = x.data.ptr + offset
        memory = cupy.cuda.alloc(self._nbytes)
        base = memory.ptr
        for at, maps, offset in self._buffers:
            _point(words, base + offset, at, maps)
        for index, value in zip(self._scalars, scalars):
            self._ints[index] = value
        for at, maps, offset, _, nbytes in self._zeroed:
            _point(words, base + offset, at, maps)
            runtime.memsetAsync(base + offset, 0, nbytes, stream)
        for step in self._launches:
            driver.launchKernel(step.function, *step.shape, stream, step.params_address, 0)
        return tuple(cupy.ndarray(shape, dtype, memory + offset) for shape, dtype, offset in self._outputs)

    def _compile(self):
        """The run as straight-line Python: every word, map, memset and launch of this plan spelled out, so a
        run pays for no loop, unpacking or attribute lookup (a few microseconds a call). Every constant
        it names is in the namespace it is compiled in. Without a graph yet, a run outside a capture
        makes it (:meth:`_make_graph`)."""
        import cupy
        from cupy.cuda import driver, runtime

        names = {"get_stream": cupy.cuda.get_current_stream, "alloc": cupy.cuda.alloc, "ndarray": cupy.ndarray,
                 "launch": driver.launchKernel, "memset": runtime.memsetAsync, "capturing": runtime.streamIsCapturing,
                 "graph_launch": runtime.graphLaunch, "W": self._words, "I": self._ints}

        def constant(value):
            name = f"c{len(names)}"
            names[name] = value
            return name

        def point(words, maps, indent=""):
            lines = [f"{indent}W[{w}] = p" for w in words]
            for tensor_map in maps:
                m = constant(tensor_map)
                lines.append(f"{indent}if p != {m}.current: {m}.point(p)")
            return lines

        params = [f"x{i}" for i in range(len(self._inputs))]
        body = ["stream = get_stream().ptr"]
        if self._graph is None:
            rerun = ", ".join(params + ["scalars=scalars"])
            body.append(f"if not capturing(stream): return {constant(self._make_graph)}({rerun})")
        for x, (words, maps, convert, shifted) in zip(params, self._inputs):
            if not words and not maps and not shifted:
                continue  # an input no kernel reads, or one the call does not have
            if convert is not None:
                body.append(f"{x} = {constant(convert)}({x})")  # kept in the local until the launches
            body.append(f"p = {x}.data.ptr")
            body += point(words, maps)
            body += [f"W[{w}] = p + {offset}" for w, offset in shifted]
        body += [f"memory = alloc({self._nbytes})", "base = memory.ptr"]
        for words, maps, offset in self._buffers:
            if words or maps:
                body.append(f"p = base + {offset}")
                body += point(words, maps)
        body += [f"I[{index}] = scalars[{i}]" for i, index in enumerate(self._scalars)]
        # Captured: the kernel launches themselves, the counters zeroed in the call's allocation.
        direct = []
        for words, maps, offset, _, nbytes in self._zeroed:
            direct += [f"p = base + {offset}", *point(words, maps), f"memset(p, 0, {nbytes}, stream)"]
        for step in self._launches:
            direct.append(f"launch({step.function}, {', '.join(map(str, step.shape))}, stream, {step.params_address}, 0)")
        if self._graph is None:
            body += direct
        else:
            body.append("if capturing(stream):")
            body += [f"    {line}" for line in direct]
            body.append("else:")
            counters = self._graph.counters.ptr if self._graph.counters is not None else 0
            for words, maps, _, offset, _ in self._zeroed:
                body += [f"    p = {counters + offset}", *point(words, maps, "    ")]
            set_params = constant(_graph_driver()["cuGraphExecKernelNodeSetParams"])
            calls = " or ".join(f"{set_params}({', '.join(constant(x) for x in node)})" for node in self._graph.nodes)
            body.append(f"    result = {calls}")
            body.append(f"    if result: {constant(_node_update_failed)}(result)")
            body.append(f"    graph_launch({self._graph.exec.value}, stream)")
        results = [f"ndarray({constant(shape)}, {constant(dtype)}, memory + {offset})"
                   for shape, dtype, offset in self._outputs]
        body.append(f"return ({', '.join(results)},)" if results else "return ()")
        source = f"def run({', '.join(params + ['scalars=()'])}):\n" + "\n".join(f"    {line}" for line in body)
        self.source, self.namespace = source, names
        namespace = dict(names)
        exec(compile(source, "<cupyflash plan>", "exec"), namespace)  # noqa: S102 (our own generated code)
        return namespace["run"]


def _point(words, ptr, at, maps):
    """Writes address ``ptr`` into the argument buffer's 8-byte ``words`` at indices ``at`` and the tensor
    maps ``maps`` (the interpreted run's form of the generated lines)."""
    for index in at:
        words[index] = ptr
    for tensor_map in maps:
        tensor_map.point(ptr)


def _node_update_failed(result):
    raise RuntimeError(f"cupyflash: cuGraphExecKernelNodeSetParams failed with CUresult {result}")


class PlanCache:
    """Plans by key, at most ``limit`` of them (the oldest goes first): a key names a layout, not values,
    so a training or decoding loop keeps reusing a few."""

    def __init__(self, limit=256):
        self.limit = limit
        self._plans = {}
        self._lock = threading.Lock()

    def get(self, key):
        """The plan of ``key``, or None (also for None and for a key holding an unhashable argument)."""
        try:
            return self._plans.get(key)
        except TypeError:
            return None

    def put(self, key, plan):
        try:
            hash(key)
        except TypeError:
            return
        with self._lock:
            if key not in self._plans and len(self._plans) >= self.limit:
                del self._plans[next(iter(self._plans))]
            self._plans[key] = plan

    def clear(self):
        with self._lock:
            self._plans.clear()

    def __len__(self):
        return len(self._plans)
