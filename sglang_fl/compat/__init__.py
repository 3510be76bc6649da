"""The compat ledger: what sglang-fl changes so SGLang imports and serves without its CUDA-only
packages (empty mode, entries 1-9 and 11-13), and the SGLang bugs it fixes on every install (``fix:``).

This file is the ledger. Every patch sglang-fl applies to SGLang's environment is listed in
`LEDGER`, one entry each, with why it exists, how it is done, its upstream status and when it
can be removed. Nothing outside this package patches SGLang's imports. The entries:

1. ``standin:sgl_kernel`` -- SGLang imports ``sgl_kernel`` (and ``sgl_kernel.kvcacheio``,
   memory_pool_host.py) at module level; absent on non-NVIDIA chips and in an empty install.
   How: stand-in package (`standins.StandinModule`) + the ``sgl_kernel::moe_fused_gate`` torch op
   schema, which moe/topk.py registers a fake for at import. Upstream: none (SGLang assumes the
   wheel on CUDA). Remove when SGLang guards these imports.
2. ``standin:flashinfer`` -- module-level flashinfer imports (sampler, attention, MoE). How:
   stand-in package; ``SGLANG_IS_FLASHINFER_AVAILABLE=false`` so SGLang never picks it.
   Upstream: none. Remove with 1.
3. ``standin:tvm_ffi`` -- ``sglang.jit_kernel`` compiles CUDA through apache-tvm-ffi. How:
   stand-in package; the fused ops that use it are routed by sglang-fl Layer 2, the two
   hard-wired calls are swapped (entry 6). Upstream: none. Remove with 1.
4. ``standin:torchvision`` -- srt/utils/common.py imports ``torchvision.io.decode_jpeg`` at
   module level, and transformers 5 requires torchvision for ``AutoImageProcessor`` (which
   SGLang's configs register at import); PyPI torchvision is a CUDA build that fails beside a
   CPU-only torch. How: a stand-in package when torchvision is absent or fails to import
   (shadowing the broken one); where transformers was imported first, its cached "no
   torchvision" answer and torchvision-only placeholders are forgotten. Image/video inputs then
   fail with the stand-in error; text serving never calls it. Upstream: none. Remove when
   SGLang and transformers import it lazily.
5. ``env`` -- ``SGLANG_IS_FLASHINFER_AVAILABLE=false`` (flashinfer absent),
   ``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1`` (sgl_kernel absent: engine.py reads its version),
   ``SGLANG_USE_CPU_ENGINE=1`` (CPU platform: SGLang's ``is_cpu()`` requires it, else CPU runs
   take CUDA/vllm branches). Only set when the user has not. Upstream: SGLang's own switches.
   Remove when SGLang detects these itself.
6. ``swap:clamp_position`` / ``swap:_resolve_future_token_ids`` -- forward_batch_info.py and
   overlap_utils.py bind the JIT CUDA kernel under ``is_cuda()``; no plugin API reaches them.
   How: rebind to SGLang's own ``*_native`` twin after the module runs (`swaps`). Upstream:
   none. Remove when SGLang falls back when the JIT path is unavailable. Which globals is the
   SGLang version adapter's ``NATIVE_SWAPS``: 0.5.23 made ``clamp_position`` a fused op (swapped
   to its ``forward_native``) and no longer calls a JIT kernel in overlap_utils.
7. ``sgl_kernel-off-flashinfer`` -- a real sgl_kernel hands rmsnorm/fused_add_rmsnorm and
   top-k/top-p renorm to flashinfer whenever ``import flashinfer.norm`` succeeded at its import,
   which the flashinfer stand-in makes true. How: after ``sgl_kernel.elementwise`` /
   ``sgl_kernel.sampling`` run, set their ``_has_flashinfer`` to False (only when sgl_kernel is
   real and flashinfer is a stand-in). Upstream: none. Remove with 2.
8. ``swap:can_use_store_cache`` -- mem_cache/memory_pool.py asks ``can_use_store_cache`` before
   its JIT KV-store kernel on CUDA, which compiles through tvm_ffi: with the stand-in that call
   fails (and is logged) on every empty-mode GPU start, in CUDA-graph capture too. How: rebind
   it to a check that answers no (`swaps`), so SGLang takes its own index_put branch. Upstream:
   none. Remove with 6.
9. ``flaggems:rope-inplace`` -- FlagGems 5.0.2's in-place ``apply_rotary_pos_emb`` races (no
   barrier between the warps that read a rotation partner and those that overwrite it): 14-18 %
   of calls at head 128 x 1024 tokens wrong on an H200; out of place is exact. How: the flagos
   RoPE impl runs sglang-fl's own in-place Triton kernel (``sglang_fl/kernels/rope.py``: each
   program loads both halves of the pairs it owns before storing them) for ``inplace=True`` and
   FlagGems' out-of-place kernel for ``inplace=False`` (dispatch/backends/flaggems.py);
   reproducer tools/repro_flaggems_rope_race.py. Upstream: the fix and its test, ready to send,
   in tools/flaggems-rope-inplace-fix.patch. Remove (call ``apply_rotary_pos_emb(...,
   inplace=True)`` again and delete the kernel) when a FlagGems release passes the reproducer,
   tests/gpu/test_rope_kernel.py's detector check reports it fixed, and ``--compare`` shows its
   in-place kernel no slower than sglang-fl's.
10. ``fix:request_state_leak`` -- not empty mode but an SGLang 0.5.11 bug, fixed on every chip:
   ``TokenizerManager.generate_request`` registers request states before validating, so a
   request rejected before dispatch (``max_tokens=-1``, ``temperature=-1``, a prompt over the
   context length) and every ``n > 1`` request (its un-expanded rids) leave states behind, and
   the SIGTERM drain waits for them forever. How: wrap ``generate_request`` after the module
   runs; when its generator ends, drop this request's states that were never dispatched
   (`fixes`); dispatched ones stay, an abort still needs them (cf. sgl-project/sglang#34894).
   Upstream: sgl-project/sglang#28694 (not in 0.5.11) cleans up on pre-dispatch failures; no
   fix found for the ``n > 1`` states. Remove when the supported SGLang has both.
11. ``ops:sgl_kernel-gdn-cpu`` -- on CPU, SGLang's Gated DeltaNet backend (Qwen3-Next,
   Qwen3.5/3.6) looks up ``torch.ops.sgl_kernel.fused_gdn_gating_cpu`` and
   ``fused_sigmoid_gating_delta_rule_update_cpu`` at import (a stand-in cannot answer a
   ``torch.ops`` lookup) and calls ``sgl_kernel.mamba.causal_conv1d_fn_cpu`` /
   ``causal_conv1d_update_cpu`` / ``chunk_gated_delta_rule_cpu``. How: when sgl_kernel is a
   stand-in, the two are defined as real ``torch.library`` ops and the three set on the
   ``sgl_kernel.mamba`` stand-in, all calling sglang-fl's GDN ops (``sglang_glue/gdn.py``), so
   they dispatch like any routed op. SGLang 0.5.23's Qwen3.5 module also binds four fused CPU
   ops at import (``fused_sigmoid_mul_cpu``, ``fused_qk_gemma_rmsnorm[_with_gate]_cpu``,
   ``fused_qkvzba_split_reshape_cat_contiguous_cpu``), defined the same way
   (``sglang_glue/qwen3_5_cpu.py``). Upstream: none (the CPU kernels are in sgl_kernel's CPU
   build only). Remove with 1.
12. ``route:RMSNormGated`` -- SGLang's FLA ``layernorm_gated.RMSNorm`` (the GDN output norm) is
   a plain ``nn.Module``, not a fused op, so the Layer-2 dispatch hook never sees it, and on a
   CPU without AMX its forward runs a Triton kernel. How: its ``forward`` is wrapped
   (``sglang_glue/layer_hook.py``, ``register_module_routes``) to bind each instance through the
   same router as a fused op (op ``rms_norm_gated``, OOT white/blacklist name
   ``RMSNormGated``). Upstream: none. Remove when SGLang makes it a fused op (then it is an
   ordinary ``LAYER_CLASSES`` route).
13. ``swap:fused_gate_sigmoid_mul`` / ``swap:fused_gate_sigmoid_mul_add`` -- SGLang 0.5.23's ``qwen2_moe`` gates shared experts (Qwen2/3-MoE,
   Qwen3.5-MoE) with a Triton kernel whenever the gate is not AMX-packed, so on a CPU without
   AMX as well, where Triton has no driver. How: on the CPU platform, rebind
   ``fused_gate_sigmoid_mul`` / ``fused_gate_sigmoid_mul_add`` to the unfused math after the
   module runs (the adapter's ``CPU_NATIVE_SWAPS``, `swaps`). Upstream: none. Remove when SGLang
   checks for a Triton device before taking that path.
14. ``swap:is_cuda`` (SGLang 0.5.23, ``layers/dual_gemm.py``) -- every Qwen2/Llama MLP builds a
   ``DualGemm`` whose mode check imports its CuTe-DSL Blackwell kernel (``import cutlass``) on
   any CUDA host; without nvidia-cutlass-dsl (a 0.5.23 requirement that empty-mode bundles and
   non-NVIDIA images leave out) model construction fails. How: when ``cutlass`` is absent, that
   module's ``is_cuda`` is rebound to answer no, so SGLang keeps the separate gate/up GEMM and
   SiluAndMul it uses everywhere else (and on Hopper). Seen on the H200 on 2026-12-01.
   Upstream: none. Remove when SGLang guards that import.
15. ``swap:is_arch_support_pdl`` (SGLang 0.5.23, ``layers/attention/triton_backend.py``) -- on
   CUDA hosts the Triton attention backend asks ``sgl_kernel.utils.is_arch_support_pdl`` while
   it is built, so without sglang-kernel (empty mode) it hits the stand-in and the server does
   not start. How: when sgl_kernel is absent, rebind it to answer no (PDL only overlaps kernel
   launches). Seen on the H200 on 2026-12-02. Upstream: none. Remove when SGLang guards it.
16. ``swap:fused_softcap`` (``layers/logits_processor.py``) -- models with
   ``final_logit_softcapping`` (Gemma 2) cap their logits with a Triton kernel on every device
   but NPU, so on CPU, where Triton has no driver, the first request kills the server ("0 active
   drivers"). How: on the CPU platform, rebind ``fused_softcap`` to the same math in torch, in
   place (the adapter's ``CPU_NATIVE_SWAPS``). Seen 2026-12-02 serving a tiny Gemma 2 on CPU.
   Upstream: none. Remove when SGLang takes its torch branch off Triton devices.
17. ``fix:grammar_mask_device`` (``constrained/xgrammar_backend.py``) -- not empty mode but an
   SGLang limit, fixed on every chip: the xgrammar backend applies a request's grammar mask
   (JSON schema, regex, EBNF) only on the device types it lists (0.5.11: cuda, xpu, musa, npu;
   0.5.23 adds cpu) and raises ``Unsupported device`` on any other inside the scheduler, so the
   first constrained request kills a CPU server on 0.5.11 and a server on any device type SGLang
   does not know. How: wrap ``XGrammarGrammar.apply_vocab_mask`` after import; the other device
   types get the mask in plain torch (`fixes`). Seen 2026-12-02 on CPU with xgrammar installed.
   Upstream: none. Remove when SGLang has a device-agnostic fallback.
18. ``fix:sigterm_exit_status`` (SGLang 0.5.11, ``managers/tokenizer_manager.py``) -- a clean
   stop is reported as a crash: after SIGTERM and the request drain, ``sigterm_watchdog`` calls
   ``kill_process_tree(os.getpid(), include_parent=True)``, which SIGKILLs launch_server itself,
   so it exits with -9 (``docker stop``: 137; a scaled-down Kubernetes pod shows Error). How:
   wrap ``sigterm_watchdog`` to mark its drain, and rebind the module's ``kill_process_tree``:
   called from that drain for the process itself (server not unhealthy), it stops the children
   as SGLang does, then exits 0 (`fixes`); every other call (a child's SIGQUIT, a failed health
   check) is SGLang's own, so a crash keeps its non-zero status. Only where the adapter's
   ``SIGTERM_STOP_KILLS_ITSELF`` says so (0.5.23 already stops the children only and exits 0).
   Seen 2026-12-02. Upstream: fixed in 0.5.23's rewrite of the drain. Remove with SGLang 0.5.11
   support.

19. ``route:gdn-kernels`` (``layers/attention/linear``) -- on accelerators, SGLang's Gated
   DeltaNet backend calls its own Triton kernels directly: ``TritonGDNKernel.extend`` /
   ``decode`` / ``packed_decode`` and the ``gdn_backend`` globals ``fused_gdn_gating``,
   ``causal_conv1d_fn``, ``causal_conv1d_update``; no plugin API reaches them, so a vendor folder
   or FlagGems could not supply them there (seen on the H200, 2026-12-02: "GDN kernel
   dispatcher: decode=TritonGDNKernel"). How: after each module runs, those methods and globals
   are replaced by calls of the GDN ops (``sglang_glue/gdn.py`` `install_kernel_routes`; where
   they live is the adapter's ``GDN_KERNEL_CLASS`` / ``GDN_BACKEND_MODULE``); calls the standard
   ops do not express go to SGLang's original, logged once; on 0.5.23 the class also declares
   ``supports_track_state_snapshot`` (the extra-buffer mamba cache then asks extend for a
   prefix's state instead of SGLang's per-chunk states). Upstream: none (SGLang's
   ``LinearAttnKernelBase`` registry could take an out-of-tree kernel class). Remove when SGLang
   lets a platform plugin supply the GDN kernel backend.
20. ``fix:rust_tree_core`` (SGLang 0.5.23, ``mem_cache/unified_cache/tree_core_registry.py``) --
   the radix cache's default TreeCore is a Rust extension prebuilt in the wheel against the torch
   SGLang pins (2.14.1); SGLang only checks that torch is within 2.11-2.14 (what a source build
   supports), and under torch 2.11 (the H200 image) the prebuilt extension misreads tensors:
   every server with the radix cache on died on its first prefill ("Rust TreeCore panicked:
   UnknownKind(19)", seen 2026-12-03). How: wrap ``resolve_tree_core_backend``: where SGLang
   picks the Rust core by default, one key is inserted into a fresh one (once per process); if
   that fails, SGLang's Python TreeCore, with one warning naming why (`fixes`). A user's
   ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` is kept. ``sglang-fl doctor`` shows the decision.
   Upstream: none. Remove when SGLang checks its prebuilt extension against the running torch.
21. ``fix:http_port_in_use`` (every SGLang version, ``entrypoints/http_server.py``) -- a server
   whose HTTP port is taken loads the model, fails uvicorn's bind, and then waits up to 12
   minutes: uvicorn's lifespan shutdown joins SGLang's warm-up thread, which polls the taken port
   120 times before killing the process tree; one uvicorn error line is all it shows (seen on
   CPU, 2026-12-06). How: wrap ``launch_server`` to refuse a taken ``--host``/``--port`` before
   anything starts (`sglang_fl.preflight.check_http_port`, which the image entrypoint runs too),
   and ``uvicorn.Server.startup`` of SGLang's app to stop the children and exit 1 with one error
   when the port was taken while the model loaded (`fixes`). Upstream: none. Remove when SGLang
   binds its port before loading, or its lifespan stops waiting on a failed bind.

Activation (`activate`) happens in every process at the first ``import sglang``, through the
``.pth`` hook in `bootstrap`; see docs/empty-mode.md. The ``fix:`` entries are installed first,
before ``activate`` looks for missing packages, so they apply to full installs too.
"""

