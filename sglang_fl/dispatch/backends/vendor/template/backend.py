"""Template for a new chip vendor: copy this folder to ``vendor/<your_chip>/`` and edit.

1. Set ``name`` (used in ``vendor.<name>``, SGLANG_FL_ALLOW/DENY_VENDORS and the dispatch log).
2. ``is_available()``: import your runtime with ``load_real_module`` and check a device is
   visible; set ``unavailable_reason`` when not.
3. Define only the op methods your chip really implements, each named and signed as its op in
   the op table (``sglang_fl/dispatch/ops.py``, or ``sglang-fl ops``); ops you leave out fall
   through to flagos/reference. Registration checks every method against the table: a
   misspelled or mis-signed op method refuses the backend with a message naming it, so give
   helper methods a leading ``_``. Read of ``obj`` only the attributes the op's entry lists.
   ``rms_norm`` with a residual must add ``x + residual + post_residual_addition`` in fp32, as
   SGLang's ``RMSNorm.forward_native`` does; a fused add-norm kernel that takes only two inputs
   gets them from ``self.residual_sum_parts`` (see ``vendor/cuda`` for the pattern).
   MoE: ``topk`` gets the routing as arguments and returns ``(weights fp32, ids int32)``;
   ``fused_moe`` reads ``obj.w13_weight`` / ``obj.w2_weight``. A kernel that covers only some
   routings (e.g. softmax, ungrouped) runs the others with
   ``sglang_fl.dispatch.backends.reference.select_experts`` (see ``vendor/cuda``).

4. Attention (optional): an attention backend is registered by name from ``register_ops.py``
   with ``registry.register_attention_backend(AttentionBackendImpl(...))``; see
   ``attention.py``, and ``attention_backend: <name>`` in the platform YAML to make it the
   platform's default.

5. Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6): any of the op table's GDN ops (``gdn_gating``,
   ``chunk_gated_delta_rule``, ``recurrent_gated_delta_rule``,
   ``packed_recurrent_gated_delta_rule``, ``causal_conv1d``, ``causal_conv1d_update``,
   ``rms_norm_gated``) is a method like any other: sglang-fl routes SGLang's GDN kernel calls to
   it on every platform (``sglang_glue/gdn.py``). A kernel that takes only some inputs declares
   them with ``@accepts`` (``dispatch/limits.py``), as ``causal_conv1d_update`` below does: a
   call outside them goes to the next implementation in the op's order, logged once.

This folder registers nothing unless a user enables it by name (``SGLANG_FL_ENABLE_VENDORS=
template``; its name is in ``dispatch/discovery.py``'s ``OPT_IN_VENDORS``, so a copy of it is an
ordinary vendor). Enabled, it registers no ops (``is_available()`` is always False) and one
attention backend, ``template_native``, which delegates to SGLang's ``torch_native``.
"""

from __future__ import annotations

from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.limits import accepts


class TemplateBackend(Backend):
    name = "template"

    def is_available(self) -> bool:
        self.unavailable_reason = "template backend is a copy source, never available"
        return False

    # Example op (kept so the copy has a starting point; never registered while unavailable):
    def silu_and_mul(self, obj, x):
        import torch.nn.functional as F

        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    # Example GDN op with a declared input limit (a chip whose conv kernel has no fp32 path):
    @accepts(x=("bfloat16", "float16"), why="example: the kernel has no float32 path")
    def causal_conv1d_update(self, obj, x, conv_state, weight, bias=None, activation=None,
                             conv_state_indices=None):
        from sglang_fl.dispatch.backends.reference_gdn import causal_conv1d_update

        return causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices)
