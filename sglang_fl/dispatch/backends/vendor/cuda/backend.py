"""NVIDIA: SGLang's own kernels, each op offered where its kernel package is real (an "empty"
SGLang install on a GPU may lack sgl_kernel and still have Triton):

- sgl_kernel: ``silu_and_mul``, ``rms_norm``, ``gemma_rms_norm``;
- sgl_kernel and apache-tvm-ffi (``sglang.jit_kernel`` compiles through it): ``rotary_embedding``;
- sgl_kernel: ``topk`` (``topk_softmax`` / ``topk_sigmoid``; the routings they do not cover run
  the reference math on the device);
- sgl_kernel and apache-tvm-ffi: ``fused_moe`` (SGLang's Triton ``fused_experts``, whose
  SiLU-and-mul is JIT-compiled);
- triton: ``mrotary_embedding`` (SGLang's Triton mRoPE kernel).
"""

from __future__ import annotations

import weakref

from sglang_fl.dispatch.backends import Backend, real_module_available
from sglang_fl.dispatch.backends.reference import select_experts

_SGL_KERNEL_OPS = ("silu_and_mul", "rms_norm", "gemma_rms_norm", "topk")


class CudaBackend(Backend):
    name = "cuda"
    _sk = None

    def __init__(self) -> None:
        self._caches: dict[tuple[int, int], tuple] = {}

    def is_available(self) -> bool:
        import torch

        if not torch.cuda.is_available():
            self.unavailable_reason = "no CUDA device"
            return False
        ops = self.implemented_ops()
        if self._sk is None or "rotary_embedding" not in ops or "mrotary_embedding" not in ops:
            self.unavailable_reason = "; ".join(why for ok, why in (
                real_module_available(m) for m in ("sgl_kernel", "tvm_ffi", "triton")) if not ok)
        return bool(ops)

    def implemented_ops(self) -> tuple[str, ...]:
        ops: tuple[str, ...] = ()
        # (With a flashinfer stand-in, sglang_fl.compat keeps sgl_kernel on its own norm kernels.)
        if real_module_available("sgl_kernel")[0]:
            import sgl_kernel

            self._sk = sgl_kernel
            ops += _SGL_KERNEL_OPS
            if real_module_available("tvm_ffi")[0]:
                ops += ("rotary_embedding", "fused_moe")
        if real_module_available("triton")[0]:
            ops += ("mrotary_embedding",)
        return ops

    def silu_and_mul(self, obj, x):
        import torch

        out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
        self._sk.silu_and_mul(x, out)
        return out

    def rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        if residual is not None:
            if post_residual_addition is not None:  # the kernel adds only two inputs (in fp32)
                total, x = self.residual_sum_parts(x, residual, post_residual_addition)
                self._sk.fused_add_rmsnorm(x, total.clone(), obj.weight.data, obj.variance_epsilon)
                return x, total
            self._sk.fused_add_rmsnorm(x, residual, obj.weight.data, obj.variance_epsilon)
            return x, residual
        shape = x.shape
        out = self._sk.rmsnorm(x.reshape(-1, shape[-1]), obj.weight.data, obj.variance_epsilon)
        return out.reshape(shape)

    def gemma_rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        if residual is not None:
            if post_residual_addition is not None:  # in x's dtype, as GemmaRMSNorm.forward_native
                residual = residual + post_residual_addition
            self._sk.gemma_fused_add_rmsnorm(x, residual, obj.weight.data, obj.variance_epsilon)
            return x, residual
        shape = x.shape
        out = self._sk.gemma_rmsnorm(x.reshape(-1, shape[-1]), obj.weight.data, obj.variance_epsilon)
        return out.reshape(shape)

    def rotary_embedding(self, obj, query, key, cos, sin, position_ids,
                         rotary_interleaved=False, inplace=True):
        from sglang.jit_kernel.rope import apply_rope_with_cos_sin_cache_inplace

        tokens = position_ids.numel()
        rot_dim = 2 * cos.shape[-1]
        q = query.view(tokens, -1, obj.head_size)[..., :rot_dim]
        k = key.view(tokens, -1, obj.head_size)[..., :rot_dim]
        if not inplace:
            query, key = query.clone(), key.clone()
            q = query.view(tokens, -1, obj.head_size)[..., :rot_dim]
            k = key.view(tokens, -1, obj.head_size)[..., :rot_dim]
        apply_rope_with_cos_sin_cache_inplace(
            positions=position_ids.view(tokens), q=q, k=k,
            cos_sin_cache=self._cos_sin_cache(cos, sin), is_neox=not rotary_interleaved,
        )
        return query, key

    def mrotary_embedding(self, obj, query, key, cos, sin, positions, mrope_section,
                          mrope_interleaved=False, rotary_interleaved=False, inplace=True):
        from sglang.srt.layers.rotary_embedding.triton_kernels import triton_mrope_fused

        if not inplace:
            query, key = query.clone(), key.clone()
        if positions.ndim == 1:  # text only: one position for all three axes
            positions = positions.expand(3, -1)
        tokens = positions.shape[-1]
        # In place on [tokens, heads * head_size] rows; computes in the cache's dtype (fp32 here).
        triton_mrope_fused(
            query.view(tokens, -1), key.view(tokens, -1), self._cos_sin_cache(cos, sin),
            positions, list(mrope_section), obj.head_size, 2 * cos.shape[-1], mrope_interleaved,
            False, not rotary_interleaved, None,
        )
        return query, key

    def _cos_sin_cache(self, cos, sin):
        """SGLang's RoPE kernels take cos and sin as one ``[positions, rotary_dim]`` cache. The
        op passes the same cos/sin tensors on every call (op table), so each pair is joined once
        and kept while both live."""
        key = (id(cos), id(sin))
        hit = self._caches.get(key)
        if hit is not None and hit[0]() is cos and hit[1]() is sin:
            return hit[2]
        import torch

        self._caches = {k: v for k, v in self._caches.items() if v[0]() is not None}
        joined = torch.cat((cos, sin), dim=-1)
        self._caches[key] = (weakref.ref(cos), weakref.ref(sin), joined)
        return joined

    def topk(self, obj, hidden_states, router_logits, top_k, renormalize=True,
             scoring_func="softmax", correction_bias=None, num_expert_group=None, topk_group=None):
        import torch

        sigmoid = getattr(self._sk, "topk_sigmoid", None)  # newer sgl_kernel only
        softmax = scoring_func == "softmax" and correction_bias is None
        if num_expert_group or not (softmax or (scoring_func == "sigmoid" and sigmoid)):
            # Grouped routing (sgl_kernel's gates fit only some expert counts), or a softmax
            # with a correction bias: the reference math, on the device.
            return select_experts(router_logits, top_k, renormalize=renormalize,
                                  scoring_func=scoring_func, correction_bias=correction_bias,
                                  num_expert_group=num_expert_group, topk_group=topk_group)
        tokens, device = router_logits.shape[0], router_logits.device
        weights = torch.empty(tokens, top_k, dtype=torch.float32, device=device)
        ids = torch.empty(tokens, top_k, dtype=torch.int32, device=device)
        if tokens == 0:
            return weights, ids
        if softmax:  # called as SGLang 0.5.11's fused_topk calls it
            self._sk.topk_softmax(weights, ids, router_logits, renormalize)
        else:
            sigmoid(weights, ids, router_logits, renormalize, correction_bias)
        return weights, ids

    def fused_moe(self, obj, hidden_states, topk_weights, topk_ids):
        from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import outplace_fused_experts

        if hidden_states.shape[0] == 0:  # SGLang's kernel launches an empty grid (CUDA error)
            return hidden_states.new_empty(hidden_states.shape)
        # filter_expert: ids of experts other expert-parallel ranks hold (-1) add nothing.
        return outplace_fused_experts(hidden_states, obj.w13_weight, obj.w2_weight, topk_weights,
                                      topk_ids, filter_expert=True)

