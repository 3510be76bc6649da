"""Layer-isolation variants serve the same greedy ids as plugin-on, and the plugin-off path.

Plugin-on equals HF transformers (test_server.py); each variant is compared with the same HF
ids, so each variant equals plugin-on token for token.
"""

from __future__ import annotations

import pytest
from e2e_support import (
    EXPECTED_DISPATCH,
    dispatch_lines,
    greedy_ids,
    installed,
    serve,
    standin_calls_in,
)

from sglang_fl.serving import ServerStartError

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

VARIANTS = {
    # Layer 2 off: SGLang's own forward for every fused op; no dispatch lines at all.
    "oot-disabled": ({"SGLANG_FL_OOT_ENABLED": "0"}, []),
    # Per-op order: flagos first for rms_norm (no Triton device here, so it falls back).
    "per-op": ({"SGLANG_FL_PER_OP": "rms_norm=flagos|reference;silu_and_mul=reference;"
                                    "rotary_embedding=reference"},
               sorted(EXPECTED_DISPATCH.values())),
    # RotaryEmbedding left to SGLang; the other two still routed.
    "blacklist-rope": ({"SGLANG_FL_OOT_BLACKLIST": "RotaryEmbedding"},
                       sorted(v for k, v in EXPECTED_DISPATCH.items() if k != "RotaryEmbedding")),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_serves_the_same_greedy_ids(variant, tiny_model, prompt_ids, hf_ids, tmp_path):
    env, expected_lines = VARIANTS[variant]
    with serve(tiny_model, tmp_path, **env) as srv:
        assert greedy_ids(srv, prompt_ids) == hf_ids
        log = srv.log_text()
    assert dispatch_lines(tmp_path) == expected_lines
    assert standin_calls_in(log) == []


def test_sglang_plugins_none_on_this_install(tiny_model, prompt_ids, hf_ids, tmp_path):
    """``SGLANG_PLUGINS=__none__`` switches sglang-fl off entirely, the import stand-ins included
    (the .pth hook honours SGLang's own filter). On an empty install -- no sglang-kernel, no
    working torchvision, as in CI -- native SGLang cannot even import its server arguments:
    that is the expected, clear failure, and it shows the stand-ins are what makes the plugin-on
    run start. Where the CUDA-only packages are installed, the native path must serve the same ids.
    """
    empty_install = not (installed("sgl-kernel") or installed("sglang-kernel")) or not installed("torchvision")
    if empty_install:
        with pytest.raises(ServerStartError) as err:
            with serve(tiny_model, tmp_path, timeout=180, SGLANG_PLUGINS="__none__"):
                pass
        msg = str(err.value)
        assert "exited with code" in msg
        assert any(s in msg for s in ("torchvision", "Torchvision", "sgl_kernel", "flashinfer")), msg
    else:
        with serve(tiny_model, tmp_path, SGLANG_PLUGINS="__none__") as srv:
            assert greedy_ids(srv, prompt_ids) == hf_ids
    assert dispatch_lines(tmp_path) == []
