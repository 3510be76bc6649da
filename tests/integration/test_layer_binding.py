"""How a real SGLang layer is bound: resolution once, run-time fallback through the bridge
(non-strict) or propagation (strict), the one-time dispatch log; Layer 1 and server defaults."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from routing_helpers import make_layer, router_with

from sglang_fl.config import build_settings

pytestmark = pytest.mark.integration


class Flaky:
    """An impl that raises at run time, like a kernel rejecting a shape."""

    def __init__(self):
        self.calls = 0

    def __call__(self, obj, x, residual=None):
        self.calls += 1
        raise RuntimeError("unsupported shape")


def test_runtime_failure_falls_back_once_with_one_warning(sglang_with_plugin, caplog, tmp_path):
    log = tmp_path / "d.log"
    flaky = Flaky()
    router, manager = router_with({"SGLANG_FL_PREFER": "flagos", "SGLANG_FL_DISPATCH_LOG": str(log)},
                                  flaky)
    layer, native = make_layer()
    layer._forward_method = router.bind(layer, native)
    x, res = torch.randn(3, 64), torch.randn(3, 64)
    with caplog.at_level(logging.WARNING, logger="sglang_fl"):
        out1 = layer.forward(x)
        out2 = layer.forward(x, res.clone())
        out3 = layer.forward(x)
    torch.testing.assert_close(out1, layer.forward_native(x))
    torch.testing.assert_close(out2[0], layer.forward_native(x, res.clone())[0])
    torch.testing.assert_close(out3, out1)
    assert flaky.calls == 1  # dropped after its first failure
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'rms_norm'" in warnings[0] and "'flagos'" in warnings[0]
    assert "unsupported shape" in warnings[0]
    # flagos never returned a result: only the route that ran is logged.
    assert log.read_text().splitlines() == ["[OOT-DISPATCH] RMSNorm → reference(reference)"]


def test_a_layer_first_called_after_another_layers_fallback_runs_the_next_impl(sglang_with_plugin):
    """Both layers are bound while flagos is the choice (model construction); the first one's
    first call drops it. The second, first called afterwards, has nothing left to fall back
    to and must bind what the op runs now, not the impl it was built with."""
    flaky = Flaky()
    router, manager = router_with({"SGLANG_FL_PREFER": "flagos"}, flaky)
    (first, native1), (second, native2) = make_layer(), make_layer()
    first._forward_method = router.bind(first, native1)
    second._forward_method = router.bind(second, native2)
    x = torch.randn(3, 64)
    first.forward(x)
    torch.testing.assert_close(second.forward(x), second.forward_native(x))
    assert flaky.calls == 1


def test_strict_runtime_failure_propagates(sglang_with_plugin):
    flaky = Flaky()
    router, _ = router_with({"SGLANG_FL_PREFER": "flagos", "SGLANG_FL_STRICT": "1"}, flaky)
    layer, native = make_layer()
    layer._forward_method = router.bind(layer, native)
    with pytest.raises(RuntimeError, match="unsupported shape"):
        layer.forward(torch.randn(2, 64))
    with pytest.raises(RuntimeError, match="unsupported shape"):
        layer.forward(torch.randn(2, 64))
    assert flaky.calls == 2


def test_resolution_happens_once_for_many_layers(sglang_with_plugin, monkeypatch):
    router, manager = router_with({"SGLANG_FL_PREFER": "reference"}, Flaky())
    calls = []
    original = manager._resolve_uncached
    monkeypatch.setattr(manager, "_resolve_uncached", lambda op: calls.append(op) or original(op))
    for _ in range(24):
        layer, native = make_layer()
        layer._forward_method = router.bind(layer, native)
        layer.forward(torch.randn(1, 64))
    assert calls == ["rms_norm"]


def test_layer1_reports_itself_disabled_on_this_cpu():
    from sglang_fl.aten import _enable

    status = _enable(build_settings(env={"USE_FLAGGEMS": "1"}, detect_platform=lambda: "none"))
    assert not status.enabled and "flag_gems cannot run here" in status.reason
    status = _enable(build_settings(env={"USE_FLAGGEMS": "0"}, detect_platform=lambda: "none"))
    assert not status.enabled and "USE_FLAGGEMS=0" in status.reason


def test_aten_record_filter_keeps_layer1_calls_only():
    from sglang_fl.aten import Layer1RecordFilter

    f = Layer1RecordFilter()
    rec = logging.LogRecord("flag_gems.ops.mm", logging.DEBUG, "x.py", 1, "GEMS MM", None, None)
    assert f.filter(rec)
    other = logging.LogRecord("flag_gems.fused.rotary", logging.DEBUG, "x.py", 1, "m", None, None)
    assert not f.filter(other)
    # the same ops record emitted while a Layer-2 flagos impl runs is dropped
    ns = {"f": f, "rec": rec, "__name__": "sglang_fl.dispatch.backends.flaggems"}
    code = compile("result = f.filter(rec)", "/x/sglang_fl/dispatch/backends/flaggems.py", "exec")
    exec(code, ns)
    assert ns["result"] is False


def user_input(args):
    """What SGLang keeps of the user's input before it fills device defaults: 0.5.11 runs the
    post-init hook, 0.5.23's resolution snapshots the raw fields."""
    from sglang_fl.sglang_glue.adapters import get_adapter
    from sglang_fl.sglang_glue.server_defaults import remember_user_choices

    if get_adapter().SERVER_ARGS_POST_INIT:
        remember_user_choices(args)
    else:
        import msgspec

        args._raw_input = {f.name: getattr(args, f.name) for f in msgspec.structs.fields(args)}
    return args


