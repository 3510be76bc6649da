"""Empty mode: stand-ins raise the documented error, the finder serves absent packages only,
native swaps rebind SGLang's own twins, and the ledger covers every patch."""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

from sglang_fl import compat
from sglang_fl.compat import module_hooks, standins, swaps
from sglang_fl.compat.standins import Standin, StandinCalledError, StandinFinder, StandinModule


def test_standin_call_raises_named_error_and_is_counted(capsys):
    fn = Standin("sgl_kernel.rmsnorm")
    before = standins.standin_calls().get("sgl_kernel.rmsnorm", 0)
    with pytest.raises(StandinCalledError) as err:
        fn(1, 2, eps=1e-6)
    msg = str(err.value)
    assert "sgl_kernel.rmsnorm was called" in msg
    assert "sgl_kernel is not installed" in msg
    assert "op rms_norm" in msg and "SGLANG_FL_OOT_BLACKLIST" in msg  # what routes around it
    assert standins.standin_calls()["sgl_kernel.rmsnorm"] == before + 1
    assert f"{standins.CALL_LOG_PREFIX} sgl_kernel.rmsnorm" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("qualname", "hint"),
    [
        ("flashinfer.sampling.top_k_top_p_sampling_from_probs", "--sampling-backend pytorch"),
        ("sgl_kernel.kvcacheio.transfer_kv_per_layer", "--enable-hierarchical-cache"),
        ("sgl_kernel.silu_and_mul", "op silu_and_mul"),
        ("tvm_ffi.cpp.load_inline", "apache-tvm-ffi"),
        ("torchvision.io.decode_jpeg", "torchvision build"),
        ("sgl_kernel.some_new_kernel", "no sglang-fl op covers it"),
    ],
)
def test_every_package_has_a_route_hint(qualname, hint):
    assert hint in standins.route_hint(qualname)


def test_nested_attributes_and_subclassing_defer_the_error_to_use():
    sampling = Standin("flashinfer.sampling")
    nested = sampling.top_p_renorm_prob
    assert repr(nested) == "<sglang-fl stand-in flashinfer.sampling.top_p_renorm_prob>"
    with pytest.raises(AttributeError):
        _ = sampling.__wrapped__  # dunders stay absent, so inspect/functools behave

    class Wrapper(Standin("flashinfer.BatchPrefillWithPagedKVCacheWrapper")):
        pass

    with pytest.raises(StandinCalledError, match="BatchPrefillWithPagedKVCacheWrapper was called"):
        Wrapper()


def test_finder_serves_any_submodule_of_an_absent_package():
    name = "sglang_fl_test_absent_pkg"
    finder = StandinFinder({name: None})
    sys.meta_path.append(finder)
    try:
        import importlib

        sub = importlib.import_module(f"{name}.kvcacheio")
        from sglang_fl_test_absent_pkg import some_kernel  # noqa: F401 -- import succeeds

        assert getattr(sub, compat.STANDIN_MARKER) is True
        with pytest.raises(StandinCalledError, match=rf"{name}\.kvcacheio\.transfer was called"):
            sub.transfer()
        with pytest.raises(AttributeError):
            _ = sub.__version__
    finally:
        sys.meta_path.remove(finder)
        for mod in [m for m in sys.modules if m.startswith(name)]:
            del sys.modules[mod]


def test_dispatch_backends_do_not_mistake_a_standin_for_the_real_package():
    from sglang_fl.dispatch.backends import STANDIN_MARKER, real_module_available

    assert STANDIN_MARKER == compat.STANDIN_MARKER
    name = "sglang_fl_test_absent_vendor"
    sys.modules[name] = StandinModule(name)
    try:
        ok, why = real_module_available(name)
        assert not ok and why
    finally:
        del sys.modules[name]


def test_namespace_only_module_has_no_functions():
    top = StandinModule("sglang_fl_test_ns", namespace_only=True)
    with pytest.raises(AttributeError):
        _ = top.decode_jpeg


