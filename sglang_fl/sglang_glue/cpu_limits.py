"""Server options SGLang accepts on CPU but cannot run there, refused while the arguments are
parsed, naming the limit (left to SGLang, each kills the server later with an unrelated-looking
error: an AttributeError while graphs are set up, or "0 active drivers" from Triton at the first
request). The limits per SGLang version are the adapter's."""

from __future__ import annotations

from sglang_fl.sglang_glue.adapters import get_adapter


class CpuOptionUnsupportedError(ValueError):
    """A server option this SGLang version cannot run on CPU."""


def check_cpu_options(server_args, origins: dict[str, str] | None = None) -> None:
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