def test_server_defaults_only_touch_what_the_user_left_unset(sglang_with_plugin):
    from sglang.srt.server_args import ServerArgs

    from sglang_fl.sglang_glue.server_defaults import CPU_MAX_TOTAL_TOKENS, apply_defaults

    cpu = build_settings(env={}, detect_platform=lambda: "cpu")
    args = user_input(ServerArgs(model_path="dummy", max_total_tokens=2048))
    args.attention_backend = "intel_amx"  # what SGLang fills in on device=cpu
    changed = apply_defaults(cpu, args)
    assert args.attention_backend == "torch_native" and args.disable_cuda_graph is True
    assert args.sleep_on_idle is True and "busy polling" in changed["sleep_on_idle"][1]
    assert args.max_total_tokens == 2048 and "max_total_tokens" not in changed
    args = user_input(ServerArgs(model_path="dummy", attention_backend="intel_amx"))
    apply_defaults(cpu, args)
    assert args.attention_backend == "intel_amx"  # the user's explicit choice stays
    assert args.max_total_tokens == CPU_MAX_TOTAL_TOKENS

    # A platform YAML's (here: env's) attention_backend replaces sglang-fl's own default, and
    # is said where it came from; an explicit --attention-backend still wins.
    vendor = build_settings(env={"SGLANG_FL_ATTENTION_BACKEND": "template_native"},
                            detect_platform=lambda: "cpu")
    args = user_input(ServerArgs(model_path="dummy"))
    changed = apply_defaults(vendor, args)
    assert args.attention_backend == "template_native"
    assert "SGLANG_FL_ATTENTION_BACKEND" in changed["attention_backend"][1]
    args = user_input(ServerArgs(model_path="dummy", attention_backend="torch_native"))
    apply_defaults(vendor, args)
    assert args.attention_backend == "torch_native"


def test_hybrid_cpu_defaults_reach_hybrid_models_only(sglang_with_plugin, tmp_path):
    """The version's CPU defaults for hybrid models (0.5.23: no_buffer mamba cache, overlap
    scheduling off) leave a dense model's scheduling to SGLang; a model whose config is not
    readable here gets them (it may be hybrid)."""
    import json

    from sglang.srt.server_args import ServerArgs

    from sglang_fl.sglang_glue.adapters import get_adapter
    from sglang_fl.sglang_glue.server_defaults import apply_defaults

    hybrid_defaults = get_adapter().CPU_HYBRID_DEFAULTS
    if not hybrid_defaults:
        pytest.skip("this SGLang version needs no CPU defaults for hybrid models")
    cpu = build_settings(env={}, detect_platform=lambda: "cpu")
    configs = {"dense": {"model_type": "qwen2"},
               "hybrid": {"model_type": "qwen3_5", "text_config": {"linear_num_key_heads": 2}}}
    for name, config in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    for model, expect in ((tmp_path / "dense", False), (tmp_path / "hybrid", True), ("dummy", True)):
        args = user_input(ServerArgs(model_path="dummy"))
        args.model_path = str(model)
        before = {k: getattr(args, k) for k in hybrid_defaults}
        changed = apply_defaults(cpu, args)
        for option, (value, _) in hybrid_defaults.items():
            if expect:
                assert getattr(args, option) == value, (model, option)
            else:
                assert getattr(args, option) == before[option] and option not in changed, (model, option)