from __future__ import annotations

import os
import sys

__all__ = [
    "CALL_LOG_PREFIX", "LEDGER", "STANDIN_MARKER", "Standin", "StandinCalledError", "activate",
    "active_entries", "state", "standin_calls",
]

# This package is imported by the .pth hook in every interpreter of the environment, so its
# top level stays cheap: the stand-in machinery is imported on first use (``__getattr__``) or by
# `activate`.
_LAZY = {"CALL_LOG_PREFIX", "STANDIN_MARKER", "Standin", "StandinCalledError", "standin_calls"}


def __getattr__(name: str):
    if name in _LAZY:
        from sglang_fl.compat import standins

        return getattr(standins, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Patch:
    """One ledger entry. (A plain class: ``typing``/``collections`` would cost the hook ~2 ms.)"""

    __slots__ = ("name", "why", "how", "upstream", "remove_when")

    def __init__(self, name: str, why: str, how: str, upstream: str, remove_when: str) -> None:
        self.name, self.why, self.how = name, why, how
        self.upstream, self.remove_when = upstream, remove_when

    def __iter__(self):
        return iter((self.name, self.why, self.how, self.upstream, self.remove_when))

    def __repr__(self) -> str:
        return f"Patch({self.name!r})"


LEDGER: tuple[Patch, ...] = (
    Patch("standin:sgl_kernel", "module-level sgl_kernel imports (incl. sgl_kernel.kvcacheio)",
          "stand-in package + sgl_kernel::moe_fused_gate op schema", "none",
          "SGLang guards its sgl_kernel imports"),
    Patch("standin:flashinfer", "module-level flashinfer imports", "stand-in package",
          "none", "SGLang guards its flashinfer imports"),
    Patch("standin:tvm_ffi", "sglang.jit_kernel needs apache-tvm-ffi", "stand-in package",
          "none", "SGLang guards its JIT kernel path"),
    Patch("standin:torchvision", "common.py imports torchvision.io at module level; transformers "
          "needs torchvision to register image processors", "stand-in package", "none",
          "SGLang and transformers import torchvision lazily"),
    Patch("env", "SGLang's own switches for a missing flashinfer/sgl_kernel and for CPU",
          "os.environ.setdefault before SGLang reads them", "SGLang's switches",
          "SGLang detects these itself"),
    Patch("swap:clamp_position", "forward_batch_info binds the JIT CUDA kernel under is_cuda()",
          "rebind to _clamp_position_native after import", "none",
          "SGLang falls back when the JIT path is unavailable"),
    Patch("swap:_resolve_future_token_ids", "overlap_utils binds the JIT CUDA kernel under is_cuda()",
          "rebind to _resolve_future_token_ids_native after import", "none",
          "SGLang falls back when the JIT path is unavailable"),
    Patch("sgl_kernel-off-flashinfer", "sgl_kernel routes norms/renorm to flashinfer when "
          "flashinfer.norm imports, which the stand-in makes true",
          "set sgl_kernel.elementwise/sampling._has_flashinfer = False after import", "none",
          "SGLang no longer needs the flashinfer stand-in"),
    Patch("swap:can_use_store_cache", "memory_pool tries the JIT KV-store kernel (tvm_ffi) under "
          "is_cuda() on every start", "rebind the capability check to answer no", "none",
          "SGLang falls back when the JIT path is unavailable"),
    Patch("flaggems:rope-inplace", "FlagGems 5.0.2's in-place apply_rotary_pos_emb races between "
          "warps (wrong elements in 14-18 % of calls at head 128)",
          "flagos RoPE runs sglang-fl's own in-place Triton kernel (sglang_fl/kernels/rope.py) "
          "for inplace=True, FlagGems out of place otherwise; reproducer "
          "tools/repro_flaggems_rope_race.py",
          "fix + test ready to send: tools/flaggems-rope-inplace-fix.patch",
          "a FlagGems release passes the reproducer and is no slower in place (--compare)"),
    Patch("fix:request_state_leak", "TokenizerManager leaks the states of requests rejected "
          "before dispatch and of n>1 requests; SGLang's SIGTERM drain then never ends",
          "wrap generate_request after import: drop this request's undispatched states when it "
          "ends", "sgl-project/sglang#28694 (pre-dispatch failures); none found for n>1",
          "the supported SGLang frees both itself"),
    Patch("route:gdn-kernels", "SGLang's GDN backend calls its Triton kernels directly on "
          "accelerators (TritonGDNKernel, gdn_backend globals): no plugin API reaches them",
          "replace those methods/globals after import with calls of the GDN ops "
          "(sglang_glue/gdn.py install_kernel_routes)", "none",
          "SGLang lets a platform plugin supply its GDN kernel backend"),
    Patch("fix:grammar_mask_device", "xgrammar's grammar masks are applied only on the device "
          "types SGLang lists (not cpu on 0.5.11, never a new vendor's); any other raises in the "
          "scheduler on the first constrained request", "wrap XGrammarGrammar.apply_vocab_mask "
          "after import: other device types get the mask in torch", "none",
          "SGLang has a device-agnostic fallback"),
    Patch("fix:sigterm_exit_status", "0.5.11's clean SIGTERM stop SIGKILLs launch_server itself "
          "after the drain: status -9 (docker stop 137) for a stop that did not fail",
          "wrap sigterm_watchdog and the module's kill_process_tree: called from the drain for "
          "the process itself, stop the children, then exit 0; crashes keep SGLang's SIGKILL",
          "fixed by 0.5.23's drain (children only, then sys.exit(0))",
          "SGLang 0.5.11 support is dropped"),
    Patch("ops:sgl_kernel-gdn-cpu", "SGLang's CPU GDN backend looks up torch.ops.sgl_kernel "
          "GDN ops at import and calls sgl_kernel.mamba CPU kernels",
          "torch.library ops + functions on the sgl_kernel.mamba stand-in, calling sglang-fl's "
          "GDN ops", "none", "SGLang guards its sgl_kernel imports"),
    Patch("swap:fused_softcap", "the logits processor caps Gemma 2's final logits with a "
          "Triton kernel on every device but NPU, CPU included", "rebind to the same math in "
          "torch on the CPU platform (CPU_NATIVE_SWAPS)", "none",
          "SGLang takes its torch branch where Triton cannot run"),
    Patch("swap:fused_gate_sigmoid_mul", "qwen2_moe (0.5.23) gates shared experts with a "
          "Triton kernel on CPUs without AMX too", "rebind to the unfused math on the CPU "
          "platform (CPU_NATIVE_SWAPS)", "none", "SGLang checks for a Triton device first"),
    Patch("swap:fused_gate_sigmoid_mul_add", "as swap:fused_gate_sigmoid_mul, adding into the "
          "routed experts' output", "rebind to the unfused math on the CPU platform "
          "(CPU_NATIVE_SWAPS)", "none", "SGLang checks for a Triton device first"),
    Patch("route:RMSNormGated", "the FLA gated RMSNorm is a plain nn.Module (no dispatch hook) "
          "and runs Triton on CPU", "wrap its forward to bind through the Layer-2 router",
          "none", "SGLang makes it a fused op"),
    Patch("swap:is_cuda", "0.5.23's DualGemm imports its CuTe-DSL kernel (cutlass) on any CUDA "
          "host while building each MLP", "rebind dual_gemm.is_cuda to answer no when cutlass "
          "is absent", "none", "SGLang guards the cutlass import"),
    Patch("fix:rust_tree_core", "0.5.23's prebuilt Rust TreeCore (built against torch 2.14) "
          "misreads tensors under other torch releases (torch 2.11: every radix-cache server "
          "died on its first prefill)", "wrap resolve_tree_core_backend: a one-key insert into "
          "a fresh Rust core once per process; on failure SGLang's Python TreeCore, warned once; "
          "the user's SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND kept", "none",
          "SGLang checks its prebuilt extension against the running torch"),
    Patch("fix:http_port_in_use", "a taken HTTP port is found only after the model loaded, "
          "and then uvicorn's lifespan shutdown joins SGLang's warm-up thread, which polls the "
          "taken port for up to 12 minutes", "wrap launch_server (refuse a taken --host/--port "
          "before anything starts) and uvicorn.Server.startup of SGLang's app (stop the "
          "children and exit 1 when it was taken during the load)", "none",
          "SGLang binds its port before loading, or stops waiting on a failed bind"),
    Patch("swap:is_arch_support_pdl", "0.5.23's Triton attention backend asks sgl_kernel about "
          "PDL on CUDA hosts", "rebind it to answer no when sgl_kernel is absent", "none",
          "SGLang guards the sgl_kernel call"),
)

# sgl_kernel modules that decide at import whether to call flashinfer (ledger entry 7).
SGL_KERNEL_FLASHINFER_USERS = ("sgl_kernel.elementwise", "sgl_kernel.sampling")

# Absent CUDA-only packages served by StandinFinder (any submodule).
STANDIN_PACKAGES: dict[str, frozenset[str] | None] = {
    "sgl_kernel": None,
    "flashinfer": None,
    "tvm_ffi": None,
    "torchvision": None,
}

MOE_FUSED_GATE_SCHEMA = (
    "moe_fused_gate(Tensor input, Tensor bias, int num_expert_group, int topk_group, int topk, "
    "int num_fused_shared_experts, float routed_scaling_factor, "
    "bool apply_routed_scaling_factor_on_output) -> (Tensor[])"
)


class _State:
    """What `activate` did in this process (for tests and ``sglang-fl`` diagnostics)."""

    def __init__(self) -> None:
        self.active = False
        self.standins: tuple[str, ...] = ()  # packages served by stand-ins
        self.env_set: dict[str, str] = {}  # SGLang switches we set (the user had not)
        self.fixes = False  # the ``fix:`` entries are installed (a supported SGLang)


state = _State()
_torch_libs: list = []  # keep torch.library.Library objects alive


def _absent(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _broken(name: str) -> bool:
    """Installed but fails to import (a CUDA torchvision beside a CPU-only torch)."""
    import importlib

    try:
        importlib.import_module(name)
        return False
    except Exception as exc:  # noqa: BLE001 -- any import failure means "cannot use it"
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        _logger().warning("%s is installed but does not import (%s); using a stand-in", name, exc)
        return True


def _logger():
    import logging

    return logging.getLogger("sglang_fl.compat")


def _define_moe_fused_gate(module) -> None:
    """moe/topk.py registers a fake for this op at import: the op must exist (schema only)."""
    import torch

    try:
        torch.ops.sgl_kernel.moe_fused_gate  # noqa: B018 -- defined already (another stand-in run)
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    lib.define(MOE_FUSED_GATE_SCHEMA)

    def moe_fused_gate(*args, **kwargs):
        return module.moe_fused_gate(*args, **kwargs)  # the stand-in: raises and records

    lib.impl("moe_fused_gate", moe_fused_gate, "CompositeExplicitAutograd")
    _torch_libs.append(lib)
    _define_gdn_ops(lib)


def _define_gdn_ops(lib) -> None:
    """Ledger entry 11: the sgl_kernel GDN CPU ops, backed by sglang-fl's GDN ops."""
    from sglang_fl.sglang_glue import gdn, qwen3_5_cpu

    for schemas, impls in ((gdn.TORCH_OP_SCHEMAS, gdn.TORCH_OPS),
                           (qwen3_5_cpu.SCHEMAS, qwen3_5_cpu.TORCH_OPS)):
        for name, schema in schemas.items():
            lib.define(schema)
            lib.impl(name, impls[name], "CompositeExplicitAutograd")


def _provide_mamba_functions(module) -> None:
    """Ledger entry 11: sgl_kernel.mamba's CPU GDN kernels, backed by sglang-fl's GDN ops."""
    from sglang_fl.sglang_glue import gdn

    for name, fn in gdn.MAMBA_FUNCTIONS.items():
        setattr(module, name, fn)


def _platform() -> str:
    from sglang_fl.config import SettingsError, get_settings

    try:
        return get_settings().platform
    except SettingsError:  # reported with its message by load_plugin; imports must still work
        from sglang_fl.devices import detect_platform

        return detect_platform()


def _set_default(name: str, value: str) -> None:
    if name not in os.environ:
        os.environ[name] = value
        state.env_set[name] = value


def _keep_off_flashinfer(module) -> None:
    if getattr(module, "_has_flashinfer", False):
        module._has_flashinfer = False


def _forget_transformers_torchvision_answer() -> None:
    """A program that imported transformers before SGLang (``from transformers import
    AutoProcessor`` first) keeps transformers' view from before the torchvision stand-in: the
    cached "is torchvision available" answer (``lru_cache``), and in each of its lazy modules
    the objects marked as missing that backend, served as placeholders whose attributes are
    None (SGLang's configs then fail at ``AutoImageProcessor.register``). Forget both, so the
    next lookup resolves the real objects. Only the torchvision-only marks are dropped."""
    import_utils = sys.modules.get("transformers.utils.import_utils")
    if import_utils is None:
        return  # transformers comes after the stand-in: it sees it from the start
    for name in ("is_torchvision_available", "is_torchvision_v2_available"):
        cache_clear = getattr(getattr(import_utils, name, None), "cache_clear", None)
        if cache_clear is not None:
            cache_clear()
    lazy_type = getattr(import_utils, "_LazyModule", None)
    dummy_type = getattr(import_utils, "DummyObject", None)
    if lazy_type is None:
        return
    for module in list(sys.modules.values()):
        missing = getattr(module, "_object_missing_backend", None) if isinstance(module, lazy_type) else None
        if not isinstance(missing, dict):
            continue
        for name, backends in list(missing.items()):
            if {str(b) for b in backends} == {"torchvision"}:
                del missing[name]
                if dummy_type is not None and isinstance(module.__dict__.get(name), dummy_type):
                    delattr(module, name)


def activate() -> None:
    """Install the SGLang fixes, then enter empty mode for the packages that are missing;
    idempotent; see the ledger above."""
    if state.active:
        return
    state.active = True
    from sglang_fl.compat import fixes
    from sglang_fl.sglang_glue.adapters import UnsupportedSGLangVersion, get_adapter

    try:
        get_adapter()
        supported = True
    except UnsupportedSGLangVersion as exc:  # load_plugin stops start-up with this message
        _logger().error("%s; no SGLang fixes or native swaps applied", exc)
        supported = False
    if supported:
        fixes.install()  # SGLang bug fixes: every install, stand-ins or not
        state.fixes = True
        from sglang_fl.compat import swaps

        # Native swaps: each where the package it stands for is absent; on the CPU platform
        # also the adapter's CPU swaps (ledger entry 13).
        swaps.install(_absent, cpu=_platform() == "cpu")
    from sglang_fl.compat.standins import StandinFinder

    missing = [p for p in STANDIN_PACKAGES if p != "torchvision" and _absent(p)]
    tv_broken = not _absent("torchvision") and _broken("torchvision")
    if tv_broken or _absent("torchvision"):
        missing.append("torchvision")
    if not missing:
        return
    finder = StandinFinder(
        {p: STANDIN_PACKAGES[p] for p in missing},
        on_exec={"sgl_kernel": _define_moe_fused_gate, "sgl_kernel.mamba": _provide_mamba_functions},
    )
    if tv_broken:
        sys.meta_path.insert(0, finder)  # must shadow the installed, broken torchvision
    else:
        sys.meta_path.append(finder)  # real finders first: a package installed later still wins
    state.standins = tuple(missing)
    if "torchvision" in missing:
        _forget_transformers_torchvision_answer()

    if "flashinfer" in missing:
        _set_default("SGLANG_IS_FLASHINFER_AVAILABLE", "false")
        if "sgl_kernel" not in missing:
            from sglang_fl.compat.module_hooks import add_hook

            for name in SGL_KERNEL_FLASHINFER_USERS:
                add_hook(name, after=_keep_off_flashinfer)
    if "sgl_kernel" in missing:
        _set_default("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")
        if _platform() == "cpu":
            _set_default("SGLANG_USE_CPU_ENGINE", "1")
    _logger().info("sglang-fl empty mode: stand-ins for %s; env %s", ", ".join(missing), state.env_set)


def active_entries() -> tuple[Patch, ...]:
    """The ledger entries `activate` put in force in this process (``sglang-fl doctor``). Two
    are the dispatch's business, not activation's: ``flaggems:rope-inplace`` (the flagos RoPE
    impl) and ``route:RMSNormGated`` (a Layer-2 route)."""
    from sglang_fl.compat import swaps

    names = {f"standin:{p}" for p in state.standins} | {f"swap:{s.attr}" for s in swaps.armed}
    if state.fixes:
        names |= {p.name for p in LEDGER if p.name.startswith("fix:")}
    if state.env_set:
        names.add("env")
    if "flashinfer" in state.standins and "sgl_kernel" not in state.standins:
        names.add("sgl_kernel-off-flashinfer")
    if "sgl_kernel" in state.standins:
        names.add("ops:sgl_kernel-gdn-cpu")
    return tuple(p for p in LEDGER if p.name in names)
