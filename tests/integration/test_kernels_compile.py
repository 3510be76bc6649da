"""sglang-fl's own Triton kernels (RoPE, SiLU-and-mul, RMSNorm, GDN decode, GDN q/k) compile for
NVIDIA GPUs, checked on this CPU: Triton's compiler lowers each kernel to PTX and assembles it
with the ptxas its wheel ships, for Hopper (sm_90, the H100/H200 the project measures on) and
Ampere (sm_80), with the meta-parameters the launchers really use. The interpreter tests
(test_rope_kernel.py, test_silu_mul_kernel.py, test_rms_norm_kernel.py, test_gdn_decode_kernel.py,
test_gdn_qk_kernel.py) check what the kernels compute; only a compile finds what the interpreter
lets through, such as a branch whose two sides have different types (how SGLang's own conv1d
kernel failed on the H100 on 2026-12-05), and finding it here costs no device time."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sglang_fl.kernels import gdn_decode, gdn_qk, rms_norm, rope, silu_mul  # noqa: E402

try:
    from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402

    get_ptxas(90)
except Exception as exc:  # noqa: BLE001 - a Triton without its NVIDIA backend or ptxas
    pytest.skip(f"Triton's NVIDIA backend cannot assemble here: {exc}", allow_module_level=True)

TARGETS = {"sm90": GPUTarget("cuda", 90, 32), "sm80": GPUTarget("cuda", 80, 32)}
TRITON_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def compile_kernel(fn, pointers: dict, constexprs: dict, num_warps: int, target: str,
                   floats=()):
    """``fn`` compiled for ``target``: ``pointers`` names each pointer argument's element type,
    ``floats`` the fp32 scalars; every other argument not in ``constexprs`` is an i32 (the
    launchers pass Python ints)."""
    names = list(fn.arg_names)
    signature = {n: ("constexpr" if n in constexprs else f"*{pointers[n]}" if n in pointers
                     else "fp32" if n in floats else "i32") for n in names}
    src = ASTSource(fn=fn, signature=signature,
                    constexprs={(names.index(n),): v for n, v in constexprs.items()})
    return triton.compile(src, target=TARGETS[target], options={"num_warps": num_warps})


@pytest.mark.parametrize("target", ["sm90", "sm80"])
@pytest.mark.parametrize(("dtype", "head_size", "rotary_dim", "interleaved"), [
    ("bfloat16", 64, 64, False),   # Qwen2.5-0.5B
    ("bfloat16", 128, 128, True),  # GPT-J-style pairs
    ("float16", 256, 64, False),   # Qwen3.6's partial rotary (a quarter of 256)
    ("float32", 128, 128, False),
])
def test_rope_kernel_compiles(target, dtype, head_size, rotary_dim, interleaved):
    half = rotary_dim // 2
    _, meta = rope._geometry(half, head_size, interleaved, (4096, half), (4096, half))
    meta = dict(meta)
    warps = meta.pop("num_warps")
    t = TRITON_TYPES[dtype]
    pointers = {"q_ptr": t, "k_ptr": t, "cos_ptr": "fp32", "sin_ptr": "fp32", "pos_ptr": "i64"}
    kernel = compile_kernel(rope._kernel(), pointers, meta, warps, target)
    assert kernel.asm["cubin"], "no cubin"


@pytest.mark.parametrize("target", ["sm90", "sm80"])
@pytest.mark.parametrize(("dtype", "d"), [("bfloat16", 4864), ("float16", 512), ("float32", 17)])
def test_silu_and_mul_kernel_compiles(target, dtype, d):
    _, meta = silu_mul._geometry(d)
    meta = dict(meta)
    warps = meta.pop("num_warps")
    t = TRITON_TYPES[dtype]
    kernel = compile_kernel(silu_mul._kernel(), {"x_ptr": t, "out_ptr": t}, meta, warps, target)
    assert kernel.asm["cubin"], "no cubin"


@pytest.mark.parametrize("target", ["sm90", "sm80"])
@pytest.mark.parametrize(("dtype", "weight", "n", "residual", "post", "gemma"), [
    ("bfloat16", "bf16", 5120, True, False, True),    # Qwen3.6-27B's hidden, with the residual
    ("bfloat16", "bf16", 256, False, False, True),    # its q/k norms over a head
    ("bfloat16", "bf16", 896, True, False, False),    # Qwen2.5-0.5B's fused add-RMSNorm
    ("bfloat16", "bf16", 896, False, False, False),   # its first layer's plain norm
    ("float16", "fp32", 2048, True, True, False),     # with a post-residual addition
    ("float32", "fp32", 40, False, False, True),
])
def test_rms_norm_kernel_compiles(target, dtype, weight, n, residual, post, gemma):
    meta = dict(rms_norm._meta(n, residual, post, gemma))
    warps = meta.pop("num_warps")
    t = TRITON_TYPES[dtype]
    pointers = {"x_ptr": t, "res_ptr": t, "post_ptr": t, "w_ptr": weight, "out_ptr": t,
                "res_out_ptr": t}
    kernel = compile_kernel(rms_norm._kernel(), pointers, meta, warps, target, floats=("eps",))
    assert kernel.asm["cubin"], "no cubin"


@pytest.mark.parametrize("target", ["sm90", "sm80"])
@pytest.mark.parametrize(("dtype", "pool", "index", "group", "dk", "dv", "l2norm"), [
    ("bfloat16", "fp32", "i32", 3, 128, 128, True),   # Qwen3.6-27B: 16 key / 48 value heads
    ("bfloat16", "bf16", "i64", 2, 128, 128, True),   # 35B-A3B's 16 / 32, a bf16 pool
    ("float32", "fp32", "i32", 1, 24, 48, False),     # sizes off the blocks, no l2 norm
])
def test_gdn_decode_kernel_compiles(target, dtype, pool, index, group, dk, dv, l2norm):
    t = TRITON_TYPES[dtype]
    pointers = {"q_ptr": t, "k_ptr": t, "v_ptr": t, "a_ptr": t, "b_ptr": t, "a_log_ptr": "fp32",
                "dt_bias_ptr": "fp32", "state_ptr": pool, "index_ptr": index, "cu_ptr": "i32",
                "out_ptr": t}
    bk, bv = gdn_decode.next_power_of_2(dk), min(gdn_decode._BV, gdn_decode.next_power_of_2(dv))
    kernel = compile_kernel(gdn_decode._kernel(), pointers,
                            {"GROUP": group, "K": dk, "V": dv, "BK": bk, "BV": bv,
                             "L2NORM": l2norm}, 4, target,
                            floats=("scale", "softplus_beta", "softplus_threshold"))
    assert kernel.asm["cubin"], "no cubin"


@pytest.mark.parametrize("target", ["sm90", "sm80"])
@pytest.mark.parametrize(("dtype", "heads", "dim", "group", "l2norm"), [
    ("bfloat16", 16, 128, 3, True),   # Qwen3.6-27B: 16 key heads of 128 -> 48 value heads
    ("bfloat16", 16, 128, 2, True),   # 35B-A3B: -> 32
    ("float32", 5, 24, 1, False),     # sizes off the blocks, no l2 norm (the fp32 prefill)
])
def test_gdn_qk_kernel_compiles(target, dtype, heads, dim, group, l2norm):
    _, meta = gdn_qk._geometry(heads, dim, group, l2norm)
    meta = dict(meta)
    warps = meta.pop("num_warps")
    t = TRITON_TYPES[dtype]
    kernel = compile_kernel(gdn_qk._kernel(), {"x_ptr": t, "out_ptr": t}, meta, warps, target,
                            floats=("eps",))
    assert kernel.asm["cubin"], "no cubin"
