"""The op table: every Layer-2 op, declared once.

Each `OpSpec` in `OPS` says, for one op:

- ``name``: what ``op_backends`` / ``SGLANG_FL_PER_OP``, ``OpImpl.op_name`` and the backend
  method are called;
- ``signature``: the standard signature of every implementation (``obj`` is the layer);
- ``layer_attrs``: the attributes of ``obj`` an implementation may read. Only attributes that
  SGLang's and vLLM's layers share, so an implementation runs unchanged in vllm-plugin-FL;
  whatever else it needs is an argument (the bridge extracts it from the SGLang layer);
- ``contract``: what the signature cannot say (return value, dtype rules, in place or not);
- ``serves``: the names of the SGLang layer classes (fused-op subclasses) routed through the
  op, as users type them in ``SGLANG_FL_OOT_*``; where each class lives in an SGLang version is
  that version's adapter's business (``sglang_glue/adapters``); subclasses that keep the
  forward methods follow their nearest served class;
- ``tolerance``: per output dtype, how close an implementation must come to the reference in
  the numerics tests;
- ``called_as``: for an op that SGLang calls as a function rather than through a layer class
  (the Gated DeltaNet kernels), the SGLang entry points routed to it.

Everything else reads this table: Settings validates op and class names against it, backend
registration checks every implementation against ``signature`` (``verify.py``), the SGLang glue
routes ``serves``, ``sglang-fl ops`` lists the ops, the numerics tests use ``tolerance``.

Adding an op = an entry in `OPS` + its implementations (a method named like the op on each
backend that has a kernel, the reference backend first) + a bridge in
``sglang_glue/bridges.py`` only if SGLang's forward signature is not ``signature`` without
``obj``.

Nothing here imports torch or SGLang at module level.
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

# ---------------------------------------------------------------------------------------------
# Entry types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """``(atol, rtol)`` per output dtype, for ``torch.testing.assert_close``."""

    float32: tuple[float, float]
    float16: tuple[float, float]
    bfloat16: tuple[float, float]

    def for_dtype(self, dtype) -> dict[str, float]:
        """``{"atol": ..., "rtol": ...}`` for a torch dtype (or its name)."""
        atol, rtol = getattr(self, str(dtype).removeprefix("torch."))
        return {"atol": atol, "rtol": rtol}


    def one_rounding_more(self) -> Tolerance:
        """For a kernel that rounds once more than this tolerance allows for (e.g. each product
        of a short dot to the input dtype before the fp32 sum): that rounding's error is as large
        as the one allowed for already, so twice the bounds."""
        return Tolerance(*(tuple(2 * t for t in getattr(self, d))
                           for d in ("float32", "float16", "bfloat16")))


#: One or two roundings to the output dtype and another reduction order than the reference:
#: about two ulps of the output's magnitude (bf16 has 8 significant bits, fp16 11).
ROUNDING = Tolerance(float32=(1e-5, 1e-5), float16=(2e-3, 2e-3), bfloat16=(1.6e-2, 1.6e-2))


@dataclass(frozen=True)
class OpSpec:
    name: str
    signature: str
    layer_attrs: tuple[str, ...]
    contract: str
    serves: tuple[str, ...]
    tolerance: Tolerance = ROUNDING
    #: Trailing parameters an implementation may leave out, and how such an implementation is
    #: wrapped at registration so callers can always pass them (the vendor contract's first
    #: version had ``rms_norm(obj, x, residual=None)``).
    optional: tuple[str, ...] = ()
    adapt_short: Callable[[Callable], Callable] | None = None
    #: For an op SGLang calls as a function, not through a layer class (``serves`` empty): the
    #: SGLang kernel entry points routed to it (``sglang_glue/gdn.py``), for ``sglang-fl ops``.
    called_as: tuple[str, ...] = ()
    #: The parameter whose dimension ``size_dim`` is the token count that picks the op's token
    #: bucket (``op_backends: op@bucket``); default: the first parameter after ``obj``.
    size_arg: str | None = None
    size_dim: int = 0
    #: Tensor parameters an implementation may write into (the contract says so): the custom
    #: op (``custom_ops``) hands the impl copies of them, so the op stays functional.
    mutates: tuple[str, ...] = ()
    #: Custom-op schema types of parameters whose type the default does not tell
    #: (`custom_op_types`): a parameter without default is a Tensor, ``None`` an optional
    #: Tensor, a bool/int/float/str default that type.
    arg_types: tuple[tuple[str, str], ...] = ()
    #: ``fake(obj, *args)`` -> outputs with the right shapes and dtypes, for an op whose
    #: reference implementation cannot run on fake tensors (it reads data, e.g. ``.tolist()``);
    #: others use the reference implementation itself.
    fake: Callable | None = None

    @functools.cached_property
    def parameters(self) -> tuple[inspect.Parameter, ...]:
        return _parse_signature(self.name, self.signature)

    def describe(self) -> str:
        """``rms_norm(obj, x, residual=None, ...)`` as a vendor writes it."""
        return f"{self.name}{self.signature}"

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.serves

    @property
    def size_position(self) -> int:
        """Position of ``size_arg`` among the parameters (``obj`` is 0)."""
        names = [p.name for p in self.parameters]
        return names.index(self.size_arg) if self.size_arg else 1

    def token_count(self, args: tuple, kwargs: dict) -> int | None:
        """The token count of a call with ``args`` (``obj`` first) and ``kwargs``: dimension
        ``size_dim`` of the size argument; None where that argument is absent or has no such
        dimension. What picks a call's token bucket, for layer routes and ``call_op`` alike."""
        index = self.size_position
        x = args[index] if len(args) > index else kwargs.get(self.parameters[index].name)
        shape = getattr(x, "shape", None)
        return None if shape is None or len(shape) <= self.size_dim else shape[self.size_dim]

    def custom_op_types(self) -> tuple[tuple[str, str], ...]:
        """``(parameter, schema type)`` for every parameter after ``obj``."""
        explicit = dict(self.arg_types)
        out = []
        for p in self.parameters[1:]:
            if p.name in explicit:
                out.append((p.name, explicit[p.name]))
                continue
            d = p.default
            if d is inspect.Parameter.empty:
                out.append((p.name, "Tensor"))
            elif d is None:
                out.append((p.name, "Tensor?"))
            elif isinstance(d, bool):
                out.append((p.name, "bool"))
            else:
                types = {int: "int", float: "float", str: "str"}
                if type(d) not in types:
                    raise ValueError(f"op {self.name}: give the schema type of {p.name!r} in arg_types")
                out.append((p.name, types[type(d)]))
        return tuple(out)