def test_native_swap_rebinds_sglang_twin():
    fbi = pytest.importorskip("sglang.srt.model_executor.forward_batch_info")
    if not any(s.native == "_clamp_position_native" for s in swaps.native_swaps()):
        pytest.skip("this SGLang version has no native twin of clamp_position to swap in")
    saved = fbi.clamp_position
    try:
        fbi.clamp_position = Standin("tvm_ffi.clamp_position_cuda")
        swaps.apply_swaps(fbi)
        assert fbi.clamp_position is fbi._clamp_position_native
    finally:
        fbi.clamp_position = saved


def test_native_swap_names_must_exist_in_sglang():
    import importlib

    pytest.importorskip("sglang")
    import inspect

    for swap in swaps.native_swaps():
        module = importlib.import_module(swap.module)
        if swap.cuda_only and not hasattr(module, swap.attr):  # bound on CUDA hosts only
            assert f"import {swap.attr}" in inspect.getsource(module), swap
            continue
        assert callable(getattr(module, swap.attr)), swap
        assert callable(swap.replacement) if not swap.native else callable(getattr(module, swap.native)), swap


def test_kv_store_swap_takes_sglangs_native_path_without_the_standin():
    """memory_pool's JIT KV-store kernel needs tvm_ffi; swapped, SGLang writes the cache with its
    own index_put branch, and the stand-in is never called."""
    mp = pytest.importorskip("sglang.srt.mem_cache.memory_pool")
    torch = pytest.importorskip("torch")
    saved, saved_cuda = mp.can_use_store_cache, mp._is_cuda
    try:
        mp.can_use_store_cache = Standin("tvm_ffi.cpp.load_inline")
        swaps.apply_swaps(mp)
        mp._is_cuda = True  # the branch a CUDA host takes
        k, v = torch.randn(3, 8), torch.randn(3, 8)
        k_cache, v_cache = torch.zeros(10, 8), torch.zeros(10, 8)
        idx = torch.tensor([7, 2, 5])
        extra = {"size_limit": 10} if "size_limit" in inspect.signature(mp._set_kv_buffer_impl).parameters else {}
        mp._set_kv_buffer_impl(k, v, k_cache, v_cache, idx, 8, torch.float32, torch.cpu, **extra)
        assert torch.equal(k_cache[idx], k) and torch.equal(v_cache[idx], v)
    finally:
        mp.can_use_store_cache, mp._is_cuda = saved, saved_cuda


def test_module_hooks_run_around_module_execution(tmp_path, monkeypatch):
    (tmp_path / "sglang_fl_hooked_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    module_hooks.add_hook("sglang_fl_hooked_mod", before=seen.append,
                          after=lambda m: seen.append(m.VALUE))
    try:
        import sglang_fl_hooked_mod  # noqa: F401

        assert seen == ["sglang_fl_hooked_mod", 1]
    finally:
        module_hooks._before.pop("sglang_fl_hooked_mod")
        module_hooks._after.pop("sglang_fl_hooked_mod")
        sys.modules.pop("sglang_fl_hooked_mod", None)