def test_the_conv_state_follows_an_fp32_dtype_on_a_gpu(sglang_with_plugin, monkeypatch):
    """On a GPU an fp32 (or fp16, by any spelling) hybrid gets a conv state of its dtype (SGLang's Triton causal_conv1d_fn does
    not compile for an fp32 input with its bf16 default: the op fell to the PyTorch reference
    on the H100, 2026-12-05); a bf16 model keeps SGLang's default, and the user's own
    variable wins."""
    from sglang.srt.server_args import ServerArgs

    from sglang_fl.sglang_glue.adapters import get_adapter
    from sglang_fl.sglang_glue.server_defaults import apply_defaults

    env = get_adapter().MAMBA_CONV_DTYPE_ENV
    cuda = build_settings(env={}, detect_platform=lambda: "cuda")
    # apply_defaults writes os.environ itself: setenv first makes monkeypatch record the
    # variable's state now (delenv of an absent one records nothing), so it is restored after;
    # a leaked value would reach the served tests' servers.
    monkeypatch.setenv(env, "unset-by-this-test")
    monkeypatch.delenv(env)
    changed = apply_defaults(cuda, user_input(ServerArgs(model_path="dummy", dtype="float32")))
    assert os.environ[env] == "float32" and "causal_conv1d_fn" in changed[env][1]
    for spelling, name in (("half", "float16"), ("float", "float32"), ("float16", "float16")):
        monkeypatch.delenv(env)
        apply_defaults(cuda, user_input(ServerArgs(model_path="dummy", dtype=spelling)))
        assert os.environ[env] == name, spelling  # the name SGLang reads (else it takes bf16)
    monkeypatch.delenv(env)
    changed = apply_defaults(cuda, user_input(ServerArgs(model_path="dummy", dtype="bfloat16")))
    assert env not in os.environ and env not in changed
    monkeypatch.setenv(env, "bfloat16")
    changed = apply_defaults(cuda, user_input(ServerArgs(model_path="dummy", dtype="float32")))
    assert os.environ[env] == "bfloat16" and env not in changed


