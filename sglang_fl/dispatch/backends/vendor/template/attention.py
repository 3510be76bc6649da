"""Example attention backend of the template vendor: ``--attention-backend template_native``.

It delegates to SGLang's own ``torch_native`` backend, so it serves on any machine (the CPU
test suite selects it by name). A chip's real backend returns its own subclass of
``get_adapter().attention_backend_base()`` (SGLang's ``AttentionBackend``: ``init_forward_metadata``,
``forward_extend``, ``forward_decode``, ...) and sets ``triton_helpers`` to whether SGLang's
Triton helper kernels run on the chip.
"""

from __future__ import annotations

from sglang_fl.dispatch.types import AttentionBackendImpl

NAME = "template_native"


def create_attention_backend(model_runner):
    from sglang_fl.sglang_glue.adapters import get_adapter

    return get_adapter().create_sglang_attention_backend("torch_native", model_runner)


ATTENTION = AttentionBackendImpl(NAME, vendor="template", factory=create_attention_backend,
                                 triton_helpers=False)
