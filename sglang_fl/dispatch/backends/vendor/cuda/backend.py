"""NVIDIA: SGLang's own CUDA kernels (sgl_kernel; RoPE from sglang.jit_kernel; the fused MoE
from SGLang's Triton ``fused_experts``)."""

from __future__ import annotations

from sglang_fl.dispatch.backends import Backend, load_real_module, real_module_available
from sglang_fl.dispatch.backends.reference import select_experts


class CudaBackend(Backend):
    name = "cuda"

    def is_available(self) -> bool:
        import torch

        if not torch.cuda.is_available():
            self.unavailable_reason = "no CUDA device"
            return False
        # (With a flashinfer stand-in, sglang_fl.compat keeps sgl_kernel on its own norm kernels.)
        self._sk = load_real_module(self, "sgl_kernel")
        return self._sk is not None

    def implemented_ops(self) -> tuple[str, ...]:
        ops = ("silu_and_mul", "rms_norm", "gemma_rms_norm", "topk")
        # The RoPE kernel and the SiLU-and-mul inside SGLang's fused MoE are JIT-compiled through
        # apache-tvm-ffi; only offer them when that is real.
        if real_module_available("tvm_ffi")[0]:
            ops += ("rotary_embedding", "fused_moe")
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
            cos_sin_cache=_cos_sin_cache(obj, cos), is_neox=not rotary_interleaved,
        )
        return query, key


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

        # filter_expert: ids of experts other expert-parallel ranks hold (-1) add nothing.
        return outplace_fused_experts(hidden_states, obj.w13_weight, obj.w2_weight, topk_weights,
                                      topk_ids, filter_expert=True)


def _cos_sin_cache(obj, cos):
    """SGLang's kernel wants the combined ``[pos, rot_dim]`` cache in fp32 or the query dtype."""
    cache = obj.cos_sin_cache
    return cache if cache.device == cos.device else cache.to(cos.device)
