"""Start sglang-fl's Prometheus series (`sglang_fl.metrics`) in each SGLang process that exports
its own: SGLang builds a metrics collector there only with ``--enable-metrics``, and only after
it set ``PROMETHEUS_MULTIPROC_DIR``, so importing prometheus_client then is safe. The hook
targets are the version adapter's ``SCHEDULER_METRICS_INIT`` / ``TOKENIZER_METRICS_INIT``."""

from __future__ import annotations

from sglang_fl.metrics import start_export
from sglang_fl.sglang_glue.adapters import get_adapter


def register_metrics_export() -> None:
    adapter = get_adapter()
    adapter.register_hook(adapter.SCHEDULER_METRICS_INIT, _scheduler_collector_built, "after")
    adapter.register_hook(adapter.TOKENIZER_METRICS_INIT, _tokenizer_collector_built, "after")


def info_labels() -> dict[str, str]:
    """The labels of ``sglang_fl_info`` in this process."""
    from sglang_fl.compat import state
    from sglang_fl.config import get_settings
    from sglang_fl.distributed import resolve_backend
    from sglang_fl.install_info import installed_versions

    settings = get_settings()
    versions = installed_versions()
    return {"version": versions["sglang_fl"], "sglang": versions["sglang"],
            "torch": versions["torch"], "flag_gems": versions["flag_gems"],
            "platform": settings.platform, "dist_backend": resolve_backend(settings),
            "empty_mode": "true" if state.standins else "false",
            "standins": ",".join(state.standins)}


def _scheduler_collector_built(result, *args, **kwargs) -> None:
    start_export(info_labels(), dispatch=True)  # this process runs the model: routes, collectives


def _tokenizer_collector_built(result, *args, **kwargs) -> None:
    start_export(info_labels(), dispatch=False)
