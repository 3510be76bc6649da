"""The smoke checks (``sglang-fl doctor`` and one per layer). Each runs in its own interpreter (see `sglang_fl.smoke.runner`),
loads sglang-fl the way SGLang does (``load_plugins()``) and returns a result dict or raises
`SmokeFailure` / `SmokeSkip` with the reason."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from sglang_fl.smoke import SmokeFailure, SmokeSkip

DISPATCH_LINE = re.compile(r"\[OOT-DISPATCH\] (\w+) → (\w+)\(([^)]*)\)")


def _settings():
    from sglang_fl.config import get_settings

    return get_settings()


def _prepare(platform: str) -> None:
    """What must happen before SGLang is imported on this platform."""
    if platform == "cpu":
        # SGLang's CPU path (else RotaryEmbedding imports vllm); must precede the import.
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


def device_of(platform: str) -> str:
    from sglang_fl.devices import DEVICE_TYPE

    if platform == "ascend":
        import torch_npu  # noqa: F401  (registers the npu device)
    elif platform == "musa":
        import torch_musa  # noqa: F401  (registers the musa device)
    return DEVICE_TYPE[platform]


def device_count(platform: str) -> int:
    if platform == "cpu":
        return os.cpu_count() or 1
    import torch

    module = getattr(torch, device_of(platform))
    return int(module.device_count())


def _load_plugin() -> None:
    from sglang_fl.sglang_glue.adapters import get_adapter

    get_adapter().load_plugins()


def dispatch_choices(text: str) -> dict[str, tuple[str, str]]:
    """``{class: (kind, impl_id)}`` from ``[OOT-DISPATCH]`` lines."""
    return {m.group(1): (m.group(2), m.group(3)) for m in DISPATCH_LINE.finditer(text)}


# ---------------------------------------------------------------------------------------------


def check_layer1(workdir: Path) -> dict:
    settings = _settings()
    platform = settings.platform
    if not settings.use_flaggems or settings.oot_enabled:
        raise SmokeFailure(f"Layer-1 check needs USE_FLAGGEMS=1 and SGLANG_FL_OOT_ENABLED=0, got "
                           f"use_flaggems={settings.use_flaggems} oot_enabled={settings.oot_enabled}")
    _prepare(platform)
    _load_plugin()
    from sglang_fl.aten import layer1_status

    status = layer1_status()
    if status is None:
        raise SmokeFailure("the plugin ran but Layer 1 reported nothing (enable_layer1 not called)")
    if platform == "cpu":
        if status.enabled:
            raise SmokeFailure("Layer 1 claims to be enabled on a CPU host, where FlagGems has no device")
        if not status.reason:
            raise SmokeFailure("Layer 1 is disabled on CPU but gives no reason")
        return {"status": "disabled", "detail": f"disabled as expected on cpu: {status.reason}"}
    if not status.enabled:
        raise SmokeFailure(f"Layer 1 disabled on {platform}: {status.reason}")

    import torch

    # Ops the check calls, by FlagGems module name; which of them Layer 1 should replace follows
    # the effective configuration (a platform YAML may whitelist only a few ops).
    called = ("embedding", "softmax")
    if status.mode == "only_enable":
        expected = [op for op in called if op in status.ops]
    else:
        expected = [op for op in called if op not in status.ops]
    if not expected:
        raise SmokeSkip(f"Layer 1 is enabled ({status.reason}) for none of the ops this check "
                        f"calls ({', '.join(called)})")
    dev = device_of(platform)
    torch.manual_seed(0)
    weight, idx = torch.randn(1000, 64), torch.randint(0, 1000, (32,))
    got = torch.nn.functional.embedding(idx.to(dev), weight.to(dev)).cpu()
    torch.testing.assert_close(got, torch.nn.functional.embedding(idx, weight))
    x = torch.randn(64, 257)
    got = torch.softmax(x.to(dev), dim=-1).cpu()
    torch.testing.assert_close(got, torch.softmax(x, dim=-1), atol=1e-5, rtol=1e-4)
    log_path = settings.flaggems_log_path
    text = Path(log_path).read_text(errors="replace") if log_path and Path(log_path).exists() else ""
    recorded = sorted(set(re.findall(r"flag_gems\.ops\.([\w.]+)", text)))
    modules = {name.split(".")[0] for name in recorded}
    missing = [op for op in expected if op not in modules]
    if missing:
        raise SmokeFailure(f"Layer 1 enabled ({status.reason}) but {', '.join(missing)} on {dev} "
                           f"did not reach FlagGems: not in {log_path!r} "
                           f"(recorded: {', '.join(recorded) or 'nothing'})")
    return {"status": "passed",
            "detail": f"enabled ({status.reason}); FlagGems ran: {', '.join(recorded)}"}


def check_layer2(workdir: Path) -> dict:
    settings = _settings()
    platform = settings.platform
    if settings.use_flaggems or not settings.oot_enabled:
        raise SmokeFailure("Layer-2 check needs USE_FLAGGEMS=0 and SGLANG_FL_OOT_ENABLED=1")
    if not settings.dispatch_log:
        raise SmokeFailure("Layer-2 check needs SGLANG_FL_DISPATCH_LOG (the runner sets it)")
    _prepare(platform)
    _load_plugin()
    import torch

    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    SiluAndMul, RMSNorm = adapter.layer_class("SiluAndMul"), adapter.layer_class("RMSNorm")  # noqa: N806
    adapter.set_server_args(model_path="dummy")
    dev = device_of(platform)
    dtype = torch.float32 if platform == "cpu" else torch.bfloat16
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.manual_seed(0)
    norm = RMSNorm(896, eps=1e-6).to(device=dev, dtype=dtype)
    norm.weight.data.normal_(1.0, 0.1)
    x = torch.randn(16, 896, device=dev, dtype=dtype)
    res = torch.randn(16, 896, device=dev, dtype=dtype)
    torch.testing.assert_close(norm(x.clone()), norm.forward_native(x.clone()), **tol)
    got, want = norm(x.clone(), res.clone()), norm.forward_native(x.clone(), res.clone())
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    act = SiluAndMul()
    y = torch.randn(16, 2 * 4864, device=dev, dtype=dtype)
    torch.testing.assert_close(act(y), act.forward_native(y), **tol)
    for layer in (norm, act):
        # The hook binds either a bridge or, where nothing can fall back, the impl itself
        # (a functools.partial); either way the code is sglang-fl's, not SGLang's forward_*.
        bound = getattr(layer, "_forward_method", None)
        target = bound.func if isinstance(bound, functools.partial) else bound
        if not getattr(target, "__module__", "").startswith("sglang_fl."):
            raise SmokeFailure(f"{type(layer).__name__} is not routed through sglang-fl "
                               f"(bound forward: {bound!r})")
    for handler in __import__("logging").getLogger("sglang_fl").handlers:
        handler.flush()
    log = Path(settings.dispatch_log)
    choices = dispatch_choices(log.read_text(errors="replace") if log.exists() else "")
    for cls in ("RMSNorm", "SiluAndMul"):
        if cls not in choices:
            raise SmokeFailure(f"no [OOT-DISPATCH] line for {cls} in {log}")
        kind = choices[cls][0]
        if platform == "cpu" and kind != "reference":
            raise SmokeFailure(f"{cls} → {kind} on cpu; only the reference backend exists there")
        if platform != "cpu" and kind == "reference":
            raise SmokeFailure(f"{cls} fell back to the pure-PyTorch reference on {platform}; "
                               "the image's flagos/vendor backends are not available")
    summary = ", ".join(f"{c} → {k}({i})" for c, (k, i) in sorted(choices.items()))
    return {"status": "passed", "detail": f"routed and matching SGLang native: {summary}",
            "dispatch": {c: k for c, (k, _) in choices.items()}}


def check_layer3(workdir: Path, timeout: float = 300.0) -> dict:
    settings = _settings()
    platform = settings.platform
    from sglang_fl.distributed import engine_kind, resolve_backend

    backend = resolve_backend(settings)
    if engine_kind(settings) is None:
        raise SmokeFailure(f"Layer 3 is not sglang-fl's with backend {backend!r} (SGLang's own "
                           "communicators run); use SGLANG_FL_DIST_BACKEND=flagcx (FLAGCX_PATH) or gloo")
    if device_count(platform) < 2:
        raise SmokeSkip(f"a 2-process collective needs 2 {platform} devices, found {device_count(platform)}")
    from sglang_fl.serving import free_port

    port = free_port()
    procs, outs = [], []
    for rank in range(2):
        out = workdir / f"layer3-rank{rank}.json"
        log = open(workdir / f"layer3-rank{rank}.log", "wb")  # noqa: SIM115 - closed below
        outs.append((out, log))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "sglang_fl.smoke.layer3_worker", "--rank", str(rank),
             "--world-size", "2", "--port", str(port), "--out", str(out)],
            stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired as exc:
        raise SmokeFailure(f"2-process collective did not finish in {timeout:.0f}s") from exc
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for _, log in outs:
            log.close()
    results = []
    for rank, ((out, _), code) in enumerate(zip(outs, codes, strict=True)):
        if code != 0 or not out.exists():
            tail = (workdir / f"layer3-rank{rank}.log").read_text(errors="replace")[-3000:]
            raise SmokeFailure(f"rank {rank} exited {code}:\n{tail}")
        results.append(json.loads(out.read_text()))
    comm = {r["communicator"] for r in results}
    return {"status": "passed",
            "detail": f"backend {backend}: {sum(r['checks'] for r in results)} exact collective "
                      f"checks over 2 ranks via {', '.join(sorted(comm))}"}


def check_all(workdir: Path, timeout: float = 600.0, tp: int = 1,
              server_args: tuple[str, ...] = ()) -> dict:
    settings = _settings()
    platform = settings.platform
    _prepare(platform)
    from sglang_fl.models import make_tiny_model
    from sglang_fl.serving import launched_server

    dtype = "float32" if platform == "cpu" else "bfloat16"
    model = make_tiny_model(workdir / f"tiny-qwen2-{dtype}", dtype=dtype)
    extra = (["--tp", str(tp)] if tp > 1 else []) + list(server_args)
    env = {"SGLANG_USE_CPU_ENGINE": "1"} if platform == "cpu" else {}
    with launched_server(model, extra_args=extra, env=env, timeout=timeout,
                         log_path=workdir / "all-layers-server.log") as srv:
        body = srv.post_json("/generate", {
            "text": "The quick brown fox",
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
        })
        log = srv.log_text()
    if not srv.stop_result.clean:
        raise SmokeFailure(f"the server did not stop cleanly: {srv.stop_result.detail}")
    tokens = (body.get("meta_info") or {}).get("completion_tokens")
    if not isinstance(body.get("text"), str) or tokens != 8:
        raise SmokeFailure(f"/generate answered {body!r}; expected text and 8 completion tokens")
    choices = dispatch_choices(log)
    if settings.oot_enabled and "RMSNorm" not in choices:
        raise SmokeFailure("the server ran without any [OOT-DISPATCH] line for RMSNorm: Layer 2 "
                           "was not active in the scheduler")
    routed = ", ".join(f"{c} → {k}" for c, (k, _) in sorted(choices.items())) or "none"
    return {"status": "passed",
            "detail": f"/generate returned 8 tokens in {srv.start_seconds:.0f}s start-up (tp={tp}); "
                      f"fused ops: {routed}"}


def check_doctor(workdir: Path, timeout: float = 120.0) -> dict:
    """``sglang-fl doctor --json`` as an operator runs it: any verdict but "cannot serve" passes
    (a warning, e.g. a preferred kind without an impl of some op here, is in the detail); the
    report is kept as doctor.json."""
    proc = subprocess.run([sys.executable, "-m", "sglang_fl.cli", "doctor", "--json"],
                          capture_output=True, text=True, timeout=timeout)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise SmokeFailure(f"sglang-fl doctor exited {proc.returncode} without a JSON report: "
                           f"{(proc.stdout + proc.stderr)[-2000:]}") from None
    (workdir / "doctor.json").write_text(json.dumps(report, indent=2))
    if report["exit_code"] != proc.returncode:
        raise SmokeFailure(f"sglang-fl doctor exited {proc.returncode}, its report says "
                           f"{report['exit_code']}")
    problems = "; ".join(f"{f['level']} [{f['area']}] {f['message']}" for f in report["findings"])
    if report["verdict"] == "cannot serve":
        raise SmokeFailure(f"sglang-fl doctor: cannot serve: {problems}")
    return {"status": "passed", "detail": f"verdict {report['verdict']} in {report['seconds']} s"
            + (f": {problems}" if problems else "")}


CHECKS = {"doctor": check_doctor, "1": check_layer1, "2": check_layer2, "3": check_layer3,
          "all": check_all}
