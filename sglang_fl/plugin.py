"""What ``load_plugin`` does in every SGLang process: validate Settings, then install each layer.

Order matters: Settings first (a bad value must stop start-up with its message rather than be
logged and ignored by SGLang's plugin loader; the message is the image preflight's), then the adapter of the installed SGLang version
(an unsupported version stops start-up naming the installed and supported ones), then Layer 1,
the vendors' attention backends (before SGLang parses ``--attention-backend``), the start-up
checks of the server arguments (model path: ``sglang_glue/startup_checks.py``), then the hooks
of Layers 2 and 3, which SGLang applies right after all plugins ran. Layer 2 resolves every routed op here, so an
op that no backend can serve under the policy (e.g. ``SGLANG_FL_STRICT=1`` with an unavailable
preferred kind) stops start-up too, with every such op in one message.
"""

from __future__ import annotations

from sglang_fl.logging_setup import configure_logging, get_logger
from sglang_fl.preflight import PreflightError, load_settings

logger = get_logger("plugin")
_installed = False


class ConfigurationExit(SystemExit):
    """Raised for a bad configuration, or one that no backend here can serve. A SystemExit,
    because SGLang's plugin loader catches and merely logs ordinary exceptions, which would
    start the server without the plugin."""


def require_adapter():
    """The installed SGLang's adapter; an unsupported version stops start-up with its message."""
    from sglang_fl.sglang_glue.adapters import UnsupportedSGLangVersion, get_adapter

    try:
        return get_adapter()
    except UnsupportedSGLangVersion as exc:
        logger.error("%s", exc)
        raise ConfigurationExit(f"sglang-fl: {exc}") from exc


def install() -> None:
    global _installed
    if _installed:
        return
    try:
        settings = load_settings()
    except PreflightError as exc:  # the entrypoint's preflight refuses it in the same words
        logger.error("%s", exc)
        raise ConfigurationExit(f"sglang-fl: {exc}") from exc
    configure_logging(settings.log_level)
    adapter = require_adapter()
    _installed = True

    from sglang_fl.aten import enable_layer1
    from sglang_fl.sglang_glue import server_defaults, startup_checks

    adapter.register_hook(adapter.SERVER_ARGS_CHECK, startup_checks.check_server_args, "before")
    if adapter.SERVER_ARGS_POST_INIT:
        adapter.register_hook(adapter.SERVER_ARGS_POST_INIT, server_defaults.remember_user_choices,
                              "before")
    enable_layer1(settings)

    from sglang_fl.dispatch import get_manager
    from sglang_fl.sglang_glue.attention import register_attention_backends
    from sglang_fl.sglang_glue.metrics_export import register_metrics_export
    from sglang_fl.sglang_glue.process_report import register_process_report

    register_attention_backends(get_manager())
    register_process_report()
    register_metrics_export()

    if settings.oot_enabled:
        from sglang_fl.dispatch import NoImplementationError
        from sglang_fl.sglang_glue.layer_hook import LayerRouter, register_layer_hook

        router = LayerRouter(settings, get_manager())
        try:
            router.resolve_routed_ops()
        except NoImplementationError as exc:
            logger.error("%s", exc)
            raise ConfigurationExit(f"sglang-fl: {exc}") from exc
        register_layer_hook(router)
        if settings.platform != "cpu":  # on CPU the sgl_kernel stand-ins route them (gdn.py)
            from sglang_fl.sglang_glue.gdn import install_kernel_routes

            install_kernel_routes(adapter)
    else:
        logger.info("Layer 2 (fused ops) disabled: SGLANG_FL_OOT_ENABLED=0")

    from sglang_fl.distributed import register_hooks

    register_hooks(settings)
