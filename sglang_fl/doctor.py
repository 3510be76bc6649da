"""``sglang-fl doctor``: can this install serve on this host, and how, without starting a server.

It gathers what the server would decide at start-up, through the same code: Settings, the
SGLang version adapter, the compat ledger's activation (what the first ``import sglang`` does),
the dispatch report of ``sglang-fl ops`` and the manager's ``resolve_all`` over the ops Layer 2
routes (an op no backend can serve fails here with the server's own message), the Layer-1 plan
(`sglang_fl.aten.layer1_plan`) and the Layer-3 backend, which it tries: a one-rank gloo group,
or FlagCX's library and, where a device allows, a one-rank communicator.

Each problem is a finding: ``warning`` (it serves, but not as configured: a preferred kind
passed over, a vendor refused, Layer 1 asked for and unable to run) or ``error`` (it cannot
serve: bad configuration, unsupported SGLang, an op without implementation, FlagCX asked for and
not loadable). Exit status: 0 ok, 1 warnings, 2 cannot serve.
"""

from __future__ import annotations

import time

EXIT_CODES = {"ok": 0, "warnings": 1, "cannot serve": 2}


class _Findings(list):
    def warn(self, area: str, message: str) -> None:
        self.append({"level": "warning", "area": area, "message": message})

    def error(self, area: str, message: str) -> None:
        self.append({"level": "error", "area": area, "message": message})


def run_doctor() -> dict:
    """The report: one section per area, the findings, the verdict and its exit code."""
    from sglang_fl.config import SettingsError, get_settings
    from sglang_fl.install_info import installed_versions

    start = time.monotonic()
    findings = _Findings()
    report: dict = {"versions": installed_versions()}
    try:
        settings = get_settings()
    except SettingsError as exc:
        findings.error("config", f"invalid configuration: {exc}")
        return _verdict(report, findings, start)
    report["platform"] = _platform(settings)
    if not _adapter(report, findings):
        return _verdict(report, findings, start)
    report["empty_mode"] = _empty_mode()
    report["radix_cache"] = _radix_cache(findings)
    report["layer1"] = _layer1(settings, findings)
    report["dispatch"] = _dispatch(settings, findings)
    report["distributed"] = _distributed(settings, findings)
    return _verdict(report, findings, start)


def _verdict(report: dict, findings: _Findings, start: float) -> dict:
    levels = {f["level"] for f in findings}
    verdict = "cannot serve" if "error" in levels else "warnings" if levels else "ok"
    report.update(findings=list(findings), verdict=verdict, exit_code=EXIT_CODES[verdict],
                  seconds=round(time.monotonic() - start, 1))
    return report


def _platform(settings) -> dict:
    from sglang_fl.config.settings import CONFIG_DIR
    from sglang_fl.devices import DEVICE_TYPE, detect_platform

    yaml_path = CONFIG_DIR / f"{settings.platform}.yaml"
    chip = detect_platform()
    device = ""
    if chip != "cpu":
        import torch

        module = getattr(torch, DEVICE_TYPE[chip], None)
        name = getattr(module, "get_device_name", None)
        device = f"{module.device_count()} x {name(0)}" if name else ""
    return {"name": settings.platform, "from": settings.origins["platform"], "chip": chip,
            "device": device, "yaml": str(yaml_path) if yaml_path.is_file() else None}


def _adapter(report: dict, findings: _Findings) -> bool:
    from sglang_fl.sglang_glue.adapters import UnsupportedSGLangVersion, get_adapter

    try:
        report["sglang_adapter"] = get_adapter().version
        return True
    except UnsupportedSGLangVersion as exc:
        findings.error("sglang", str(exc))
        return False


def _empty_mode() -> dict:
    """Activate the compat ledger as the first ``import sglang`` does, and say what it did."""
    from sglang_fl import compat

    compat.activate()
    return {"standins": list(compat.state.standins), "env_set": dict(compat.state.env_set),
            "ledger": [{"name": p.name, "why": p.why, "remove_when": p.remove_when}
                       for p in compat.active_entries()]}


