"""Launching sglang-fl's Triton kernels with less host time: `launch` (issue 30 item 2b).

Why: eager prefill makes ~100 routed calls per forward of a 24-layer model, and where the GPU
waits for the host (small batches, slow hosts) each call's host time is the prefill's time.
One launch of the RoPE kernel went through ``JITFunction.run`` in 24.3 us on the H100 host of
2026-12-05 and 13.3 us on the H200 host, and through the runner of the kernel Triton had
compiled in 11.0 and 6.1 us (benchmarks/launch_cost.py, same outputs).

How: per kernel, the `CompiledKernel` Triton compiled is kept for each specialisation, keyed by
exactly what Triton keys its own cache on:

- every runtime argument's ``native_specialize_impl`` result, with the flags of that parameter
  (``do_not_specialize`` and so on) and the device's backend, as ``JITFunction.run``'s binder
  makes it: a tensor's dtype and 16-byte alignment, an int's width and whether it is 1 or a
  multiple of 16;
- the constexprs and launch options, which callers pass as one mapping per geometry, cached
  (`meta`): it is keyed by identity and kept alive by the entry, so an id is never reused;
- the device, and the two knobs ``JITFunction.run`` folds into its options (``TRITON_DEBUG``,
  ``TRITON_INSTRUMENTATION_MODE``).

A miss launches through ``JITFunction.run``, which compiles or finds the kernel and returns it;
a hit calls its runner directly. Triton's interpreter (the CPU tests), launch hooks (a profiler
such as proton), a callable grid, a Triton without the pieces this uses, a kernel with pre-run
hooks or whose constexprs do not all follow its runtime parameters, or ``bound_launch: false`` (``SGLANG_FL_BOUND_LAUNCH=0``, which
the dispatch manager hands to `set_enabled` when it is built) take ``kernel[grid](...)`` as
before; the reason is logged once per kernel.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

#: Entries one kernel keeps before it starts afresh: a bound on memory where a caller makes a
#: new ``meta`` mapping per call (each is kept alive by its entry) instead of caching it.
_MAX_ENTRIES = 1024

_enabled = True

#: Triton versions whose JIT launch (``JITFunction.run`` calling ``CompiledKernel.run``) this
#: mirrors; elsewhere kernels launch through ``kernel[grid]``.
_TRITON_VERSIONS = (("3", "6"),)

#: Per kernel (the JITFunction), its `_Bound`, or None where calls go through ``kernel[grid]``.
_BOUND: dict = {}


def launch(kernel, grid, args, meta) -> None:
    """``kernel[grid](*args, **meta)``, with less host time where it can (module docstring).
    ``args`` are the kernel's runtime parameters, in order; ``meta`` its constexprs and launch
    options (num_warps...), one mapping reused for every call of the same geometry."""
    try:
        bound = _BOUND[kernel]
    except KeyError:
        bound = _BOUND[kernel] = _bind(kernel, meta)
    if bound is None:
        kernel[grid](*args, **meta)
    else:
        bound(grid, args, meta)


def set_enabled(enabled: bool) -> None:
    """Whether kernels launch bound (the ``bound_launch`` setting; on by default). Kernels
    already launched are decided again at their next call."""
    global _enabled
    if enabled != _enabled:
        _enabled = bool(enabled)
        _BOUND.clear()


def reset() -> None:
    """Forget every kernel's compiled runners (tests; after a Triton cache change)."""
    _BOUND.clear()


def _bind(kernel, meta):
    """The kernel's `_Bound`, or None with the reason logged."""
    name = getattr(kernel, "__name__", type(kernel).__name__)
    if not _enabled:
        logger.info("bound launch of %s: off (bound_launch: false)", name)
        return None
    try:
        return _Bound(kernel, meta)
    except _Unbindable as why:
        logger.info("bound launch of %s: not used, %s; launching through kernel[grid]", name, why)
        return None


def _hooked(hook) -> bool:
    """Whether a launch hook is set: Triton 3.6 keeps an empty chain (``calls``) when none is,
    earlier ones None; anything else is some profiler's callable."""
    return hook is not None and bool(getattr(hook, "calls", True))


class _Unbindable(Exception):
    pass


