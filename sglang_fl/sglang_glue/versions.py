"""The SGLang versions sglang-fl has an adapter for (``sglang_glue/adapters``), as data only:
Settings validates ``SGLANG_FL_SGLANG_ADAPTER`` against it without importing the adapters."""

#: Supported SGLang version -> its adapter module in ``sglang_fl.sglang_glue.adapters``. The
#: first is the default test stack (``nox -s tests``).
ADAPTER_MODULES = {"0.5.11": "v0_5_11", "0.5.23": "v0_5_23"}
SUPPORTED_VERSIONS = tuple(ADAPTER_MODULES)
