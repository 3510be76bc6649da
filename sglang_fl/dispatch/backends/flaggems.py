"""FlagGems (kind ``flagos``): Triton kernels, available when ``flag_gems`` imports and finds a
device it supports.

MoE: ``topk`` runs ``topk_softmax`` (softmax, ungrouped, no bias) or ``grouped_topk`` (sigmoid,
or a correction bias, grouped or not); grouped routing without a bias scores groups differently
from ``grouped_topk`` and runs the reference math on the device. ``fused_moe`` is
``fused_experts_impl`` (moe_align_block_size, the fused-MoE GEMM kernel, SiLU-and-mul,
moe_sum).

Gated DeltaNet: ``chunk_gated_delta_rule`` runs FlagGems' FLA kernels
(``chunk_gated_delta_rule_fwd``; in float32 ``fused_recurrent_gated_delta_rule_fwd``), which
keep states as ``[.., K, V]`` (the op's are ``[.., V, K]``) and take normalised q/k with as many
heads as v (formed in one pass by sglang-fl's ``sglang_fl.kernels.gdn_qk``). The decode ops
(``recurrent_gated_delta_rule``, and the packed decode, split into it) are sglang-fl's own
kernel (``sglang_fl.kernels.gdn_decode``), in place on the ``[V, K]`` pool: through FlagGems'
kernel they needed a gather, two transposes and a scatter of every state, 20x SGLang's kernel.
FlagGems has no GDN gating, causal conv1d or gated RMSNorm (those ops are not registered
here).

RoPE: out of place is FlagGems' ``apply_rotary_pos_emb``; in place (what SGLang calls) is
sglang-fl's own kernel (``sglang_fl.kernels.rope``), because FlagGems' in-place one races.
``mrotary_embedding`` is not registered: FlagGems has no mRoPE.

SiLU-and-mul on a device is sglang-fl's own kernel (``sglang_fl.kernels.silu_mul``): FlagGems'
costs ~145 us of launch per eager call (H100), the largest FlagGems-only gap in eager prefill.
So are RMSNorm and the Gemma norm (``sglang_fl.kernels.rms_norm``): FlagGems' norms cost
114-130 us of host time per eager call (H100), and FlagGems has no Gemma norm (forming
``1 + weight`` per call cost two extra kernels per norm).
"""

from __future__ import annotations

from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.backends.reference import select_experts
from sglang_fl.dispatch.types import BackendImplKind
from sglang_fl.kernels import gdn_decode, gdn_qk, silu_mul
from sglang_fl.kernels import rms_norm as norms


def ensure_triton_allocator(device: str) -> None:
    """Give Triton a workspace allocator on ``device`` where none is set.

    FlagGems' chunked GDN kernel asks Triton for scratch memory at launch (TMA descriptors),
    which fails without an allocator ("no allocator was set"); SGLang sets one the same way for
    its own TMA kernels, lazily. Triton keeps it in a ContextVar, so it is per thread: set once
    when the backend starts, and checked (one ``ContextVar.get``) by the methods that need it,
    for a forward run on another thread."""
    try:
        from triton.runtime import _allocation
    except ImportError:
        return
    if _allocation._allocator.get() is not _allocation._NULL_ALLOCATOR:
        return
    import torch
    import triton

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(alloc)


#: The most tokens one call of FlagGems' fused recurrent GDN kernel gets (`FlagGemsBackend._recurrent`).
RECURRENT_WINDOW = 64