def test_a_module_that_fails_to_import_keeps_its_own_error(tmp_path, monkeypatch):
    """An after-hook that checks the module's contents (the SGLang fixes raise when what they
    wrap is gone) must not replace the module's own import error (seen on the H200: xgrammar's
    failure hidden behind 'fix grammar_mask_device: ... no longer exists')."""
    (tmp_path / "sglang_fl_failing_mod.py").write_text("raise ImportError('the real reason')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module_hooks.add_hook("sglang_fl_failing_mod", after=lambda m: pytest.fail("hook ran"))
    try:
        with pytest.raises(ImportError, match="the real reason"):
            import sglang_fl_failing_mod  # noqa: F401
    finally:
        module_hooks._after.pop("sglang_fl_failing_mod")
        sys.modules.pop("sglang_fl_failing_mod", None)


def test_ledger_lists_every_patch_with_why_how_upstream_and_removal():
    names = {p.name for p in compat.LEDGER}
    for pkg in compat.STANDIN_PACKAGES:
        assert f"standin:{pkg}" in names
    for swap in swaps.native_swaps():
        assert f"swap:{swap.attr}" in names
    for patch in compat.LEDGER:
        assert all(patch), patch
    for name in names:  # and the module docstring (the human-readable ledger) names each one
        assert name.split(":")[-1] in compat.__doc__


def test_bootstrap_respects_sglang_plugins(monkeypatch):
    from sglang_fl.compat import bootstrap

    for value, enabled in [("", True), ("sglang_fl", True), ("other, sglang_fl", True),
                           ("__none__", False), ("other", False)]:
        monkeypatch.setenv("SGLANG_PLUGINS", value)
        assert bootstrap.plugin_enabled() is enabled, value


_PROBE = textwrap.dedent(
    """
    import json, os, sys
    watcher = any(type(f).__name__ == "_SGLangImportWatcher" for f in sys.meta_path)
    import sglang
    import sglang.srt.utils.common  # imports torchvision.io at module level
    out = {"watcher": watcher}
    for name in ("sgl_kernel", "flashinfer", "tvm_ffi", "torchvision"):
        try:
            mod = __import__(name)
            out[name] = bool(getattr(mod, "__sglang_fl_standin__", False))
        except ImportError:
            out[name] = "absent"
    import torch
    out["moe_fused_gate"] = hasattr(torch.ops.sgl_kernel, "moe_fused_gate")
    out["env"] = {k: os.environ.get(k) for k in (
        "SGLANG_IS_FLASHINFER_AVAILABLE", "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK",
        "SGLANG_USE_CPU_ENGINE")}
    print("PROBE" + json.dumps(out))
    """
)


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def _probe(env_overrides):
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "USE_FLAGGEMS"))}
    env.update(SGLANG_FL_PLATFORM="cpu", **env_overrides)
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE"))
    return json.loads(line[5:])


@pytest.mark.integration
def test_pth_hook_activates_in_a_fresh_interpreter_and_keeps_user_values():
    pytest.importorskip("sglang")
    got = _probe({"SGLANG_IS_FLASHINFER_AVAILABLE": "true"})
    assert got["watcher"] is True, "sglang_fl_compat.pth did not run: reinstall with pip install -e ."
    assert got["sgl_kernel"] is True and got["flashinfer"] is True
    # SGLang 0.5.23's stack installs apache-tvm-ffi (xgrammar imports it): no stand-in then.
    assert got["tvm_ffi"] is not _installed("apache-tvm-ffi")
    assert got["torchvision"] is True
    assert got["moe_fused_gate"] is True
    assert got["env"] == {"SGLANG_IS_FLASHINFER_AVAILABLE": "true",  # the user's value wins
                          "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
                          "SGLANG_USE_CPU_ENGINE": "1"}


@pytest.mark.integration
@pytest.mark.parametrize("first", ["from transformers import AutoTokenizer",
                                   "from transformers import AutoProcessor"])