def _radix_cache(findings: _Findings) -> dict | None:
    """The radix cache's TreeCore as the server will pick it (compat fix ``rust_tree_core``),
    where this SGLang version has a choice. Falling back to SGLang's Python TreeCore is a
    decision, not a departure; a user who named the Rust one that fails here gets a warning."""
    from sglang_fl.compat.fixes import tree_core_decision
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    if adapter.TREE_CORE_REGISTRY is None:
        return None
    from sglang_fl.config import get_settings
    from sglang_fl.devices import DEVICE_TYPE

    device = DEVICE_TYPE.get(get_settings().platform, "cpu")
    if device not in ("cpu", "cuda"):  # SGLang's own gate: the Rust core is CPU/CUDA only
        return {"tree_core": "python", "from": f"SGLang (no Rust TreeCore on {device})",
                "device": device, "rust_problem": None}
    user = adapter.tree_core_user_choice()
    problem = adapter.rust_tree_core_problem(device) if user in (None, "rust") else None
    backend, reason = tree_core_decision("rust", user, lambda: problem)
    if user == "rust" and problem:
        findings.warn("radix_cache", f"{adapter.TREE_CORE_ENV}=rust, but the Rust TreeCore's "
                                     f"{problem}: the first request will fail")
    origin = (f"{adapter.TREE_CORE_ENV}={user}" if user is not None
              else "sglang-fl fix rust_tree_core" if reason else "SGLang's default")
    return {"tree_core": backend, "from": origin, "device": device, "rust_problem": problem}


def _layer1(settings, findings: _Findings) -> dict:
    from sglang_fl.aten import layer1_plan

    plan = layer1_plan(settings)
    if settings.use_flaggems and not plan.enabled:
        findings.warn("layer1", f"USE_FLAGGEMS=1 ({settings.origins['use_flaggems']}) but Layer 1 "
                                f"stays off: {plan.reason}")
    return {"enabled": plan.enabled, "reason": plan.reason, "mode": plan.mode, "ops": list(plan.ops)}


def _dispatch(settings, findings: _Findings) -> dict:
    """The ``sglang-fl ops`` report, plus the ops Layer 2 will resolve at start-up."""
    from sglang_fl.dispatch import NoImplementationError, get_manager
    from sglang_fl.dispatch.manager import describe_passed_over
    from sglang_fl.dispatch.report import ops_report

    report = ops_report()
    for b in report["backends"]:
        if b["detail"].startswith(("refused:", "register failed:")):
            findings.warn("dispatch", f"backend {b['name']}: {b['detail']}")
    if not settings.oot_enabled:
        report["needed"] = []
        return report
    # what LayerRouter.routed_ops asks the manager for: routed classes' ops and called_as ops
    needed = [op for op, e in report["ops"].items() if e["routed"] or e["called_as"]]
    report["needed"] = needed
    try:
        resolved = get_manager().resolve_all(needed)
    except NoImplementationError as exc:
        findings.error("dispatch", str(exc))
        return report
    from sglang_fl import compat

    notes = report.setdefault("notes", [])
    for r in resolved.values():  # each bucket's own order too; the server logs the same line
        if r.passed_over and left_out_by_empty_mode(r, compat.state.standins):
            notes.append(describe_passed_over(r))
        elif r.passed_over:
            findings.warn("dispatch", describe_passed_over(r))
    if settings.platform != "cpu":
        for key, r in resolved.items():
            slow = reference_routes(r)
            if slow:
                findings.warn("dispatch", f"{key} on {settings.platform}: {slow} go to the "
                                          "pure-PyTorch reference (a slow path on an accelerator)")
    return report


def left_out_by_empty_mode(resolved, standins) -> bool:
    """Whether every kind passed over for this op lacks it only because its package is an
    sglang-fl stand-in in this (empty-mode) install: the configuration's order cannot apply
    there by design, and the install line already names the packages left out. A note, not a
    departure from the configuration."""
    return bool(standins) and all("sglang-fl stand-in" in why for _, why in resolved.passed_over)


