"""`sglang_fl.kernels.launch`: the bound launch of sglang-fl's Triton kernels (issue 30 item 2b).

On this CPU a real ``@triton.jit`` kernel is made (a JITFunction: nothing compiles until it is
launched), and its ``run`` (Triton's JIT launch, which compiles and returns the compiled
kernel) is replaced by a recorder returning a stand-in compiled kernel whose runner records
what it is given. What is checked:

- a launch's key is Triton's own specialisation: two calls share a key exactly when the binder
  Triton builds for the kernel specialises them alike (dtype, 16-byte alignment, int width, an
  int of 1 or a multiple of 16, ``do_not_specialize``);
- a miss goes through Triton's JIT launch, a hit through the runner, with the grid padded to
  three, the current stream, no launch hooks, and every argument in signature order;
- launch hooks, a disabled setting, Triton's interpreter and kernels whose constexprs do not
  follow their runtime parameters take ``kernel[grid]``.

The GPU suite (tests/gpu/test_bound_launch.py) checks the real runner's writes against
``kernel[grid]``'s.
"""

from __future__ import annotations

import itertools
import types

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from sglang_fl.kernels import launch as launch_mod  # noqa: E402


@triton.jit(do_not_specialize=["count"])
def _kernel(x_ptr, y_ptr, n, stride, count, eps, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    pass


@triton.jit
def _constexpr_first(FLAG: tl.constexpr, x_ptr, n):
    pass


class _Compiled:
    """A stand-in of Triton's CompiledKernel: its runner records each launch."""

    def __init__(self):
        self.launches = []
        self.function = object()
        self.packed_metadata = ("packed",)

    @property
    def run(self):
        return lambda *a: self.launches.append(a)


@pytest.fixture
def recorded(monkeypatch):
    """``_kernel`` with its JIT launch recorded: returns (jit_calls, compiled)."""
    compiled, jit_calls = _Compiled(), []

    def run(*args, grid, warmup, **meta):
        jit_calls.append((grid, args, dict(meta)))
        return compiled

    monkeypatch.setattr(_kernel, "run", run, raising=False)
    launch_mod.reset()
    launch_mod.set_enabled(True)
    bound = launch_mod._bind(_kernel, META)
    assert bound is not None
    bound._device = lambda: 0
    bound._stream = lambda device: 1234
    bound._backends[0] = _backend()
    launch_mod._BOUND[_kernel] = bound
    yield jit_calls, compiled
    launch_mod.reset()


META = types.MappingProxyType(dict(FLAG=True, BLOCK=64, num_warps=4))


def _backend():
    """The backend the keys specialise with here (a GPU's comes from the kernel's device cache,
    which needs a driver)."""
    from triton.backends.compiler import BaseBackend

    return BaseBackend


def _args(x, y, n=17, stride=64, count=5, eps=1e-6):
    return (x, y, n, stride, count, eps)


def test_a_miss_launches_through_triton_and_a_hit_through_the_runner(recorded):
    jit_calls, compiled = recorded
    x, y = torch.zeros(64), torch.zeros(64)
    launch_mod.launch(_kernel, (3,), _args(x, y), META)
    assert len(jit_calls) == 1 and jit_calls[0][0] == (3,) and not compiled.launches
    launch_mod.launch(_kernel, (5, 2), _args(x, y, n=33), META)  # 17 and 33: both plain i32
    assert len(jit_calls) == 1, "a call of the same specialisation went through the JIT again"
    (got,) = compiled.launches
    assert got[:9] == (5, 2, 1, 1234, compiled.function, ("packed",), None, None, None)
    assert got[9:] == (x, y, 33, 64, 5, 1e-6, True, 64), "arguments not in signature order"


@pytest.mark.parametrize("change", [
    dict(n=1), dict(n=32), dict(stride=2**31), dict(dtype=torch.float16), dict(offset=1),
])
def test_a_change_triton_specialises_on_is_a_miss(recorded, change):
    jit_calls, compiled = recorded
    base = torch.zeros(80)
    launch_mod.launch(_kernel, (1,), _args(base[:64], base[:64]), META)
    x = base[change.get("offset", 0):][:64].to(change.get("dtype", torch.float32))
    args = _args(x, base[:64], n=change.get("n", 17), stride=change.get("stride", 64))
    launch_mod.launch(_kernel, (1,), args, META)
    assert len(jit_calls) == 2 and not compiled.launches


def test_a_debug_knob_set_after_the_first_launch_is_a_miss(recorded, monkeypatch):
    """JITFunction.run folds TRITON_DEBUG and the instrumentation mode into its key."""
    from triton import knobs

    jit_calls, compiled = recorded
    x = torch.zeros(64)
    launch_mod.launch(_kernel, (1,), _args(x, x), META)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    launch_mod.launch(_kernel, (1,), _args(x, x), META)
    monkeypatch.setattr(knobs.compilation, "instrumentation_mode", "consan")
    launch_mod.launch(_kernel, (1,), _args(x, x), META)
    assert len(jit_calls) == 3 and not compiled.launches


def test_a_callable_grid_or_a_launch_triton_did_not_make_keeps_nothing(recorded, monkeypatch):
    jit_calls, compiled = recorded
    x = torch.zeros(64)
    for _ in range(2):
        launch_mod.launch(_kernel, lambda meta: (2,), _args(x, x), META)
    assert len(jit_calls) == 2 and not compiled.launches
    monkeypatch.setattr(_kernel, "run", lambda *a, **k: jit_calls.append(a) or None)
    launch_mod.launch(_kernel, (1,), _args(x, x), META)  # a jit_cache_hook took it over
    assert not launch_mod._BOUND[_kernel]._entries


def test_another_meta_mapping_is_a_miss(recorded):
    jit_calls, _ = recorded
    x = torch.zeros(64)
    launch_mod.launch(_kernel, (1,), _args(x, x), META)
    launch_mod.launch(_kernel, (1,), _args(x, x), types.MappingProxyType(dict(META, BLOCK=128)))
    assert len(jit_calls) == 2 and jit_calls[1][2]["BLOCK"] == 128


def test_a_do_not_specialize_int_is_no_miss(recorded):
    jit_calls, compiled = recorded
    x = torch.zeros(64)
    for count in (1, 16, 17):
        launch_mod.launch(_kernel, (1,), _args(x, x, count=count), META)
    assert len(jit_calls) == 1 and len(compiled.launches) == 2


def test_the_key_is_tritons_own_specialisation():
    """Over tensors of two dtypes and alignments and ints around 1, 16 and 2**31: two argument
    tuples share a key exactly when the binder Triton makes for the kernel specialises them
    alike."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(_kernel.signature, _kernel.params, BaseBackend)
    bound = launch_mod._Bound(_kernel, META)
    base = torch.zeros(128)
    tensors = [base[:64], base[1:65], base[4:68], base[:64].half()]
    ints = [1, 2, 16, 17, 32, 2**31, -16]
    cases = [(x, y, n, s, c, 1e-6) for x, y in itertools.product(tensors[:3], tensors[::3])
             for n, s, c in itertools.product(ints, (16, 17), (1, 17))]
    ours = [bound.key(a, META, 0, BaseBackend) for a in cases]
    triton_spec = [tuple(map(tuple, binder(*a, **META)[1])) for a in cases]
    for i, j in itertools.combinations(range(len(cases)), 2):
        assert (ours[i] == ours[j]) == (triton_spec[i] == triton_spec[j]), (cases[i], cases[j])


def test_launch_hooks_take_tritons_launch(recorded):
    """A profiler's hooks get their launch metadata: no runner call while one is set."""
    from triton import knobs

    jit_calls, compiled = recorded
    x = torch.zeros(64)
    launch_mod.launch(_kernel, (1,), _args(x, x), META)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
        launch_mod.launch(_kernel, (1,), _args(x, x), META)
    with pytest.MonkeyPatch.context() as mp:
        chain = type(knobs.runtime.launch_exit_hook)()  # Triton 3.6: a chain, empty if unused
        chain.add(lambda *a: None)
        mp.setattr(knobs.runtime, "launch_exit_hook", chain)
        launch_mod.launch(_kernel, (1,), _args(x, x), META)
    assert len(jit_calls) == 3 and not compiled.launches
    launch_mod.launch(_kernel, (1,), _args(x, x), META)  # hooks gone: the runner again
    assert len(compiled.launches) == 1


def test_off_and_unbindable_kernels_take_kernel_grid(monkeypatch, caplog):
    calls = []

    class Interpreted:  # what Triton's interpreter makes of a kernel: no JITFunction
        __name__ = "interpreted"

        def __getitem__(self, grid):
            return lambda *a, **m: calls.append((grid, a, m))

    launch_mod.reset()
    with caplog.at_level("INFO", logger="sglang_fl.kernels.launch"):
        launch_mod.launch(Interpreted(), (2,), (1, 2), {"B": 4})
        assert launch_mod._bind(_constexpr_first, {"FLAG": True}) is None
        launch_mod.set_enabled(False)
        try:
            assert launch_mod._bind(_kernel, META) is None
        finally:
            launch_mod.set_enabled(True)
    assert calls == [((2,), (1, 2), {"B": 4})]
    text = caplog.text
    assert "not a compiled JIT kernel" in text and "constexprs do not all follow" in text
    assert "off (bound_launch: false)" in text
    assert launch_mod._bind(_kernel, {"FLAG": True}) is None  # BLOCK missing from the meta
    monkeypatch.setattr(_kernel, "pre_run_hooks", [lambda *a, **k: None], raising=False)
    with caplog.at_level("INFO", logger="sglang_fl.kernels.launch"):
        assert launch_mod._bind(_kernel, META) is None
    assert "pre-run hooks" in caplog.text
    monkeypatch.undo()
    monkeypatch.setattr(triton, "__version__", "3.2.0")
    with caplog.at_level("INFO", logger="sglang_fl.kernels.launch"):
        assert launch_mod._bind(_kernel, META) is None
    assert "Triton 3.2.0: its launch path is known here only for 3.6" in caplog.text
    launch_mod.reset()


def test_the_setting_reaches_the_launcher(monkeypatch):
    """``SGLANG_FL_BOUND_LAUNCH=0`` turns it off when the dispatch manager is built."""
    from sglang_fl.config import reset_settings
    from sglang_fl.dispatch import get_manager, reset_manager

    monkeypatch.setenv("SGLANG_FL_BOUND_LAUNCH", "0")
    monkeypatch.setenv("SGLANG_FL_PLATFORM", "cpu")
    reset_settings()
    reset_manager()
    try:
        get_manager()
        assert launch_mod._enabled is False
    finally:
        monkeypatch.delenv("SGLANG_FL_BOUND_LAUNCH")
        reset_settings()
        reset_manager()
        launch_mod.set_enabled(True)


def test_keys_use_the_backend_triton_specialises_with_on_the_device(recorded, monkeypatch):
    """A backend may specialise tensors its own way (Triton's AMD backend does): the key takes
    the one in the kernel's cache for the device, as JITFunction.run's binder does."""
    from triton.backends.compiler import BaseBackend

    class NoAlignment(BaseBackend):
        supports_native_tensor_specialization = False

        @staticmethod
        def get_tensor_specialization(arg, **kwargs):
            return ""

    jit_calls, compiled = recorded
    bound = launch_mod._BOUND[_kernel]
    bound._backends.clear()
    monkeypatch.setattr(_kernel, "device_caches", {0: (None, None, None, NoAlignment, None)})
    base = torch.zeros(80)
    launch_mod.launch(_kernel, (1,), _args(base[:64], base[:64]), META)
    launch_mod.launch(_kernel, (1,), _args(base[1:65], base[:64]), META)  # misaligned: same key
    assert bound._backends == {0: NoAlignment}
    assert len(jit_calls) == 1 and len(compiled.launches) == 1