class _Bound:
    """One JIT kernel's compiled runners, by specialisation (module docstring)."""

    def __init__(self, kernel, meta) -> None:
        try:
            import triton
            from triton import knobs
            from triton._C.libtriton import native_specialize_impl
            from triton.runtime.jit import JITFunction
        except ImportError as exc:
            raise _Unbindable(f"this Triton lacks {exc.name or exc}") from None
        version = tuple(triton.__version__.split(".")[:2])
        if version not in _TRITON_VERSIONS:
            raise _Unbindable(f"Triton {triton.__version__}: its launch path is known here only "
                              f"for {', '.join('.'.join(v) for v in _TRITON_VERSIONS)}")
        if not isinstance(kernel, JITFunction) or type(kernel).run is not JITFunction.run:
            raise _Unbindable(f"{type(kernel).__name__} is not a compiled JIT kernel "
                              "(Triton's interpreter?)")
        params = list(kernel.params)
        runtime = [p for p in params if not p.is_constexpr]
        if any(p.is_constexpr for p in params[:len(runtime)]):
            raise _Unbindable("its constexprs do not all follow its runtime parameters")
        if any(getattr(p, "annotation_type", None) for p in runtime):
            raise _Unbindable("it has annotated parameters")
        if getattr(kernel, "pre_run_hooks", None):
            raise _Unbindable("it has pre-run hooks, which only JITFunction.run calls")
        self._constexprs = tuple(p.name for p in params[len(runtime):])
        missing = [n for n in self._constexprs if n not in meta]
        if missing:
            raise _Unbindable(f"its callers do not pass constexpr(s) {', '.join(missing)}")
        self._flags = tuple((p.is_const, not p.do_not_specialize,
                             not p.do_not_specialize_on_alignment) for p in runtime)
        self._kernel = kernel
        self._spec = native_specialize_impl
        self._runtime = knobs.runtime
        self._compilation = knobs.compilation
        self._device = self._stream = None  # Triton's driver's, at the first launch
        self._backends: dict = {}  # device -> the backend Triton specialises with there
        self._entries: dict = {}

    def key(self, args, meta, device, backend):
        """What Triton's cache keys a launch of ``args`` on (module docstring), specialised as
        ``backend`` (the device's, which may specialise tensors its own way) does."""
        if len(args) != len(self._flags):
            raise TypeError(f"{self._kernel.__name__} takes {len(self._flags)} runtime "
                            f"arguments, got {len(args)}")
        spec = self._spec
        # The two knobs JITFunction.run folds into the options it keys on (TRITON_DEBUG,
        # TRITON_INSTRUMENTATION_MODE): a change after the first launch is a miss.
        return (id(meta), device, self._runtime.debug, self._compilation.instrumentation_mode,
                *[spec(backend, a, c, s, al) for a, (c, s, al) in zip(args, self._flags, strict=True)])

    def __call__(self, grid, args, meta) -> None:
        runtime = self._runtime
        if (_hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)
                or callable(grid)):  # a profiler wants its launch metadata; a grid of the args
            self._kernel[grid](*args, **meta)
            return
        if self._device is None:
            from triton.runtime.driver import driver

            self._device = driver.active.get_current_device
            self._stream = driver.active.get_current_stream
        device = self._device()
        backend = self._backends.get(device)
        if backend is None:  # what JITFunction.run specialises with on this device
            backend = self._backends[device] = self._kernel.device_caches[device][3]
        key = self.key(args, meta, device, backend)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= _MAX_ENTRIES:  # callers making a new meta per call
                self._entries.clear()
            compiled = self._kernel.run(*args, grid=grid, warmup=False, **meta)
            if compiled is None:  # a jit_cache_hook took the launch over: keep nothing
                return
            if hasattr(compiled, "result"):  # an asynchronous compile
                compiled = compiled.result()
            consts = tuple(meta[n] for n in self._constexprs)
            self._entries[key] = (compiled.run, compiled.function, compiled.packed_metadata,
                                  consts, meta)
            return
        run, function, packed, consts, _ = entry
        n = len(grid)
        run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, self._stream(device),
            function, packed, None, None, None, *args, *consts)
