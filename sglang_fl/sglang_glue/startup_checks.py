"""The image entrypoint's start-up checks, made where SGLang takes its arguments.

SGLang's ``launch_server`` (and its ``Engine``) builds a ``ServerArgs`` and resolves
it; the first thing that touches the model path is SGLang's config loader, which on a missing
local path fails deep inside transformers/huggingface_hub ("Repo id must be in the form ...")
after the import and argument handling, or tries the Hub. `check_server_args` runs as a BEFORE
hook on the adapter's ``SERVER_ARGS_CHECK`` (``ServerArgs.__post_init__`` in 0.5.11,
``ServerArgs.resolve_once`` in 0.5.23), so the check and its message are those of the
entrypoint's preflight (`sglang_fl.preflight.check_model_path`) on every SGLang version. The
``SGLANG_FL_*`` values are checked earlier still, when SGLang loads the plugin
(`sglang_fl.plugin.install`, with `sglang_fl.preflight.load_settings`).
"""

from __future__ import annotations

from sglang_fl.preflight import check_model_path


def check_server_args(server_args) -> None:
    """Refuse a model path SGLang cannot read (`PreflightError`, a ValueError)."""
    check_model_path(getattr(server_args, "model_path", None), getattr(server_args, "revision", None))
