"""An option SGLang accepts on CPU but cannot run there stops the server while the arguments are
parsed, naming the limit (sglang_glue/cpu_limits.py): a fast start-and-exit, no weights loaded.
Left to SGLang, ``--enable-torch-compile`` dies after loading the model with "'TorchNativeAttnBackend'
object has no attribute 'init_cpu_graph_state'"."""

from __future__ import annotations

import pytest
from e2e_support import SERVER_ARGS, hermetic_env

from sglang_fl.serving import ServerStartError, launched_server

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e


def test_torch_compile_on_cpu_is_refused_up_front(tiny_model, tmp_path):
    log = tmp_path / "server.log"
    with pytest.raises(ServerStartError), launched_server(
            tiny_model, (*SERVER_ARGS, "--enable-torch-compile"), hermetic_env(tmp_path),
            log_path=log, timeout=180):
        pass
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "CpuOptionUnsupportedError: on CPU with SGLang" in text, text[-3000:]
    assert "--enable-torch-compile needs an attention backend that builds CPU graphs" in text
    assert "Load weight begin" not in text and "Scheduler hit an exception" not in text
