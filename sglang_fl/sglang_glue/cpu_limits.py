"""Server options SGLang accepts on CPU but cannot run there, refused while the arguments are
parsed, naming the limit (left to SGLang, each kills the server later with an unrelated-looking
error: a hard-coded CUDA call after both models loaded, an AttributeError while graphs are set
up, or "0 active drivers" from Triton at the first request). The limits per SGLang version are
the adapter's; `check_cpu_options` is the one entry point (PlatformFL, CPU only)."""

from __future__ import annotations

from sglang_fl.sglang_glue.adapters import get_adapter


class SpeculationUnsupportedError(ValueError):
    """Speculative decoding asked for where this SGLang version cannot run its draft model."""


def check_cpu_speculation(server_args, origins: dict[str, str] | None = None) -> None:
    """Refuse ``--speculative-algorithm`` on CPU with an attention backend SGLang builds no
    draft backend for. SGLang itself fails only in the scheduler process, after loading both
    models, and on 0.5.11 first at an unrelated hard-coded CUDA call (the Mamba pool's
    speculative state caches), so the user never learns the real limit."""
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm is None:
        return
    adapter = get_adapter()
    accepted = adapter.CPU_SPECULATIVE_ATTENTION_BACKENDS
    name = getattr(server_args, "attention_backend", None)
    if name in accepted:
        return
    where = (origins or {}).get("attention_backend", "the server arguments")
    raise SpeculationUnsupportedError(
        f"--speculative-algorithm {algorithm} on CPU: SGLang {adapter.version} builds no "
        f"EAGLE/NEXTN draft attention backend for --attention-backend {name!r} (from {where}); "
        + (f"on CPU it has one for: {', '.join(accepted)}" if accepted else
           "on CPU it has none (its draft backends are GPU/NPU kernels)")
        + "; serve without speculative decoding on CPU (see docs/speculative-decoding.md)")


class CpuOptionUnsupportedError(ValueError):
    """A server option this SGLang version cannot run on CPU."""


def check_cpu_options(server_args, origins: dict[str, str] | None = None) -> None:
    """Speculation first (its own error), then every other option's limit named at once."""
    check_cpu_speculation(server_args, origins)
    adapter = get_adapter()
    origins = origins or {}
    problems = []
    backend = getattr(server_args, "attention_backend", None)
    if getattr(server_args, "enable_torch_compile", False) and backend not in adapter.CPU_GRAPH_ATTENTION_BACKENDS:
        where = origins.get("attention_backend", "the server arguments")
        problems.append(
            f"--enable-torch-compile needs an attention backend that builds CPU graphs "
            f"({', '.join(adapter.CPU_GRAPH_ATTENTION_BACKENDS)}, sgl_kernel's CPU build); "
            f"--attention-backend is {backend!r} (from {where}): leave --enable-torch-compile off")
    page_size = getattr(server_args, "page_size", None) or 1
    if page_size > 1 and not adapter.CPU_PAGED_KV:
        problems.append(
            f"--page-size {page_size}: SGLang {adapter.version}'s paged KV allocator launches a "
            f"Triton kernel at every prefill, and Triton has no CPU driver; use --page-size 1 "
            f"(the default) on CPU")
    if problems:
        raise CpuOptionUnsupportedError(
            f"on CPU with SGLang {adapter.version}: " + "; ".join(problems))