def _parse_signature(name: str, text: str) -> tuple[inspect.Parameter, ...]:
    """The parameters of ``def name<text>: ...``; defaults must be literals."""
    fn = ast.parse(f"def {name}{text}: pass").body[0]
    args = fn.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        raise ValueError(f"op {name}: the standard signature takes plain parameters only")
    defaults = [inspect.Parameter.empty] * (len(args.args) - len(args.defaults))
    defaults += [ast.literal_eval(d) for d in args.defaults]
    return tuple(inspect.Parameter(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d)
                 for a, d in zip(args.args, defaults, strict=True))


# ---------------------------------------------------------------------------------------------
# Shared semantics of the norm ops (used by kernels and by the adapters below)
# ---------------------------------------------------------------------------------------------


def residual_sum_parts(x, residual, post_residual_addition):
    """``x + residual + post_residual_addition`` as ``RMSNorm.forward_native`` adds them (each
    cast to fp32, summed left to right), for a fused add-RMSNorm kernel that adds only two
    inputs (in fp32) and so cannot take the third.

    Returns ``(total, rest)`` in x's dtype: ``total`` is the fp32 sum rounded once, exactly the
    residual forward_native returns, and ``rest`` is what that rounding dropped. A kernel given
    ``(rest, total)`` normalises ``float(rest) + float(total)``, the fp32 sum to within rest's
    own rounding. Return ``total`` itself as the residual, not the sum the kernel writes back,
    which can be one ulp off where ``rest`` rounded to exactly half an ulp of ``total`` (a tie).
    """
    import torch

    f32 = torch.float32
    fp32_sum = x.to(f32) + residual.to(f32) + post_residual_addition.to(f32)
    total = fp32_sum.to(x.dtype)
    return total, (fp32_sum - total.to(f32)).to(x.dtype)


