"""The fused CPU kernels of SGLang's Qwen3.5/3.6 model module, for empty mode.

From SGLang 0.5.23 on, ``models/qwen3_5.py`` binds four ``torch.ops.sgl_kernel.*_cpu`` ops at
import when running on CPU (without them SGLang skips the model). The compat layer defines them
as ``torch.library`` ops (ledger entry ``ops:sgl_kernel-gdn-cpu``) with the implementations
below, written as SGLang's non-fused code path computes the same values:

- ``fused_qk_gemma_rmsnorm_cpu`` / ``_with_gate_cpu``: the per-head q/k Gemma RMSNorms (through
  sglang-fl's ``gemma_rms_norm`` op, as the routed ``GemmaRMSNorm`` layers would run them);
- ``fused_sigmoid_mul_cpu``: the attention output gate, ``x *= sigmoid(gate)``;
- ``fused_qkvzba_split_reshape_cat_contiguous_cpu``: the split of the GDN input projections
  (``Qwen3_5GatedDeltaNet.fix_query_key_value_ordering`` + the concatenation of q, k, v).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

SCHEMAS = {
    "fused_sigmoid_mul_cpu": "fused_sigmoid_mul_cpu(Tensor(a!) x, Tensor gate) -> ()",
    "fused_qk_gemma_rmsnorm_cpu": (
        "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, "
        "float eps, int head_dim) -> (Tensor, Tensor)"),
    "fused_qk_gemma_rmsnorm_with_gate_cpu": (
        "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, "
        "Tensor k_weight, float eps, int head_dim, int num_heads) -> (Tensor, Tensor, Tensor)"),
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": (
        "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor qkvz, Tensor ba, int num_k_heads, "
        "int num_v_heads, int head_k_dim, int head_v_dim) -> (Tensor, Tensor, Tensor, Tensor)"),
}


def _gemma_call(norm, x):
    from sglang_fl.sglang_glue.gdn import _slot

    slot = _slot("gemma_rms_norm", "fused_qk_gemma_rmsnorm_cpu")
    try:
        return slot.fn(norm, x)
    except Exception as exc:  # noqa: BLE001 - non-strict fallback to the next impl
        return slot.call_after_failure(exc, norm, x)


def fused_sigmoid_mul_cpu(x, gate):
    x.mul_(gate.sigmoid().reshape(x.shape))


def fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim):
    q_out = _gemma_call(SimpleNamespace(weight=q_weight, variance_epsilon=eps),
                        q.reshape(-1, head_dim).contiguous())
    k_out = _gemma_call(SimpleNamespace(weight=k_weight, variance_epsilon=eps),
                        k.reshape(-1, head_dim).contiguous())
    return q_out, k_out


def fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, q_weight, k_weight, eps, head_dim, num_heads):
    tokens = q_gate.shape[0]
    q, gate = q_gate.reshape(tokens, num_heads, 2 * head_dim).chunk(2, dim=-1)
    q_out, k_out = fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim)
    return q_out, k_out, gate.contiguous()


def fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, num_k_heads, num_v_heads,
                                                  head_k_dim, head_v_dim):
    key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
    if qkvz.shape[-1] != 2 * key_dim + 2 * value_dim or ba.shape[-1] != 2 * num_v_heads:
        raise ValueError(f"qkvz [T, {2 * key_dim + 2 * value_dim}] and ba [T, {2 * num_v_heads}] "
                         f"expected; got {tuple(qkvz.shape)}, {tuple(ba.shape)}")
    q, k, v, z = qkvz.split([key_dim, key_dim, value_dim, value_dim], dim=-1)
    b, a = ba.split([num_v_heads, num_v_heads], dim=-1)
    mixed_qkv = torch.cat((q, k, v), dim=-1)
    return (mixed_qkv, z.reshape(z.shape[0], num_v_heads, head_v_dim).contiguous(),
            b.contiguous(), a.contiguous())


TORCH_OPS = {
    "fused_sigmoid_mul_cpu": fused_sigmoid_mul_cpu,
    "fused_qk_gemma_rmsnorm_cpu": fused_qk_gemma_rmsnorm_cpu,
    "fused_qk_gemma_rmsnorm_with_gate_cpu": fused_qk_gemma_rmsnorm_with_gate_cpu,
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": fused_qkvzba_split_reshape_cat_contiguous_cpu,
}
