"""Start sglang-fl's Prometheus series (`sglang_fl.metrics`) in each SGLang process that exports
its own: SGLang builds a metrics collector there only with ``--enable-metrics``, and only after
it set ``PROMETHEUS_MULTIPROC_DIR``, so importing prometheus_client then is safe. The hook
targets are the version adapter's ``SCHEDULER_METRICS_INIT`` / ``TOKENIZER_METRICS_INIT``."""

from __future__ import annotations

from sglang_fl import metrics
from sglang_fl.sglang_glue.adapters import get_adapter


def register_metrics_export() -> None:
    adapter = get_adapter()
    adapter.register_hook(adapter.SCHEDULER_METRICS_INIT, _scheduler_collector_built, "after")
    adapter.register_hook(adapter.TOKENIZER_METRICS_INIT, _tokenizer_collector_built, "after")


def _scheduler_collector_built(result, *args, **kwargs) -> None:
    metrics.start_export(dispatch=True)  # this process runs the model: routes and collectives


def _tokenizer_collector_built(result, *args, **kwargs) -> None:
    metrics.start_export(dispatch=False)
