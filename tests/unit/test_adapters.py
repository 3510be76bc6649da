"""The SGLang version adapters: chosen once from the installed version, an unsupported version
stops start-up with a message naming both, and no SGLang module path lives outside them."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from sglang_fl.dispatch.ops import OPS
from sglang_fl.sglang_glue.adapters import (
    ADAPTERS,
    SUPPORTED_VERSIONS,
    UnsupportedSGLangVersion,
    select_version,
)

PACKAGE = Path(__import__("sglang_fl").__file__).parent


def test_installed_version_picks_its_adapter_and_patch_releases_share_it():
    assert select_version("0.5.11", None) == ("0.5.11", None)
    assert select_version("0.5.23", None) == ("0.5.23", None)
    assert select_version("0.5.11.post2", None) == ("0.5.11", None)


def test_unsupported_version_names_installed_and_supported_versions():
    with pytest.raises(UnsupportedSGLangVersion) as info:
        select_version("0.5.17", None)
    message = str(info.value)
    assert "SGLang 0.5.17 is installed" in message
    assert all(v in message for v in SUPPORTED_VERSIONS)
    assert "SGLANG_FL_SGLANG_ADAPTER" in message
    with pytest.raises(UnsupportedSGLangVersion, match="not installed"):
        select_version(None, None)


def test_override_tries_an_adapter_anyway_with_a_warning():
    chosen, warning = select_version("0.5.17", "0.5.23")
    assert chosen == "0.5.23" and "0.5.17" in warning and "untested" in warning
    assert select_version("0.5.23", "0.5.23") == ("0.5.23", None)
    with pytest.raises(UnsupportedSGLangVersion, match="names no adapter"):
        select_version("0.5.11", "0.6.0")


def test_override_is_a_validated_setting():
    from sglang_fl.config import SettingsError, build_settings

    settings = build_settings(env={"SGLANG_FL_SGLANG_ADAPTER": "0.5.23"}, detect_platform=lambda: "cpu")
    assert settings.sglang_adapter == "0.5.23"
    with pytest.raises(SettingsError, match="SGLANG_FL_SGLANG_ADAPTER"):
        build_settings(env={"SGLANG_FL_SGLANG_ADAPTER": "0.4"}, detect_platform=lambda: "cpu")


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_adapter_maps_every_routed_class_and_declares_its_targets(version):
    adapter = importlib.import_module(f"sglang_fl.sglang_glue.adapters.{ADAPTERS[version]}").ADAPTER
    assert adapter.version == version
    routes = adapter.layer_routes(OPS)
    assert {r.class_name for r in routes} == {n for spec in OPS for n in spec.serves}
    assert adapter.DISPATCH_HOOK_TARGET.startswith("sglang.")
    assert set(adapter.KERNELS) >= {"apply_rope_with_cos_sin_cache_inplace", "triton_mrope_fused",
                                    "outplace_fused_experts"}


def test_the_installed_adapters_names_exist_in_the_installed_sglang():
    pytest.importorskip("sglang")
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    for name in adapter.LAYER_CLASSES:
        assert isinstance(adapter.layer_class(name), type), name
    for target in (adapter.DISPATCH_HOOK_TARGET, adapter.SERVER_ARGS_CHECK):
        owner, _, method = target.rpartition(".")
        assert callable(getattr(adapter.resolve(owner), method)), target
    for key in adapter.MODULES:
        adapter.module(key)
    assert all(callable(p) or isinstance(p, type) for p in adapter.tensor_dict_parts())
    adapter.request_time_stats_class()


def test_sglang_module_paths_live_only_in_the_adapters():
    """Outside ``sglang_glue/adapters``, the package names no ``sglang.`` module, except the
    import stand-ins' list of what they stand in for and the entry-point groups of pyproject."""
    allowed = {"sglang.srt.plugins", "sglang.srt.platforms", "sglang.jit_kernel"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "adapters" in path.parts:
            continue
        for m in re.finditer(r"\bsglang(?:\.[a-z_]+)+", path.read_text(encoding="utf-8")):
            if m.group(0) not in allowed:
                found.append(f"{path.relative_to(PACKAGE)}: {m.group(0)}")
    assert found == []


#: The JIT modules each version's adapter prebuilds (by the module that holds the factory), and
#: those a bf16 Qwen2.5-0.5B server of the e2e benchmark builds (``--e2e``).
JIT_FAMILIES = {
    "0.5.11": {"rope", "activation", "kvcache", "clamp_position", "resolve_future_token_ids"},
    "0.5.23": {"rope", "activation", "kvcache", "clamp_position"},
}
JIT_E2E = {
    "0.5.11": {("rope", (True, 64, "bfloat16")), ("activation", ("bfloat16",)), ("kvcache", (256,)),
               ("clamp_position", ("int32",)), ("clamp_position", ("int64",)),
               ("resolve_future_token_ids", ("int32",)), ("resolve_future_token_ids", ("int64",))},
    "0.5.23": {("rope", (True, 64, "bfloat16", "bfloat16")), ("activation", ("bfloat16",)),
               ("kvcache", (256, 256, 0)), ("clamp_position", ("int32",)),
               ("clamp_position", ("int64",))},
}


def _adapter(version):
    return importlib.import_module(f"sglang_fl.sglang_glue.adapters.{ADAPTERS[version]}").ADAPTER


def _jit_prebuild():
    import sys

    sys.path.insert(0, str(PACKAGE.parent / "benchmarks"))
    try:
        return importlib.import_module("jit_prebuild")
    finally:
        sys.path.pop(0)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_each_adapter_lists_its_versions_jit_kernels_to_prebuild(version):
    """0.5.11's JIT kernels live in sglang.jit_kernel (cached by tvm-ffi); 0.5.23 moved them to
    sglang.kernels.ops, caches them itself and dropped resolve_future_token_ids."""
    builds = _adapter(version).JIT_PREBUILD
    package = {"0.5.11": "sglang.jit_kernel.", "0.5.23": "sglang.kernels.ops."}[version]
    assert all(b.module.startswith(package) for b in builds), builds
    assert {b.module.rsplit(".", 1)[1] for b in builds} == JIT_FAMILIES[version]
    assert {(b.module.rsplit(".", 1)[1], b.args) for b in builds if b.e2e} == JIT_E2E[version]
    assert len(set(builds)) == len(builds)
    assert _adapter(version).JIT_CACHE_DIR_ENV == {"0.5.11": "TVM_FFI_CACHE_DIR",
                                                   "0.5.23": "SGLANG_JIT_CACHE_DIR"}[version]


def test_the_installed_versions_jit_factories_take_the_listed_arguments():
    """Each listed factory exists in the installed SGLang and accepts its arguments (a str
    argument names a torch dtype); building needs a GPU, binding does not."""
    import inspect

    torch = pytest.importorskip("torch")
    pytest.importorskip("sglang")
    from sglang_fl.compat import activate
    from sglang_fl.sglang_glue.adapters import get_adapter

    activate()
    for build in get_adapter().JIT_PREBUILD:
        factory = getattr(importlib.import_module(build.module), build.function)
        args = [getattr(torch, a) if isinstance(a, str) else a for a in build.args]
        assert all(isinstance(a, torch.dtype) for a, raw in zip(args, build.args, strict=True)
                   if isinstance(raw, str)), build
        inspect.signature(factory).bind(*args)


def test_the_prebuild_skips_with_a_reason_where_there_is_nothing_to_build(monkeypatch, capsys):
    """An adapter that lists nothing: the stage says so, for which version and why, and exits
    0 without building; without apache-tvm-ffi (empty mode) nothing can build either."""
    pytest.importorskip("sglang")
    import sglang_fl.sglang_glue.adapters as adapters

    jit_prebuild = _jit_prebuild()
    installed = adapters.get_adapter()
    nothing = type("NoJit", (type(installed),), {"JIT_PREBUILD": ()})()
    monkeypatch.setattr(adapters, "get_adapter", lambda: nothing)
    assert jit_prebuild.main([]) == 0
    printed = capsys.readouterr().out
    assert printed == (f"nothing to prebuild for SGLang {adapters.installed_sglang_version()}: "
                       f"{nothing.JIT_PREBUILD_NONE_REASON}\n")

    reason = jit_prebuild._nothing_reason(installed)
    if _installed("apache-tvm-ffi"):
        assert reason is None
    else:
        assert reason.startswith("apache-tvm-ffi is not installed"), reason


def _installed(dist: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_a_breakable_cuda_graph_without_cuda_python_is_refused_naming_the_package(monkeypatch):
    """0.5.23's breakable graph needs cuda.bindings; without it the server must stop at start
    with the package and the option that avoids it, never assert deep in a capture."""
    from types import SimpleNamespace

    from sglang_fl.dispatch import backends
    from sglang_fl.sglang_glue.adapters import v0_5_11, v0_5_23

    adapter = v0_5_23.ADAPTER

    def args(prefill, decode="full"):
        return SimpleNamespace(cuda_graph_config=SimpleNamespace(
            prefill=SimpleNamespace(backend=prefill), decode=SimpleNamespace(backend=decode)))

    monkeypatch.setattr(backends, "real_module_available",
                        lambda name: (False, f"{name} is not installed"))
    problems = adapter.graph_backend_problems(args("breakable"))
    assert len(problems) == 1
    for needle in ("breakable CUDA graph (prefill)", "cuda-python", "cuda.bindings.runtime is not "
                   "installed", "--cuda-graph-backend-prefill disabled"):
        assert needle in problems[0], problems
    assert "decode" in adapter.graph_backend_problems(args("disabled", "breakable"))[0]
    assert adapter.graph_backend_problems(args("disabled")) == []  # sglang-fl's default
    assert adapter.graph_backend_problems(SimpleNamespace()) == []  # not resolved: nothing chosen
    assert v0_5_11.ADAPTER.graph_backend_problems(args("breakable")) == []  # no such graph there
    monkeypatch.setattr(backends, "real_module_available", lambda name: (True, ""))
    assert adapter.graph_backend_problems(args("breakable", "breakable")) == []