class FlagGemsBackend(Backend):
    name = "flagos"
    kind = BackendImplKind.FLAGOS

    def __init__(self) -> None:
        self._gems = None
        self._device = "cpu"
        self._cu_memo = (None, None, None)  # `_int64_cu`: (source, its version, int64 copy)

    def is_available(self) -> bool:
        try:
            import flag_gems
        except Exception as exc:  # noqa: BLE001 - FlagGems raises RuntimeError without a device
            self.unavailable_reason = f"import flag_gems failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
            return False
        self._gems = flag_gems
        self._device = str(getattr(flag_gems, "device", "cuda"))
        if self._device != "cpu":
            ensure_triton_allocator(self._device)
        return True

    def silu_and_mul(self, obj, x):
        if silu_mul.supports(x):
            # FlagGems 5.0.2's costs ~145 us of launch per eager call and runs at 0.4-0.8x:
            # sglang-fl's own Triton kernel (sglang_fl/kernels/silu_mul.py) reads the fused row.
            return silu_mul.silu_and_mul(x)
        d = x.shape[-1] // 2
        return self._gems.silu_and_mul(x[..., :d], x[..., d:])

    def rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        shape, weight, eps = [x.shape[-1]], obj.weight, obj.variance_epsilon
        if norms.supports(x, weight, residual, post_residual_addition):
            # FlagGems' norms cost 114-130 us of host time per eager call (H100): sglang-fl's
            # own kernel, one plain launch, adding post_residual_addition itself
            # (sglang_fl/kernels/rms_norm.py).
            return norms.rms_norm(x, weight, eps, residual, post_residual_addition)
        if residual is None:
            return self._gems.rms_norm(x, shape, weight, eps)
        if post_residual_addition is None:  # the kernel adds x + residual in fp32 itself
            return self._gems.fused_add_rms_norm(x, residual, shape, weight, eps)
        total, rest = self.residual_sum_parts(x, residual, post_residual_addition)
        out, _ = self._gems.fused_add_rms_norm(rest, total.clone(), shape, weight, eps)
        return out, total

    def gemma_rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        if residual is not None and post_residual_addition is not None:
            residual = residual + post_residual_addition  # in x's dtype, as forward_native
        if norms.supports(x, obj.weight, residual):
            # FlagGems has no Gemma norm: sglang-fl's own kernel adds the 1 to the weight
            # itself, one launch per norm (sglang_fl/kernels/rms_norm.py).
            return norms.gemma_rms_norm(x, obj.weight, obj.variance_epsilon, residual)
        # Elsewhere FlagGems' plain norm with 1 + weight (in fp32, as forward_native), formed
        # per call since nothing tells us when a weight loader rewrites obj.weight.
        weight = obj.weight.float() + 1.0
        if residual is None:
            return self._gems.rms_norm(x, [x.shape[-1]], weight, obj.variance_epsilon)
        return self._gems.fused_add_rms_norm(x, residual, [x.shape[-1]], weight, obj.variance_epsilon)

    def rotary_embedding(self, obj, query, key, cos, sin, position_ids,
                         rotary_interleaved=False, inplace=True):
        if inplace:
            # FlagGems 5.0.2's in-place kernel races between warps (compat ledger entry
            # ``flaggems:rope-inplace``; tools/repro_flaggems_rope_race.py): sglang-fl's own
            # Triton kernel, race-free by construction, rotates q/k in place instead.
            from sglang_fl.kernels.rope import rotary_embedding_inplace

            return rotary_embedding_inplace(query, key, cos, sin, position_ids, obj.head_size,
                                            rotary_interleaved)
        head_size, rot_dim = obj.head_size, 2 * cos.shape[-1]
        tokens = position_ids.numel()
        q = query.view(tokens, -1, head_size)[..., :rot_dim]
        k = key.view(tokens, -1, head_size)[..., :rot_dim]
        q_out, k_out = self._gems.apply_rotary_pos_emb(
            q, k, cos, sin, position_ids.view(tokens), rotary_interleaved=rotary_interleaved,
            inplace=False,
        )
        if rot_dim == head_size:
            return q_out.reshape(query.shape), k_out.reshape(key.shape)
        import torch

        q_full = torch.cat((q_out, query.view(tokens, -1, head_size)[..., rot_dim:]), -1)
        k_full = torch.cat((k_out, key.view(tokens, -1, head_size)[..., rot_dim:]), -1)
        return q_full.reshape(query.shape), k_full.reshape(key.shape)

    def topk(self, obj, hidden_states, router_logits, top_k, renormalize=True,
             scoring_func="softmax", correction_bias=None, num_expert_group=None, topk_group=None):
        import torch

        tokens, device = router_logits.shape[0], router_logits.device
        if tokens == 0:
            return (torch.empty(0, top_k, dtype=torch.float32, device=device),
                    torch.empty(0, top_k, dtype=torch.int32, device=device))
        if scoring_func == "softmax" and correction_bias is None and not num_expert_group:
            weights = torch.empty(tokens, top_k, dtype=torch.float32, device=device)
            ids = torch.empty(tokens, top_k, dtype=torch.int32, device=device)
            rows = torch.empty_like(ids)  # the kernel's token_expert_indices, unused here
            self._gems.topk_softmax(weights, ids, rows, router_logits, renormalize)
            return weights, ids
        if (num_expert_group and correction_bias is None) or top_k & (top_k - 1):
            # flag_gems.grouped_topk scores a group by its two best experts; grouped routing
            # without a bias (DeepSeek-V2) scores it by its best one. Its kernel also only compiles
            # for a power-of-two top_k (H200: k=6 fails in Triton). Both: the reference math, on
            # device.
            return select_experts(router_logits, top_k, renormalize=renormalize,
                                  scoring_func=scoring_func, correction_bias=correction_bias,
                                  num_expert_group=num_expert_group, topk_group=topk_group)
        # One group of all experts when ungrouped; the kernel's scoring_func 0 takes scores as
        # they are, 1 applies the sigmoid itself. fp32 in, so the bias is not rounded to bf16.
        logits = router_logits.float()
        if scoring_func == "softmax":
            scores, kernel_scoring = logits.softmax(dim=-1), 0
        else:
            scores, kernel_scoring = logits, 1
        bias = (correction_bias.float() if correction_bias is not None
                else torch.zeros(logits.shape[-1], dtype=torch.float32, device=device))
        return self._gems.grouped_topk(scores, num_expert_group or 1, topk_group or 1, top_k,
                                       renormalize, 1.0, bias, kernel_scoring)

    def fused_moe(self, obj, hidden_states, topk_weights, topk_ids):
        import torch

        if hidden_states.shape[0] == 0:
            return torch.empty_like(hidden_states)
        # FlagGems has no "skip this slot" id: an expert of another expert-parallel rank (-1)
        # becomes expert 0 with weight 0.
        foreign = (topk_ids < 0) | (topk_ids >= obj.w13_weight.shape[0])
        topk_ids = topk_ids.masked_fill(foreign, 0)
        topk_weights = topk_weights.masked_fill(foreign, 0.0)
        return self._gems.fused_experts_impl(hidden_states.contiguous(), obj.w13_weight,
                                             obj.w2_weight, topk_weights, topk_ids, inplace=False,
                                             activation="silu")

    # -- Gated DeltaNet ----------------------------------------------------------------------
    @staticmethod
    def _gdn_qk(q, k, hv, use_qk_l2norm):
        """q and k normalised (when ``use_qk_l2norm``) and expanded to the ``hv`` value heads,
        contiguous, as FlagGems' GDN kernels take them: on a device in one pass each
        (sglang_fl/kernels/gdn_qk.py), else in PyTorch."""
        from sglang_fl.dispatch.backends.reference_gdn import L2NORM_EPS, _expand_heads, _l2norm

        if gdn_qk.supports(q, hv) and gdn_qk.supports(k, hv):
            return (gdn_qk.l2norm_expand(q, hv, use_qk_l2norm, L2NORM_EPS),
                    gdn_qk.l2norm_expand(k, hv, use_qk_l2norm, L2NORM_EPS))
        if use_qk_l2norm:
            q, k = _l2norm(q.float()).to(q.dtype), _l2norm(k.float()).to(k.dtype)
        return _expand_heads(q, hv).contiguous(), _expand_heads(k, hv).contiguous()

    def _recurrent(self, q, k, v, g, beta, scale, h, cu_seqlens):
        """FlagGems' fused recurrent kernel over a varlen batch: ``h`` ([N, HV, K, V] float32,
        one row per sequence of ``cu_seqlens``) holds the initial states and receives the final
        ones, in place; returns the output [1, T, HV, V].

        FlagGems 5.0.2 runs a call of more than 64 tokens through another kernel that reads
        and writes states as [V, K], not [K, V] (a silent transpose), and its in-place store
        writes token ``t`` of sequence ``n`` to ``ssm_state_indices[n, t]`` (a 1-D index
        vector is right only for one token per sequence). So the tokens go in windows of at
        most `RECURRENT_WINDOW`, with a [N, window] index of each sequence's own row, the
        state carried from one window to the next; a sequence with no token in a window is
        skipped by the kernel. The window count depends on T only: CUDA graph capture works."""
        import torch

        total, n = q.shape[1], cu_seqlens.numel() - 1
        cu = cu_seqlens.to(torch.int64)
        rows = torch.arange(n, dtype=torch.int32, device=q.device).view(n, 1)
        outs = []
        for t0 in range(0, total, RECURRENT_WINDOW):
            t1 = min(t0 + RECURRENT_WINDOW, total)
            window = slice(t0, t1)
            out, _ = self._gems.fused_recurrent_gated_delta_rule_fwd(
                q[:, window], k[:, window], v[:, window], g[:, window], beta[:, window], scale, h,
                inplace_final_state=True, cu_seqlens=cu if total <= RECURRENT_WINDOW
                else cu.clamp(t0, t1) - t0,
                ssm_state_indices=rows.expand(n, t1 - t0).contiguous())
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def chunk_gated_delta_rule(self, obj, q, k, v, g, beta, initial_state, cu_seqlens, scale=None,
                               use_qk_l2norm=True):
        """bf16/fp16: FlagGems' chunk kernel. float32: its fused recurrent kernel over the whole
        prompt instead, because the chunk kernel's matrix products run in TF32 in float32
        (~1e-3 off, seen on the H200; SGLang's twin refuses float32 for this reason), while the
        recurrent one is element-wise fp32 math: a float32 prefill stays exact on the GPU
        instead of going to the PyTorch reference."""
        import torch

        ensure_triton_allocator(self._device)
        hv = v.shape[2]
        q, k = self._gdn_qk(q, k, hv, use_qk_l2norm)
        scale = k.shape[-1] ** -0.5 if scale is None else scale
        n = cu_seqlens.numel() - 1
        h0 = (initial_state.float().transpose(-1, -2).contiguous() if initial_state is not None
              else torch.zeros(n, hv, k.shape[-1], v.shape[-1], dtype=torch.float32,
                               device=v.device))
        if q.dtype == torch.float32:
            out = self._recurrent(q, k, v.contiguous(), g.float().contiguous(),
                                  beta.float().contiguous(), scale, h0, cu_seqlens)
            return out, h0.transpose(-1, -2).contiguous()
        _, out, _, final, *_ = self._gems.chunk_gated_delta_rule_fwd(
            q, k, v.contiguous(), g.float().contiguous(), beta.contiguous(), scale, h0, True,
            cu_seqlens=self._int64_cu(cu_seqlens))
        return out.to(q.dtype), final.transpose(-1, -2).contiguous()

    def _int64_cu(self, cu_seqlens):
        """``cu_seqlens`` as int64, one tensor for as long as SGLang passes the same one.

        FlagGems' FLA helpers cache the chunk indices they derive from ``cu_seqlens`` on the
        tensor's identity (``flag_gems.fused.FLA.utils.tensor_cache``; deriving them syncs with
        the host and loops over the sequences), and SGLang hands every GDN layer of a forward
        the same int32 ``query_start_loc``. A new int64 copy per call missed that cache in every
        layer: some 450 µs a call at 8,192 tokens (H100, `benchmarks/gdn_prefill_split.py`). The
        copy is remade when the source is another tensor, or was written in place where it keeps
        a version counter. SGLang's inference tensors keep none, so there identity alone decides:
        sound because SGLang makes a new ``query_start_loc`` for every extend forward."""
        import torch

        if cu_seqlens.dtype == torch.int64:
            return cu_seqlens
        try:
            version = cu_seqlens._version
        except RuntimeError:  # an inference tensor keeps no version counter
            version = None
        source, seen, cu = self._cu_memo
        if source is cu_seqlens and seen == version:
            return cu
        cu = cu_seqlens.to(torch.int64)
        self._cu_memo = (cu_seqlens, version, cu)
        return cu

    def recurrent_gated_delta_rule(self, obj, q, k, v, a, b, A_log, dt_bias, state, state_indices,  # noqa: N803
                                   cu_seqlens, scale=None, use_qk_l2norm=True, softplus_beta=1.0,
                                   softplus_threshold=20.0):
        # sglang-fl's own kernel, in place on the [V, K] pool (sglang_fl/kernels/gdn_decode.py:
        # through FlagGems' [K, V] kernel this op was 20x SGLang's on the H100).
        return gdn_decode.recurrent_gated_delta_rule(
            q, k, v, a, b, A_log, dt_bias, state, state_indices, cu_seqlens, scale,
            use_qk_l2norm, softplus_beta, softplus_threshold)

    def packed_recurrent_gated_delta_rule(self, obj, mixed_qkv, a, b, A_log, dt_bias, state,  # noqa: N803
                                          state_indices, scale=None, use_qk_l2norm=True):
        from sglang_fl.dispatch.backends.reference_gdn import split_packed_qkv

        q, k, v, cu = split_packed_qkv(mixed_qkv, state)
        return self.recurrent_gated_delta_rule(obj, q, k, v, a, b, A_log, dt_bias, state,
                                               state_indices, cu, scale, use_qk_l2norm)