def test_a_program_that_imports_transformers_before_sglang_still_loads_its_configs(first):
    """transformers, imported before the torchvision stand-in, cached "no torchvision" and
    marked its image processors as missing it; SGLang's configs then failed at import
    (ImportError, or a placeholder's None ``register``). The stand-in makes it forget both."""
    pytest.importorskip("sglang")
    import os
    import subprocess

    code = (f"{first}\nimport sglang.srt.server_args\nfrom transformers import AutoImageProcessor\n"
            "assert callable(AutoImageProcessor.register)\nprint('LOADED')")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "USE_FLAGGEMS"))}
    proc = subprocess.run([sys.executable, "-c", code], env=dict(env, SGLANG_FL_PLATFORM="cpu"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "LOADED" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.integration
def test_sglang_plugins_none_leaves_python_untouched():
    pytest.importorskip("sglang")
    import os
    import subprocess

    env = dict(os.environ, SGLANG_PLUGINS="__none__")
    code = ("import sys; assert not any(type(f).__name__ == '_SGLangImportWatcher' "
            "for f in sys.meta_path)\ntry:\n import sgl_kernel\nexcept ImportError:\n print('ABSENT')")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ABSENT" in proc.stdout


def _spawned_child(queue):
    import sglang  # noqa: F401 -- the first SGLang import activates compat in this process

    mod = sys.modules.get("sgl_kernel") or __import__("sgl_kernel")
    queue.put(bool(getattr(mod, "__sglang_fl_standin__", False)))


@pytest.mark.integration
def test_standins_are_active_in_spawned_processes():
    """SGLang spawns its scheduler/detokenizer/TP workers; the .pth must reach them."""
    pytest.importorskip("sglang")
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_spawned_child, args=(queue,))
    proc.start()
    try:
        assert queue.get(timeout=240) is True
    finally:
        proc.join(60)
    assert proc.exitcode == 0


def test_real_sgl_kernel_is_kept_off_the_flashinfer_standin(tmp_path):
    """Ledger entry 7. A stand-in for an installed sgl_kernel (a double: the real one needs
    CUDA) decides at import, like the real one, whether ``flashinfer.norm`` imports."""
    pkg = tmp_path / "sgl_kernel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from sgl_kernel import elementwise, sampling\n")
    probe = (
        "try:\n    import flashinfer.norm  # noqa\n    _has_flashinfer = True\n"
        "except ImportError:\n    _has_flashinfer = False\n"
    )
    (pkg / "elementwise.py").write_text(probe)
    (pkg / "sampling.py").write_text(probe)
    code = (
        "import sglang_fl.compat as c; c.activate()\n"
        "import sgl_kernel, flashinfer.norm\n"
        "assert 'sgl_kernel' not in c.state.standins and 'flashinfer' in c.state.standins\n"
        "print(sgl_kernel.elementwise._has_flashinfer, sgl_kernel.sampling._has_flashinfer)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False"]


def _tokenizer_manager_shell():
    """A real TokenizerManager without its __init__ (no model, no ZMQ): just the attributes its
    real ``_init_req_state`` reads."""
    tm = pytest.importorskip("sglang.srt.managers.tokenizer_manager")
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.server_args import ServerArgs

    manager = object.__new__(tm.TokenizerManager)
    manager.server_args = ServerArgs(model_path="dummy")
    manager.disaggregation_mode = DisaggregationMode.NULL
    manager.rid_to_state = {}
    manager.enable_trace = False  # read by SGLang 0.5.23's _init_req_state
    return manager


def _request(**fields):
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(text="hello", **fields)
    obj.normalize_batch_and_arguments()
    return obj


def test_request_state_fix_drops_only_this_requests_undispatched_states():
    from sglang_fl.compat.fixes import _drop_undispatched_states

    manager = _tokenizer_manager_shell()
    parallel = _request(sampling_params={"n": 2})  # expanded to 2 rids, as SGLang does
    manager._init_req_state(parallel)
    sent = _request()
    manager._init_req_state(sent)
    manager.rid_to_state[sent.rid].time_stats.set_api_server_dispatch_time()  # _send_one_request
    tokenizing = _request(rid="same-rid")
    manager._init_req_state(tokenizing)
    duplicate = _request(rid="same-rid")
    with pytest.raises(ValueError, match="Duplicate request ID"):
        manager._init_req_state(duplicate)

    for obj in (parallel, sent, duplicate):
        _drop_undispatched_states(manager.rid_to_state, obj)
    # The n=2 states are gone; the dispatched one waits for the scheduler; the duplicate's rid
    # belongs to another request that is still being tokenized.
    assert set(manager.rid_to_state) == {sent.rid, "same-rid"}
    assert manager.rid_to_state["same-rid"].obj is tokenizing


def test_request_state_fix_fails_loudly_when_its_target_is_gone():
    import types

    from sglang_fl.compat import fixes

    pytest.importorskip("sglang")
    with pytest.raises(RuntimeError, match=r"TokenizerManager\.generate_request.*compat/fixes\.py"):
        fixes.fix_request_state_leak(types.ModuleType(fixes.tokenizer_manager_module()))


