"""Chip-native backends, one folder per vendor (``<name>/backend.py`` + ``register_ops.py``).

Copy ``template/`` to add a vendor; discovery finds ``register_ops.py`` without other edits
(``template/`` itself loads only when enabled: ``SGLANG_FL_ENABLE_VENDORS=template``)."""
