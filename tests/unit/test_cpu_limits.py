"""CPU server options refused while arguments are parsed (sglang_glue/cpu_limits.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_fl.sglang_glue.adapters import get_adapter
from sglang_fl.sglang_glue.cpu_limits import CpuOptionUnsupportedError, check_cpu_options


def args(**kw):
    return SimpleNamespace(**{"attention_backend": "torch_native", "enable_torch_compile": False,
                              "page_size": None, **kw})


def test_defaults_pass():
    check_cpu_options(args())
    check_cpu_options(args(page_size=1))


def test_torch_compile_without_a_cpu_graph_backend_is_refused_naming_where_the_backend_came_from():
    origins = {"attention_backend": "sglang-fl's server default: intel_amx needs sgl_kernel's CPU build"}
    with pytest.raises(CpuOptionUnsupportedError) as err:
        check_cpu_options(args(enable_torch_compile=True), origins)
    msg = str(err.value)
    assert "--enable-torch-compile" in msg and "'torch_native'" in msg and origins["attention_backend"] in msg
    assert "intel_amx" in msg
    check_cpu_options(args(enable_torch_compile=True, attention_backend="intel_amx"))


def test_page_size_above_one_follows_the_versions_allocator():
    if get_adapter().CPU_PAGED_KV:
        check_cpu_options(args(page_size=16))
        return
    with pytest.raises(CpuOptionUnsupportedError, match=r"--page-size 16: SGLang .* Triton kernel.*--page-size 1"):
        check_cpu_options(args(page_size=16))


def test_every_problem_is_named_at_once():
    if get_adapter().CPU_PAGED_KV:
        pytest.skip("this SGLang version pages the KV cache on CPU")
    with pytest.raises(CpuOptionUnsupportedError) as err:
        check_cpu_options(args(page_size=4, enable_torch_compile=True))
    assert "--enable-torch-compile" in str(err.value) and "--page-size 4" in str(err.value)
