"""NVIDIA: SGLang's own kernels, each op offered where its kernel package is real (an "empty"
SGLang install on a GPU may lack sgl_kernel and still have Triton):

- sgl_kernel: ``silu_and_mul``, ``rms_norm``, ``gemma_rms_norm``;
- sgl_kernel and apache-tvm-ffi (SGLang's JIT kernels compile through it): ``rotary_embedding``;
- sgl_kernel: ``topk`` (``topk_softmax`` / ``topk_sigmoid``; the routings they do not cover run
  the reference math on the device);
- sgl_kernel and apache-tvm-ffi: ``fused_moe`` (SGLang's Triton ``fused_experts``, whose
  SiLU-and-mul is JIT-compiled);
- triton: ``mrotary_embedding`` (SGLang's Triton mRoPE kernel);
- triton: the Gated DeltaNet ops (SGLang's FLA Triton kernels: chunked, fused-recurrent and
  packed-decode gated delta rule, GDN gating, gated RMSNorm; its Triton causal conv1d).

Where each SGLang kernel lives depends on the SGLang version: the adapter's ``KERNELS``.
"""

from __future__ import annotations

import weakref

from sglang_fl.dispatch.backends import Backend, real_module_available
from sglang_fl.dispatch.backends.reference import select_experts
from sglang_fl.dispatch.limits import accepts


def _sglang_kernel(name: str):
    from sglang_fl.sglang_glue.adapters import get_adapter

    return get_adapter().kernel(name)


_SGL_KERNEL_OPS = ("silu_and_mul", "rms_norm", "gemma_rms_norm", "topk")
_GDN_OPS = ("gdn_gating", "chunk_gated_delta_rule", "recurrent_gated_delta_rule",
            "packed_recurrent_gated_delta_rule", "causal_conv1d", "causal_conv1d_update",
            "rms_norm_gated")


class CudaBackend(Backend):
    name = "cuda"
    _sk = None

    def __init__(self) -> None:
        self._caches: dict[tuple[int, int], tuple] = {}
        self._kernels: dict[str, object] = {}

    def _kernel(self, name: str):
        """SGLang's kernel ``name``, resolved on its first use and kept: resolving the dotted
        path costs about 3 µs per call, which an eager prefill would pay per layer and op."""
        fn = self._kernels.get(name)
        if fn is None:
            fn = self._kernels[name] = _sglang_kernel(name)
        return fn

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
            ops += ("mrotary_embedding", *_GDN_OPS)
        return ops

    # -- Gated DeltaNet: SGLang's Triton kernels ----------------------------------------------
    def gdn_gating(self, obj, A_log, a, b, dt_bias, softplus_beta=1.0, softplus_threshold=20.0):  # noqa: N803
        return self._kernel("fused_gdn_gating")(A_log, a, b, dt_bias, softplus_beta,
                                                softplus_threshold)

    @accepts(q=("bfloat16", "float16"),
             why="SGLang's FLA chunk kernel asserts 'does not support float32'")
    def chunk_gated_delta_rule(self, obj, q, k, v, g, beta, initial_state, cu_seqlens, scale=None,
                               use_qk_l2norm=True):
        import torch

        # SGLang's kernel updates a state pool in place (slots given by index): the sequences'
        # initial states form a pool of their own, which then holds the final states.
        n = cu_seqlens.numel() - 1
        shape = (n, v.shape[2], v.shape[3], k.shape[3])
        pool = (initial_state.to(torch.float32).clone() if initial_state is not None
                else torch.zeros(shape, dtype=torch.float32, device=v.device))
        out, _, _ = self._kernel("chunk_gated_delta_rule")(
            q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=pool,
            initial_state_indices=torch.arange(n, dtype=torch.int32, device=v.device),
            cu_seqlens=cu_seqlens.to(torch.int64), head_first=False,
            use_qk_l2norm_in_kernel=use_qk_l2norm)
        return out, pool

    def recurrent_gated_delta_rule(self, obj, q, k, v, a, b, A_log, dt_bias, state, state_indices,  # noqa: N803
                                   cu_seqlens, scale=None, use_qk_l2norm=True, softplus_beta=1.0,
                                   softplus_threshold=20.0):
        return self._kernel("fused_sigmoid_gating_delta_rule_update")(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=state,
            initial_state_indices=state_indices, cu_seqlens=cu_seqlens, scale=scale,
            use_qk_l2norm_in_kernel=use_qk_l2norm, softplus_beta=softplus_beta,
            softplus_threshold=softplus_threshold)

    def packed_recurrent_gated_delta_rule(self, obj, mixed_qkv, a, b, A_log, dt_bias, state,  # noqa: N803
                                          state_indices, scale=None, use_qk_l2norm=True):
        hv, dv, dk = state.shape[-3:]
        rows = mixed_qkv.shape[0]
        out = mixed_qkv.new_empty(rows, 1, hv, dv)
        self._kernel("fused_recurrent_gated_delta_rule_packed_decode")(
            mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
            scale=dk ** -0.5 if scale is None else scale, initial_state=state, out=out,
            ssm_state_indices=state_indices, use_qk_l2norm_in_kernel=use_qk_l2norm)
        return out.transpose(0, 1)

    def causal_conv1d(self, obj, x, weight, bias, conv_states, query_start_loc, cache_indices,
                      has_initial_state, activation="silu", seq_lens_cpu=None):
        # SGLang's kernel takes the lengths on the host: the caller's, else a sync to read them.
        seq_lens = (list(seq_lens_cpu) if seq_lens_cpu is not None
                    else query_start_loc.diff().tolist())
        return self._kernel("causal_conv1d_fn")(
            x, weight, bias, conv_states=conv_states, query_start_loc=query_start_loc,
            seq_lens_cpu=seq_lens, cache_indices=cache_indices,
            has_initial_state=has_initial_state, activation=activation)

    def causal_conv1d_update(self, obj, x, conv_state, weight, bias=None, activation=None,
                             conv_state_indices=None):
        return self._kernel("causal_conv1d_update")(x, conv_state, weight, bias, activation,
                                                    conv_state_indices=conv_state_indices)

    def rms_norm_gated(self, obj, x, z, eps, group_size=None, norm_before_gate=True):
        return self._kernel("rms_norm_gated")(
            x=x, weight=obj.weight, bias=None, z=z, eps=eps, group_size=group_size,
            norm_before_gate=norm_before_gate, is_rms_norm=True)

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
        apply_rope_with_cos_sin_cache_inplace = self._kernel("apply_rope_with_cos_sin_cache_inplace")

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
        triton_mrope_fused = self._kernel("triton_mrope_fused")

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
        outplace_fused_experts = self._kernel("outplace_fused_experts")

        if hidden_states.shape[0] == 0:  # SGLang's kernel launches an empty grid (CUDA error)
            return hidden_states.new_empty(hidden_states.shape)
        return outplace_fused_experts(hidden_states, obj.w13_weight, obj.w2_weight, topk_weights,
                                      topk_ids, filter_expert=_filters_experts(obj))


def _filters_experts(layer) -> bool:
    """Whether the kernel must skip the -1 ids of experts other expert-parallel ranks hold: as
    SGLang's own runner decides (``num_experts != num_local_experts``). Without expert
    parallelism SGLang runs the unfiltered kernels (plain SiLU-and-mul, no per-block id check),
    so filtering there would serve another path than SGLang's own; a layer that does not say
    is filtered (always correct)."""
    cfg = getattr(layer, "moe_runner_config", None)
    experts = getattr(cfg, "num_experts", None)
    return experts is None or experts != getattr(cfg, "num_local_experts", None)
