"""A vendor folder's attention backend, by name, in a real server on CPU.

The template vendor, once enabled by name (``SGLANG_FL_ENABLE_VENDORS=template``; by default
it registers nothing), registers ``template_native``, which delegates to SGLang's ``torch_native``.
Made the default through sglang-fl's configuration (``attention_backend`` in a YAML, what a
vendor's platform YAML does), it is built by the server and serves the greedy ids of HF
transformers -- which test_server.py shows the default ``torch_native`` server serves, so the
two backends agree token for token. A name nothing registered stops the server before any
model is loaded, with the registered names in the message.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from e2e_support import greedy_ids, process_env, serve, standin_calls_in

pytestmark = pytest.mark.e2e


def test_template_attention_backend_as_the_configured_default_serves(tiny_model, prompt_ids,
                                                                     hf_ids, tmp_path):
    cfg = tmp_path / "vendor.yaml"
    cfg.write_text("attention_backend: template_native\n")
    with serve(tiny_model, tmp_path, SGLANG_FL_CONFIG=str(cfg), SGLANG_FL_ENABLE_VENDORS="template") as srv:
        assert greedy_ids(srv, prompt_ids) == hf_ids
        log = srv.log_text()
    assert f"server default: attention_backend='template_native' (attention_backend from yaml {cfg}" \
        in log
    assert "attention backend 'template_native' of vendor.template built: TorchNativeAttnBackend" in log
    assert standin_calls_in(log) == []


def launch_and_fail(model, tmp_path, args=(), **env):
    return subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--port", "1",
         *args], env=process_env(tmp_path, **{"SGLANG_FL_ENABLE_VENDORS": "template", **env}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def test_an_unregistered_attention_backend_is_refused_with_the_registered_names(tiny_model,
                                                                                 tmp_path):
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("attention_backend: template_nativ\n")
    # Both at once (each only imports SGLang and fails): the command line, checked by SGLang's
    # argparse against the choices sglang-fl extended; a configured default, checked by sglang-fl.
    cli = launch_and_fail(tiny_model, tmp_path, ["--attention-backend", "template_nativ"])
    yaml = launch_and_fail(tiny_model, tmp_path, SGLANG_FL_CONFIG=str(cfg))
    cli_out, _ = cli.communicate(timeout=240)
    yaml_out, _ = yaml.communicate(timeout=240)
    assert cli.returncode != 0 and yaml.returncode != 0
    assert "invalid choice: 'template_nativ'" in cli_out and "template_native" in cli_out, cli_out[-2000:]
    assert (f"--attention-backend 'template_nativ' (from sglang-fl's server default: "
            f"attention_backend from yaml {cfg}) is not a registered attention backend") in yaml_out, \
        yaml_out[-3000:]
    assert "template_native (vendor.template)" in yaml_out and "torch_native" in yaml_out