def reference_routes(resolved) -> str | None:
    """Which calls of a resolved op an accelerator would run on the PyTorch reference: all of
    them (the reference is the choice), or the float dtypes that every earlier candidate's
    declared limits decline (a served fp32 model's GDN prefill once went there unnoticed)."""
    from sglang_fl.dispatch.types import BackendImplKind

    if resolved.impl.kind is BackendImplKind.REFERENCE:
        return "all its calls"
    dtypes = []
    for dtype in ("bfloat16", "float16", "float32"):
        taker = next((i for i in resolved.candidates if i.limits is None
                      or all(dtype in names for _, names in i.limits.dtypes)), None)
        if taker is not None and taker.kind is BackendImplKind.REFERENCE:
            dtypes.append(dtype)
    return f"{'/'.join(dtypes)} inputs" if dtypes else None


def _distributed(settings, findings: _Findings) -> dict:
    from sglang_fl.distributed import DistBackendError, engine_kind, resolve_backend

    try:
        backend = resolve_backend(settings)
    except DistBackendError as exc:
        findings.error("distributed", str(exc))
        return {}
    from sglang_fl.distributed.flagcx import FlagCXError, find_library

    try:
        library = find_library(settings.flagcx_path)
        if library == "libflagcx.so":
            library += " (system loader: FLAGCX_PATH is not set)"
    except FlagCXError:
        library = f"none under FLAGCX_PATH={settings.flagcx_path!r}"
    out = {"backend": backend, "from": settings.origins.get("dist_backend", ""),
           "owner": "sglang-fl (CommunicatorFL)" if engine_kind(settings) else "SGLang",
           "flagcx_library": library}
    if backend == "gloo":
        out["check"] = _try_gloo()
    elif backend == "flagcx":
        out.update(_try_flagcx(settings, findings))
    else:
        out["check"] = f"not tried: SGLang's own {backend} communicators serve the groups"
    return out


def _try_gloo() -> str:
    """A one-rank gloo group and an all-reduce through CommunicatorFL's torch engine."""
    import torch
    import torch.distributed as dist

    from sglang_fl.distributed.communicator import TorchEngine

    if dist.is_initialized():
        return "not tried: torch.distributed is already initialised in this process"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.ones(2)
        TorchEngine(dist.group.WORLD, [0], 0).all_reduce(x)
        return f"ok: one-rank gloo group, all_reduce -> {x.tolist()}"
    finally:
        dist.destroy_process_group()


def _try_flagcx(settings, findings: _Findings) -> dict:
    from sglang_fl.distributed.flagcx import FlagCXError, library_candidates, load_library

    out = {"library_candidates": library_candidates(settings.flagcx_path)}
    try:
        lib = load_library(settings.flagcx_path)
    except FlagCXError as exc:
        findings.error("distributed", str(exc))
        out["check"] = "FlagCX does not load (see findings)"
        return out
    out["flagcx_library"], out["flagcx_version"] = lib.path, lib.version()
    if settings.platform == "cpu":
        findings.warn("distributed", "SGLANG_FL_DIST_BACKEND=flagcx on the CPU platform: FlagCX "
                                     "has no CPU device adaptor, so a group of more than one rank "
                                     "fails; use SGLANG_FL_DIST_BACKEND=gloo")
        out["check"] = "not tried: FlagCX has no CPU device adaptor"
        return out
    import torch

    from sglang_fl.devices import DEVICE_TYPE
    from sglang_fl.distributed.flagcx import FlagCXEngine

    try:
        FlagCXEngine(lib, rank=0, world_size=1,
                     device=torch.device(DEVICE_TYPE[settings.platform], 0)).close()
        out["check"] = "ok: one-rank FlagCX communicator created and destroyed"
    except (FlagCXError, RuntimeError) as exc:
        findings.error("distributed", f"FlagCX cannot make a one-rank communicator: {exc}")
        out["check"] = f"failed: {exc}"
    return out
