"""MTP (NEXTN) speculative decoding of the Qwen3.5 tiny model with its MTP head, on CPU.

SGLang builds no EAGLE/NEXTN draft attention backend on CPU for the plugin's default
(torch_native): 0.5.11 has none at all there, 0.5.23 only intel_amx (sgl_kernel's CPU build).
Left to SGLang, the server dies in the scheduler after loading both models, at an unrelated
hard-coded CUDA call. The plugin refuses at argument time, naming the limit; this test holds
it to that (a fast start-and-exit, no model forward). Exactness of speculative against plain
greedy ids needs a GPU run (docs/speculative-decoding.md).
"""

from __future__ import annotations

import pytest
from e2e_support import SERVER_ARGS, hermetic_env

from sglang_fl.serving import ServerStartError, launched_server

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

NEXTN_ARGS = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "1",
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2")


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen3.5-mtp", preset="qwen3.5",
                           mtp_num_hidden_layers=1)


def test_cpu_speculation_is_refused_up_front_naming_the_limit(mtp_model, tmp_path):
    from sglang_fl.sglang_glue.adapters import get_adapter

    log = tmp_path / "server.log"
    with pytest.raises(ServerStartError), launched_server(
            mtp_model, SERVER_ARGS + NEXTN_ARGS, hermetic_env(tmp_path), log_path=log, timeout=180):
        pass
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "SpeculationUnsupportedError: --speculative-algorithm NEXTN on CPU" in text, text[-3000:]
    assert "--attention-backend 'torch_native'" in text
    accepted = get_adapter().CPU_SPECULATIVE_ATTENTION_BACKENDS
    assert (f"on CPU it has one for: {', '.join(accepted)}" if accepted else "on CPU it has none") in text
    # refused while parsing arguments: no scheduler was started, no weights loaded
    assert "Load weight begin" not in text and "Scheduler hit an exception" not in text