def _rms_norm_without_post(fn):
    """An ``rms_norm(obj, x, residual=None)`` given the whole op: the three-way fp32 sum is split
    with `residual_sum_parts`, so the impl's own two-input add reproduces it."""

    @functools.wraps(fn)
    def rms_norm(obj, x, residual=None, post_residual_addition=None):
        if residual is None:
            return fn(obj, x)
        if post_residual_addition is None:
            return fn(obj, x, residual)
        total, rest = residual_sum_parts(x, residual, post_residual_addition)
        out, _ = fn(obj, rest, total.clone())  # the impl may write into its inputs
        return out, total

    return rms_norm


def _gemma_rms_norm_without_post(fn):
    """A ``gemma_rms_norm(obj, x, residual=None)`` given the whole op: GemmaRMSNorm adds
    ``residual + post_residual_addition`` in the input dtype first."""

    @functools.wraps(fn)
    def gemma_rms_norm(obj, x, residual=None, post_residual_addition=None):
        if residual is None:
            return fn(obj, x)
        if post_residual_addition is not None:
            residual = residual + post_residual_addition
        return fn(obj, x, residual)

    return gemma_rms_norm


# ---------------------------------------------------------------------------------------------
# Gated DeltaNet ops (listed in the table below)
# ---------------------------------------------------------------------------------------------


def _without_seq_lens_cpu(fn):
    """A ``causal_conv1d`` written before ``seq_lens_cpu`` (it reads the lengths on the device)."""

    @functools.wraps(fn)
    def causal_conv1d(obj, x, weight, bias, conv_states, query_start_loc, cache_indices,
                      has_initial_state, activation="silu", seq_lens_cpu=None):
        return fn(obj, x, weight, bias, conv_states, query_start_loc, cache_indices,
                  has_initial_state, activation)

    return causal_conv1d


#: A chunked or token-by-token fp32 recurrence over up to a few hundred tokens, against the
#: reference's chunked form: the order of the sums differs, the state is fp32 either way.
GDN_TOLERANCE = Tolerance(float32=(1e-4, 1e-4), float16=(5e-3, 5e-3), bfloat16=(3e-2, 3e-2))