def test_vendor_attention_backend_is_registered_with_sglang(sglang_with_plugin):
    """The template vendor's example is in SGLang's registry and argparse choices, runs none
    of SGLang's Triton helpers, and builds SGLang's torch_native backend."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES
    from sglang.srt.utils.common import support_triton

    assert "template_native" in ATTENTION_BACKENDS and "template_native" in ATTENTION_BACKEND_CHOICES
    assert support_triton("template_native") is False
    # SGLang's own answer for its own names (0.5.11: True; 0.5.23 also asks the platform: False
    # on CPU)
    assert support_triton("triton") is support_triton.__wrapped__("triton")


def test_unknown_attention_backend_is_refused_with_the_registered_names(sglang_with_plugin):
    """What ``ServerArgs.__post_init__`` runs for a real model (a "dummy" one returns early)."""
    from sglang.srt.platforms import current_platform
    from sglang.srt.server_args import ServerArgs

    from sglang_fl.sglang_glue.attention import (
        UnknownAttentionBackendError,
        check_attention_backends,
    )
    from sglang_fl.sglang_glue.server_defaults import apply_defaults

    args = user_input(ServerArgs(model_path="dummy", attention_backend="no_such_backend"))
    with pytest.raises(UnknownAttentionBackendError) as err:
        current_platform.apply_server_args_defaults(args)
    msg = str(err.value)
    assert "--attention-backend 'no_such_backend' (from the server arguments)" in msg
    assert "torch_native" in msg and "template_native (vendor.template)" in msg

    # A platform YAML (here: env) naming a backend nothing registered: the message says where.
    settings = build_settings(env={"SGLANG_FL_ATTENTION_BACKEND": "my_chip_attn"},
                              detect_platform=lambda: "cpu")
    args = user_input(ServerArgs(model_path="dummy"))
    changed = apply_defaults(settings, args)
    with pytest.raises(UnknownAttentionBackendError, match="from env SGLANG_FL_ATTENTION_BACKEND"):
        check_attention_backends(args, {k: why for k, (_, why) in changed.items()})


def test_the_prefill_graph_default_reaches_what_sglang_reads_on_cuda(sglang_with_plugin,
                                                                    monkeypatch):
    """0.5.23 applies platform defaults after it folded ``cuda_graph_backend_prefill`` into
    ``cuda_graph_config``: the default must land in the resolved config (as SGLang's pipeline
    runs: parse, then the platform's defaults through its recorder), and a user's choice of
    the prefill backend stays. 0.5.11 reads its option after the platform defaults."""
    from sglang.srt.server_args import ServerArgs

    from sglang_fl.sglang_glue.server_defaults import apply_defaults

    cuda = build_settings(env={}, detect_platform=lambda: "cuda")
    try:
        from sglang.srt.arg_groups.cuda_graph_hook import parse_cuda_graph_config
        from sglang.srt.arg_groups.overrides import record_foreign_defaults, resolution_result
    except ImportError:  # 0.5.11
        args = user_input(ServerArgs(model_path="dummy"))
        changed = apply_defaults(cuda, args)
        assert args.disable_piecewise_cuda_graph is True and "FlagGems" in changed[
            "disable_piecewise_cuda_graph"][1]
        return

    from sglang.srt.model_executor import cuda_graph_config

    from sglang_fl.dispatch import backends

    # SGLang's default on a CUDA host (this one has none): the breakable prefill graph; and
    # cuda-python, which it needs, as a GPU install of SGLang 0.5.23 has it.
    monkeypatch.setattr(cuda_graph_config, "default_prefill_backend", lambda: "breakable")
    monkeypatch.setattr(backends, "real_module_available", lambda name: (True, ""))

    def prefill_backend(**options):
        args = ServerArgs(model_path="dummy", **options)
        parse_cuda_graph_config(args)
        record_foreign_defaults(args, "platform:fl", lambda rec: apply_defaults(cuda, rec))
        config = resolution_result(args, "cuda_graph_config")
        return str(config.prefill.backend), str(config.decode.backend)

    assert prefill_backend() == ("disabled", "full")  # decode graphs stay on
    assert prefill_backend(cuda_graph_backend_prefill="breakable") == ("breakable", "full")
    assert prefill_backend(cuda_graph_backend_prefill="disabled") == ("disabled", "full")
    # Without cuda-python a chosen breakable graph stops the start with the reason.
    monkeypatch.setattr(backends, "real_module_available",
                        lambda name: (False, f"{name} is not installed"))
    with pytest.raises(ValueError, match="breakable CUDA graph .prefill. needs cuda-python"):
        prefill_backend(cuda_graph_backend_prefill="breakable")
    assert prefill_backend() == ("disabled", "full")  # sglang-fl's default needs none


def test_empty_mode_cuda_defaults_keep_the_gdn_kernels_off_flashinfer(sglang_with_plugin):
    """On a CUDA host without flashinfer, the linear-attention kernels stay Triton (0.5.23
    picks FlashInfer's GDN prefill on SM90/SM100 by itself); a user's choice stays."""
    from sglang.srt.server_args import ServerArgs

    from sglang_fl.sglang_glue.server_defaults import apply_defaults

    cuda = build_settings(env={}, detect_platform=lambda: "cuda")
    if not hasattr(ServerArgs(model_path="dummy"), "linear_attn_prefill_backend"):
        pytest.skip("this SGLang version has no linear-attention kernel options")
    args = user_input(ServerArgs(model_path="dummy"))
    changed = apply_defaults(cuda, args)
    assert (args.linear_attn_prefill_backend, args.linear_attn_decode_backend) == ("triton", "triton")
    assert "flashinfer is not installed" in changed["linear_attn_prefill_backend"][1]
    args = user_input(ServerArgs(model_path="dummy", linear_attn_prefill_backend="cutedsl"))
    apply_defaults(cuda, args)
    assert args.linear_attn_prefill_backend == "cutedsl"
