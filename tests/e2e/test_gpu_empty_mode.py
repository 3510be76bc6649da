"""Empty mode on an NVIDIA GPU: SGLang without sglang-kernel, flashinfer and apache-tvm-ffi
serves through sglang-fl, and never calls a stand-in: the dense tiny Qwen2, the tiny
Qwen3-MoE whose router and experts run on FlagGems (``topk`` / ``fused_moe`` on flagos), and the
Qwen3.5 hybrids (tiny, and Qwen3.6-27B's layer shapes) whose Gated DeltaNet kernels all go
through sglang-fl's GDN ops.

Runs only on a CUDA host whose SGLang install really lacks those packages (the point of the
test); on CI's CPU machine it skips. Layer 1 is off (``USE_FLAGGEMS=0``) to isolate what this
test is about; the fused ops take the CUDA platform's order (FlagGems first).

Each test starts one server, with SGLang's defaults (radix cache, chunked prefill, CUDA graphs),
so the four can run side by side on one GPU: ``pytest -n 4 tests/e2e/test_gpu_empty_mode.py``
(pytest-xdist; each worker computes its own fixtures). Then `shared_gpu_args` gives each server
a quarter of the memory, and the HF references give theirs back before the servers start.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e_support import (
    MAX_NEW_TOKENS,
    PROMPT_TEXTS,
    SERVER_ARGS,
    dispatch_lines,
    greedy_ids,
    hf_greedy_ids,
    installed,
    made_ahead,
    serve,
    shared_gpu_args,
    standin_calls_in,
)

from sglang_fl.models.hf_reference import (
    ACCEPTED,
    along_start,
    hf_along,
    hf_reference,
    judge,
    judge_along,
)

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")
pytestmark = [pytest.mark.e2e, pytest.mark.gpu]


if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def _sglang_at_least(version) -> bool:
    import importlib.metadata

    parts = importlib.metadata.version("sglang").split(".")[:3]
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts) >= version


# SGLang 0.5.23 needs apache-tvm-ffi for xgrammar (its OpenAI server imports it): there, empty
# mode is without sglang-kernel and flashinfer only.
_ABSENT = ("sglang-kernel", "sgl-kernel", "flashinfer-python") + (
    () if _sglang_at_least((0, 5, 23)) else ("apache-tvm-ffi",))
if any(installed(d) for d in _ABSENT):
    pytest.skip(f"one of {', '.join(_ABSENT)} installed: not an empty install",
                allow_module_level=True)


@pytest.fixture(scope="module")
def hf_ids_cuda(tiny_model, prompt_ids):
    return hf_greedy_ids(tiny_model, prompt_ids, device="cuda")


def test_empty_install_serves_on_cuda(tiny_model, prompt_ids, hf_ids_cuda, tmp_path):
    with serve(tiny_model, tmp_path, args=(*SERVER_ARGS, *shared_gpu_args()),
               USE_FLAGGEMS="0") as srv:
        got = greedy_ids(srv, prompt_ids)
        log = srv.log_text()
    print("served:", got, "\nhf:", hf_ids_cuda, "\ndispatch:", dispatch_lines(tmp_path))
    assert standin_calls_in(log) == []
    assert "attention_backend='triton'" in log and "sampling_backend='pytorch'" in log
    lines = dispatch_lines(tmp_path)
    assert {line.split()[1] for line in lines} == {"RMSNorm", "SiluAndMul", "RotaryEmbedding"}, lines
    # Exact greedy equality with HF over the first tokens; later tokens may part on float
    # reduction order (different attention kernels), which is not what this test is about.
    assert [ids[:8] for ids in got] == [ids[:8] for ids in hf_ids_cuda]


def test_empty_install_serves_moe_on_cuda_with_flaggems(moe_model, moe_prompt_ids, tmp_path):
    """No sgl_kernel: TopK and FusedMoE's experts on FlagGems, with CUDA graphs (SGLang's GPU
    default), against HF transformers on the same GPU."""
    # FlagGems' fp32 expert GEMMs run in TF32 (Triton's default for fp32 dots), HF in full
    # fp32: its reference measures what TF32 rounding moves (the tf32 witness).
    ref = hf_reference(moe_model, moe_prompt_ids, 8, device="cuda", witness="tf32")
    with serve(moe_model, tmp_path, args=(*SERVER_ARGS, *shared_gpu_args()),
               USE_FLAGGEMS="0") as srv:
        got = greedy_ids(srv, moe_prompt_ids)
        log = srv.log_text()
    lines = dispatch_lines(tmp_path)
    print("served:", got, "\nhf:", [r["ids"] for r in ref], "\ndispatch:", lines)
    assert standin_calls_in(log) == []
    assert not [line for line in lines if "left to SGLang" in line], lines
    assert "[OOT-DISPATCH] TopK → flagos(flagos)" in lines, lines
    assert "[OOT-DISPATCH] UnquantizedFusedMoEMethod → flagos(flagos)" in lines, lines
    _check_near_ties(got, ref, moe_model, moe_prompt_ids)


def _check_near_ties(got, ref, model, prompts):
    """Greedy ids equal HF's over the reference's steps, or part where HF's own top logits are
    within the rounding its witness measured there (sglang_fl/models/hf_reference.py); past a
    parting, every later step is judged so along the served ids (`judge_along`)."""
    verdicts = [judge(g, r) for g, r in zip(got, ref, strict=True)]
    assert not [v for v in verdicts if v["verdict"] not in ACCEPTED], verdicts
    cut = [g[:len(r["ids"])] for g, r in zip(got, ref, strict=True)]  # the steps HF has
    later = [(p, g, start) for p, g, v in zip(prompts, cut, verdicts, strict=True)
             if (start := along_start(v["step"], len(g))) is not None]
    if later:
        along = hf_along(model, [(p, g) for p, g, _ in later], device="cuda", witness="tf32")
        bad = [d for (_, g, start), a in zip(later, along, strict=True)
               for d in judge_along(g, a, start) if d["verdict"] not in ACCEPTED]
        assert not bad, bad


#: SGLang's GDN kernel entry points on a GPU (ledger route:gdn-kernels); the decode one is
#: packed_decode where SGLang's kernel class offers it, else decode.
GDN_ENTRIES = ("TritonGDNKernel.extend", "gdn_backend.fused_gdn_gating",
               "gdn_backend.causal_conv1d_fn", "gdn_backend.causal_conv1d_update")


def _check_gdn_routed(lines, name):
    """Every GDN entry point reached the dispatch (0.5.23's default extra-buffer mamba cache
    included: its prefix snapshots come from the routed extend), none was left to SGLang, and
    none fell to the PyTorch reference (a 100x slower path on a GPU). The routes are kept under
    $OUT/dispatch-routes/ so that a passing run shows them too."""
    if os.environ.get("OUT"):
        keep = Path(os.environ["OUT"]) / "dispatch-routes" / f"{name}.txt"
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.write_text("\n".join(lines) + "\n", encoding="utf-8")
    reference = [line for line in lines if "→ reference" in line]
    assert not reference, f"GDN calls on the PyTorch reference: {reference}"
    entries = {line.split()[1] for line in lines}
    missing = [e for e in GDN_ENTRIES if e not in entries]
    assert not missing, f"GDN entry points that never reached the dispatch: {missing}\n{lines}"
    assert entries & {"TritonGDNKernel.packed_decode", "TritonGDNKernel.decode"}, lines
    left = [line for line in lines if "left to SGLang" in line]
    assert not left, left


def test_empty_install_serves_a_hybrid_with_every_gdn_op_through_the_dispatch(tmp_path_factory,
                                                                              tmp_path):
    """The tiny Qwen3.5 (Gated DeltaNet + gated attention): served on the GPU with decode CUDA
    graphs, every GDN kernel call goes through sglang-fl's ops (no stand-in), and the greedy ids
    equal HF's on the same GPU away from near-ties."""
    from transformers import AutoTokenizer

    from sglang_fl.models import make_tiny_model

    model = make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen3.5", preset="qwen3.5")
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(t)["input_ids"] for t in PROMPT_TEXTS]
    ref = hf_reference(model, prompts, 8, device="cuda", witness="tf32")
    with serve(model, tmp_path, args=(*SERVER_ARGS, *shared_gpu_args(hybrid=True)),
               USE_FLAGGEMS="0") as srv:
        got = greedy_ids(srv, prompts)
        log = srv.log_text()
    lines = dispatch_lines(tmp_path)
    print("served:", got, "\nhf:", [r["ids"] for r in ref], "\ndispatch:", lines)
    assert standin_calls_in(log) == []
    _check_gdn_routed(lines, "tiny-hybrid")
    _check_near_ties(got, ref, model, prompts)


def test_empty_install_serves_the_27b_shaped_hybrid(tmp_path_factory, tmp_path):
    """Qwen3.6-27B's real layer shapes (4 of its layers, bf16, random weights): serves in empty
    mode with the GDN core on sglang-fl's ops and no stand-in called."""
    # 4 of its layers (3 GDN, 1 gated attention) and a 32k vocabulary keep the checkpoint
    # small; the layers are the real model's. The GPU verify writes it ahead (`made_ahead`).
    model = made_ahead("qwen3.6-27b-4l", tmp_path_factory)
    with serve(model, tmp_path, timeout=400,
               args=("--dtype", "bfloat16", *shared_gpu_args(hybrid=True)), USE_FLAGGEMS="0") as srv:
        got = greedy_ids(srv, [[1, 2, 3, 4, 5, 6, 7, 8], list(range(100, 230))])
        log = srv.log_text()
    lines = dispatch_lines(tmp_path)
    print("served:", got, "\ndispatch:", lines)
    assert standin_calls_in(log) == []
    assert all(len(ids) == MAX_NEW_TOKENS for ids in got), got
    _check_gdn_routed(lines, "27b-shaped-hybrid")