GDN_OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="gdn_gating",
        signature="(obj, A_log, a, b, dt_bias, softplus_beta=1.0, softplus_threshold=20.0)",
        layer_attrs=(),
        contract=(
            "-> (g, beta), both float32 [1, T, HV], for a, b [T, HV] and A_log, dt_bias [HV]: "
            "g = -exp(A_log) * softplus(a + dt_bias) (softplus with beta/threshold as "
            "torch.nn.functional.softplus, in fp32), beta = sigmoid(b) rounded to b's dtype."),
        serves=(),
        called_as=("torch.ops.sgl_kernel.fused_gdn_gating_cpu", "gdn_backend.fused_gdn_gating"),
        tolerance=ROUNDING,
        size_arg="a",  # a [T, HV]; A_log is per head
    ),
    OpSpec(
        name="chunk_gated_delta_rule",
        signature=("(obj, q, k, v, g, beta, initial_state, cu_seqlens, scale=None, "
                   "use_qk_l2norm=True)"),
        layer_attrs=(),
        contract=(
            "Prefill. -> (out [1, T, HV, V] in q's dtype, final_state float32 [N, HV, V, K]) for "
            "q, k [1, T, H, K] (value head i reads key head i // (HV // H)), v [1, T, HV, V], "
            "g, beta [1, T, HV] (gdn_gating's), initial_state [N, HV, V, K] or None (zeros), "
            "cu_seqlens [N + 1]: per sequence and head, with q and k l2-normalised (eps 1e-6 "
            "under the root) when use_qk_l2norm and q scaled by scale (K ** -0.5 when None), "
            "S_t = exp(g_t) S_{t-1} + beta_t (v_t - exp(g_t) S_{t-1} k_t) k_t^T, "
            "out_t = S_t q_t. Inputs are not modified."),
        serves=(),
        called_as=("sgl_kernel.mamba.chunk_gated_delta_rule_cpu", "TritonGDNKernel.extend"),
        tolerance=GDN_TOLERANCE,
        size_dim=1,  # q [1, T, H, K]
    ),
    OpSpec(
        name="recurrent_gated_delta_rule",
        signature=("(obj, q, k, v, a, b, A_log, dt_bias, state, state_indices, cu_seqlens, "
                   "scale=None, use_qk_l2norm=True, softplus_beta=1.0, softplus_threshold=20.0)"),
        layer_attrs=(),
        contract=(
            "Decode (gating fused). -> out [1, T, HV, V] in q's dtype: chunk_gated_delta_rule's "
            "recurrence token by token, with (g, beta) = gdn_gating(A_log, a, b, dt_bias) of "
            "a, b [T, HV], sequence n starting from state[state_indices[n]] (the pool "
            "[slots, HV, V, K]; a negative index starts from zeros and is not written) and "
            "writing its final state there, in place, in the pool's dtype."),
        serves=(),
        called_as=("torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu",
                   "TritonGDNKernel.decode"),
        tolerance=GDN_TOLERANCE,
        size_dim=1,  # q [1, T, H, K]
    ),
    OpSpec(
        name="packed_recurrent_gated_delta_rule",
        signature=("(obj, mixed_qkv, a, b, A_log, dt_bias, state, state_indices, scale=None, "
                   "use_qk_l2norm=True)"),
        layer_attrs=(),
        contract=(
            "Decode of one token per sequence, q/k/v packed. -> out [1, B, HV, V] in "
            "mixed_qkv's dtype: recurrent_gated_delta_rule of the B rows of mixed_qkv "
            "[B, 2 * H * K + HV * V] (each row q | k | v, heads contiguous; HV, V, K from the "
            "pool state [slots, HV, V, K], H from the rest), one token per sequence, a, b "
            "[B, HV], sequence n reading and writing state[state_indices[n]] in place; a "
            "negative index is a padded row: no state read or written, its output unspecified "
            "(SGLang's kernel writes zeros)."),
        serves=(),
        called_as=("TritonGDNKernel.packed_decode",),
        tolerance=GDN_TOLERANCE,
    ),
    OpSpec(
        name="causal_conv1d",
        signature=("(obj, x, weight, bias, conv_states, query_start_loc, cache_indices, "
                   "has_initial_state, activation='silu', seq_lens_cpu=None)"),
        layer_attrs=(),
        contract=(
            "Prefill. -> Tensor [dim, T] in x's dtype for x [dim, T] (channel rows), weight "
            "[dim, width], bias [dim] or None: per sequence n of query_start_loc, the depthwise "
            "causal convolution of its tokens preceded by conv_states[cache_indices[n]] "
            "[dim, width - 1] when has_initial_state[n] (else zeros), then SiLU when "
            "activation is 'silu'/'swish' (None: none). Each slot receives its sequence's last "
            "width - 1 inputs (state included), in place. seq_lens_cpu: the sequences' "
            "lengths as a host list where the caller has them (SGLang does), so that an impl "
            "needing them on the host does not sync on query_start_loc; None: read them there."),
        serves=(),
        called_as=("sgl_kernel.mamba.causal_conv1d_fn_cpu", "gdn_backend.causal_conv1d_fn"),
        optional=("seq_lens_cpu",),
        adapt_short=_without_seq_lens_cpu,
        size_dim=1,  # x [dim, T]
        arg_types=(("seq_lens_cpu", "int[]?"),),
        # SGLang's Triton kernel rounds each tap's product to the input dtype before its fp32
        # sum (H200, bf16: 1 element in 1.1 M past ROUNDING, 0.026 at |out| ~0.5).
        tolerance=ROUNDING.one_rounding_more(),
    ),
    OpSpec(
        name="causal_conv1d_update",
        signature=("(obj, x, conv_state, weight, bias=None, activation=None, "
                   "conv_state_indices=None)"),
        layer_attrs=(),
        contract=(
            "Decode. -> Tensor shaped as x ([B, dim] or [B, dim, L]): causal_conv1d of the L new "
            "tokens of row i continuing the window conv_state[conv_state_indices[i]] (row i's "
            "slot when None), which is shifted in place; a negative index is a padded row "
            "(output zeros, no state touched)."),
        serves=(),
        called_as=("sgl_kernel.mamba.causal_conv1d_update_cpu", "gdn_backend.causal_conv1d_update"),
        tolerance=ROUNDING.one_rounding_more(),  # the same kernel family as causal_conv1d
    ),
    OpSpec(
        name="rms_norm_gated",
        signature="(obj, x, z, eps, group_size=None, norm_before_gate=True)",
        layer_attrs=("weight",),
        contract=(
            "-> Tensor in x's dtype: RMS norm of x over groups of group_size channels (all "
            "when None), in fp32, times obj.weight, times silu(z) (z None: no gate); with "
            "norm_before_gate False the gate multiplies x before the norm. The bridge passes "
            "eps/group_size/norm_before_gate from the layer (RMSNormGated in SGLang, the FLA "
            "layernorm_gated RMSNorm); SiLU gating only."),
        serves=("RMSNormGated",),
        arg_types=(("z", "Tensor?"), ("eps", "float"), ("group_size", "int?")),
    ),
)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="silu_and_mul",
        signature="(obj, x)",
        layer_attrs=(),
        contract="-> Tensor: silu(x[..., :d]) * x[..., d:] with d = x.shape[-1] // 2.",
        serves=("SiluAndMul",),
    ),
    OpSpec(
        name="rms_norm",
        signature="(obj, x, residual=None, post_residual_addition=None)",
        layer_attrs=("weight", "variance_epsilon"),
        contract=(
            "-> Tensor without a residual, else (normed, new_residual): new_residual is "
            "x + residual + post_residual_addition summed in fp32 and rounded once, normed is "
            "that sum normalised and scaled by obj.weight (as RMSNorm.forward_native). "
            "post_residual_addition only comes with a residual. A fused kernel that adds two "
            "inputs gets them from residual_sum_parts(); an impl that leaves "
            "post_residual_addition out is wrapped that way at registration."),
        serves=("RMSNorm",),
        mutates=("x", "residual"),  # fused add-RMSNorm kernels write into both
        optional=("post_residual_addition",),
        adapt_short=_rms_norm_without_post,
    ),
    OpSpec(
        name="gemma_rms_norm",
        signature="(obj, x, residual=None, post_residual_addition=None)",
        layer_attrs=("weight", "variance_epsilon"),
        contract=(
            "As rms_norm, but scaled by (1 + obj.weight) computed in fp32 (obj.weight holds the "
            "checkpoint's Gemma weight in SGLang and vLLM alike) and, as "
            "GemmaRMSNorm.forward_native, the adds are in x's dtype: residual + "
            "post_residual_addition first, then x + that."),
        serves=("GemmaRMSNorm",),
        mutates=("x", "residual"),
        optional=("post_residual_addition",),
        adapt_short=_gemma_rms_norm_without_post,
    ),
    OpSpec(
        name="rotary_embedding",
        signature=("(obj, query, key, cos, sin, position_ids, rotary_interleaved=False, "
                   "inplace=True)"),
        layer_attrs=("head_size",),
        contract=(
            "-> (query, key) rotated: cos/sin are the whole per-position caches "
            "[max_positions, rotary_dim // 2], treated as constant per tensor (the bridge passes "
            "the same ones every call); position_ids [tokens] index them; the first rotary_dim "
            "channels of every head of query [tokens, heads * head_size] and key are rotated "
            "(GPT-J pairs if rotary_interleaved, else NeoX halves); inplace writes into query "
            "and key and returns them."),
        serves=("RotaryEmbedding",),
        mutates=("query", "key"),
    ),
    OpSpec(
        name="mrotary_embedding",
        signature=("(obj, query, key, cos, sin, positions, mrope_section, "
                   "mrope_interleaved=False, rotary_interleaved=False, inplace=True)"),
        layer_attrs=("head_size",),
        contract=(
            "Multimodal RoPE (Qwen2-VL to Qwen3.5/3.6): as rotary_embedding, but positions is "
            "[3, tokens] (temporal, height, width) and rotary pair i (of rotary_dim // 2) takes "
            "cos/sin from one of the three. mrope_section = (t, h, w) pair counts, summing to "
            "rotary_dim // 2: pairs [0, t) from T, [t, t + h) from H, the rest from W; with "
            "mrope_interleaved, pair i from H if i % 3 == 1 and i < 3h, from W if i % 3 == 2 and "
            "i < 3w, else from T. positions of shape [tokens] (text only) serve all three axes."),
        serves=("MRotaryEmbedding",),
        mutates=("query", "key"),
        arg_types=(("mrope_section", "int[]"),),
    ),
    OpSpec(
        name="topk",
        signature=("(obj, hidden_states, router_logits, top_k, renormalize=True, "
                   "scoring_func='softmax', correction_bias=None, num_expert_group=None, "
                   "topk_group=None)"),
        layer_attrs=(),
        contract=(
            "-> (topk_weights float32 [T, top_k], topk_ids int32 [T, top_k]) for router_logits "
            "[T, E] (T may be 0): scores are softmax or sigmoid (scoring_func) of the logits in "
            "fp32; the top_k experts are chosen by scores + correction_bias [E] (when given) and "
            "weighted by their scores alone, divided by the weights' sum if renormalize. With "
            "num_expert_group the E experts form that many equal groups and only the topk_group "
            "best groups compete, a group scoring its best expert without a bias (DeepSeek-V2) "
            "or the sum of its two best biased scores with one (DeepSeek-V3). The order of the "
            "k choices in a row is free. hidden_states [T, H] is there for kernels that take "
            "it. Routing parameters are arguments, not layer attributes: SGLang keeps them in "
            "TopK.topk_config, vLLM on its FusedMoE layer."),
        serves=("TopK",),
        arg_types=(("top_k", "int"), ("num_expert_group", "int?"), ("topk_group", "int?")),
        # Weights are fp32 whatever the logits' dtype; a kernel differs only in its exp/sum
        # order. Ids must be equal (tests use logits without near-ties).
        tolerance=Tolerance(float32=(1e-5, 1e-5), float16=(1e-5, 1e-5), bfloat16=(1e-5, 1e-5)),
    ),
    OpSpec(
        name="fused_moe",
        signature="(obj, hidden_states, topk_weights, topk_ids)",
        layer_attrs=("w13_weight", "w2_weight"),
        contract=(
            "-> Tensor [T, H] in hidden_states' dtype (hidden_states [T, H] is not modified; T "
            "may be 0): the sum over k of topk_weights[t, k] * (obj.w2_weight[e] @ "
            "(silu(g) * u)) with e = topk_ids[t, k] and g, u the two halves of "
            "obj.w13_weight[e] @ x_t (obj.w13_weight [E, 2I, H], gate rows first; "
            "obj.w2_weight [E, H, I]); topk_weights float32 and topk_ids int32, both [T, k]; "
            "an id outside [0, E) (-1: an expert another expert-parallel rank holds) adds "
            "nothing. Unquantized, SiLU-gated, no biases: the bridge keeps SGLang's own "
            "forward for any other expert layer."),
        serves=("UnquantizedFusedMoEMethod",),
        # The reference's expert loop reads the routing on the host: not on fake tensors.
        fake=lambda obj, hidden_states, topk_weights, topk_ids: hidden_states.new_empty(
            hidden_states.shape),
        # Two GEMMs whose [T, k, I] intermediate is rounded to the input dtype, then a k-way
        # sum: several roundings, against an fp32 oracle on the same rounded inputs. The
        # reference's largest error (outputs of std ~0.3, 9 or 128 experts, top-2/8) is 2.4e-7
        # in fp32, 2.5e-3 in fp16 and 1.8e-2 in bf16; an expert mixed up is off by ~0.5.
        tolerance=Tolerance(float32=(1e-4, 1e-4), float16=(5e-3, 5e-3), bfloat16=(3e-2, 3e-2)),
    ),
    # -- Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6 linear attention) ----------------------------
    # Called by SGLang's GDN attention backend as functions, not through a layer class: obj is
    # None, and the glue (sglang_glue/gdn.py) reaches them where SGLang calls its kernels.
    # Variable-length batches: sequences concatenated on the token axis, delimited by
    # cu_seqlens / query_start_loc ([N + 1], from 0); the recurrent state of sequence n is
    # [HV, V, K] (key dimension contiguous), in a pool of slots indexed per sequence.
    *GDN_OPS,
)

OPS_BY_NAME: dict[str, OpSpec] = {spec.name: spec for spec in OPS}
OP_NAMES: tuple[str, ...] = tuple(OPS_BY_NAME)
#: Layer classes a user can name in SGLANG_FL_OOT_WHITELIST / _BLACKLIST.
ROUTED_CLASSES: tuple[str, ...] = tuple(n for spec in OPS for n in spec.class_names)


def op_spec(name: str) -> OpSpec:
    """The entry of op ``name``; an unknown name raises KeyError with the closest op names."""
    try:
        return OPS_BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}{did_you_mean(name)}; ops: {', '.join(OP_NAMES)}") from None


def closest(name: str, choices=OP_NAMES) -> str | None:
    """The name in ``choices`` that ``name`` is most likely a misspelling of, if any."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.8)
    return close[0] if close else None


def did_you_mean(name: str, choices=OP_NAMES) -> str:
    close = closest(name, choices)
    return f" (did you mean {close!r}?)" if close else ""