def test_request_state_fix_wraps_sglangs_generate_request_once():
    tm = pytest.importorskip("sglang.srt.managers.tokenizer_manager")
    import inspect

    from sglang_fl.compat import fixes

    fixes.fix_request_state_leak(tm)  # already applied at import: a no-op
    wrapped = tm.TokenizerManager.generate_request
    assert getattr(wrapped, fixes.FIXED_MARK) is True
    assert inspect.isasyncgenfunction(wrapped)
    assert not getattr(wrapped.__wrapped__, fixes.FIXED_MARK, False)  # SGLang's own, once


def test_fixes_are_installed_on_a_full_install_too():
    """The fix: entries do not depend on empty mode: with every package present (simulated),
    activate() stands nothing in but still hooks the fixes."""
    code = (
        "import sglang_fl.compat as c\n"
        "c._absent = lambda name: False\n"
        "c._broken = lambda name: False\n"
        "c.activate()\n"
        "from sglang_fl.compat import fixes, module_hooks\n"
        "assert c.state.standins == (), c.state.standins\n"
        "assert fixes.fix_request_state_leak in module_hooks._after[fixes.tokenizer_manager_module()]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_swaps_are_armed_only_where_the_package_they_stand_for_is_absent(monkeypatch):
    """A host with tvm_ffi keeps SGLang's JIT kernels; one without cutlass (0.5.23's dual GEMM)
    gets only the swaps that need cutlass."""
    pytest.importorskip("sglang")
    from sglang_fl.compat import module_hooks

    monkeypatch.setattr(module_hooks, "add_hook", lambda *a, **k: None)
    monkeypatch.setattr(swaps, "armed", [])
    from sglang_fl.sglang_glue.adapters import get_adapter

    monkeypatch.setattr(swaps, "_cpu", False)
    native = get_adapter().NATIVE_SWAPS
    for absent in {s.needs for s in native}:
        swaps.install(lambda name, absent=absent: name == absent)
        assert swaps.armed and {s.needs for s in swaps.armed} == {absent}
    swaps.install(lambda name: False)
    assert swaps.armed == []


def test_dual_gemm_swap_keeps_sglang_off_its_cutlass_kernel():
    """SGLang 0.5.23: with the swap, DualGemm's mode check answers 'not CUDA' and never imports
    the CuTe-DSL kernel (which needs nvidia-cutlass-dsl)."""
    swap = next((s for s in swaps.native_swaps() if s.needs == "cutlass"), None)
    if swap is None:
        pytest.skip("this SGLang version builds no DualGemm")
    import importlib

    dg = importlib.import_module(swap.module)
    saved = dg.is_cuda
    try:
        dg.is_cuda = lambda: True  # what a CUDA host answers
        swaps.apply_swaps(dg, [swap])
        assert dg.is_cuda() is False
        gemm = object.__new__(dg.DualGemm)
        assert gemm._select_mode(gate_up_proj=None, hidden_size=64) is None
    finally:
        dg.is_cuda = saved


def test_pdl_swap_answers_no_on_cuda_and_is_skipped_where_sglang_never_bound_it():
    """SGLang 0.5.23: the Triton attention backend's PDL question goes to sgl_kernel on CUDA
    hosts; without sgl_kernel the swap answers no. On other hosts SGLang never binds the name,
    and the swap leaves the module alone instead of reporting a moved SGLang."""
    swap = next((s for s in swaps.native_swaps() if s.attr == "is_arch_support_pdl"), None)
    if swap is None:
        pytest.skip("this SGLang version's Triton backend does not ask sgl_kernel about PDL")
    import importlib

    tb = importlib.import_module(swap.module)
    had = hasattr(tb, swap.attr)
    saved = getattr(tb, swap.attr, None)
    try:
        if had:
            delattr(tb, swap.attr)
        swaps.apply_swaps(tb, [swap])  # a CPU host: nothing bound, nothing to do
        assert not hasattr(tb, swap.attr)

        def standin():
            raise AssertionError("the sgl_kernel stand-in was called")

        tb.is_arch_support_pdl = standin  # what a CUDA host binds in empty mode
        swaps.apply_swaps(tb, [swap])
        assert tb.is_arch_support_pdl() is False
    finally:
        if had:
            tb.is_arch_support_pdl = saved
        elif hasattr(tb, swap.attr):
            delattr(tb, swap.attr)


def test_softcap_swap_caps_the_logits_in_place_as_sglangs_kernel():
    """On CPU the logits processor's Triton softcap (Gemma 2's final_logit_softcapping) has no
    driver; the swap computes cap * tanh(logits / cap) in place, strided views included."""
    import importlib

    import torch

    from sglang_fl.sglang_glue.adapters import get_adapter

    pytest.importorskip("sglang")
    swap = next(s for s in get_adapter().CPU_NATIVE_SWAPS if s.attr == "fused_softcap")
    lp = importlib.import_module(swap.module)
    saved = lp.fused_softcap
    try:
        def triton_without_a_driver(*args, **kwargs):
            raise RuntimeError("0 active drivers ([]). There should only be one.")

        lp.fused_softcap = triton_without_a_driver
        swaps.apply_swaps(lp, [swap])
        buffer = torch.randn(3, 64) * 100
        logits = buffer[:, :40]  # non-contiguous rows, as a padded logits buffer
        expected = 30.0 * torch.tanh(logits / 30.0)
        out = lp.fused_softcap(logits, 30.0)
        assert out is logits
        torch.testing.assert_close(buffer[:, :40], expected)
        assert buffer[:, :40].abs().max() <= 30.0 and buffer[:, 40:].abs().max() > 30.0
    finally:
        lp.fused_softcap = saved


def test_grammar_mask_in_torch_equals_a_per_token_reading_of_the_bitmask():
    """xgrammar's layout: token t allowed iff bit t % 32 of int32 word t // 32 is set (bit 31
    included); logits past the bitmask's tokens (a padded LM head) are left alone."""
    import torch

    from sglang_fl.compat.fixes import apply_token_bitmask_torch

    gen = torch.Generator().manual_seed(0)
    for vocab, rows in [(33, 1), (1000, 3), (1024, 2)]:
        words = (vocab + 31) // 32
        bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32, generator=gen)
        logits = torch.randn(rows, words * 32 + 5, generator=gen)  # 5 past the bitmask
        expected = logits.clone()
        for r in range(rows):
            for t in range(words * 32):
                if not (int(bitmask[r, t // 32]) >> (t % 32)) & 1:
                    expected[r, t] = float("-inf")
        apply_token_bitmask_torch(logits, bitmask)
        assert torch.equal(logits, expected)


def test_grammar_mask_fix_keeps_sglangs_devices_and_masks_the_others_in_torch():
    import types

    import torch

    from sglang_fl.compat import fixes
    from sglang_fl.sglang_glue.adapters import get_adapter

    calls = []

    class XGrammarGrammar:
        def apply_vocab_mask(self, logits, vocab_mask):
            calls.append(logits.device.type)

    module = types.ModuleType("fake_xgrammar_backend")
    module.XGrammarGrammar = XGrammarGrammar
    fixes.fix_grammar_mask_device(module)
    wrapped = module.XGrammarGrammar.apply_vocab_mask
    fixes.fix_grammar_mask_device(module)  # idempotent
    assert module.XGrammarGrammar.apply_vocab_mask is wrapped
    logits = torch.zeros(1, 40)
    module.XGrammarGrammar().apply_vocab_mask(logits, torch.tensor([[1, 0]], dtype=torch.int32))
    if "cpu" in get_adapter().GRAMMAR_MASK_DEVICES:
        assert calls == ["cpu"] and (logits == 0).all()  # SGLang's own (the fake's body)
    else:
        assert calls == [] and logits[0, 0] == 0 and torch.isinf(logits[0, 1:32]).all()
        assert (logits[0, 32:] == float("-inf")).all()

    with pytest.raises(RuntimeError, match=r"XGrammarGrammar\.apply_vocab_mask.*compat/fixes\.py"):
        fixes.fix_grammar_mask_device(types.ModuleType("empty"))


def test_http_port_fix_fails_loudly_when_its_target_is_gone():
    import types

    from sglang_fl.compat import fixes

    with pytest.raises(RuntimeError, match=r"launch_server.*compat/fixes\.py"):
        fixes.fix_http_port_in_use(types.ModuleType(fixes.http_server_module()))
