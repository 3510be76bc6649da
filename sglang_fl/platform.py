"""PlatformFL: the SGLang platform object sglang-fl hands over through ``activate_platform``.

Rule: whenever the plugin is enabled (SGLang's ``SGLANG_PLUGINS`` filter admits ``sglang_fl``)
and the host is one of our platforms (cuda, ascend, musa, cpu), SGLang gets a PlatformFL. It
keeps SGLang's in-tree platform identity (``PlatformEnum.CUDA/NPU/MUSA/CPU``), so SGLang's own
device code (graph runners, KV pools, attention backends) stays in charge; PlatformFL adds the
device facts sglang-fl needs to agree on (memory, synchronisation, graph support, the
distributed backend string) and fills server defaults that make an "empty" SGLang start — only
for options the user left unset. On ROCm or an unknown device it returns None and SGLang's own
platform is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_fl.config import get_settings
from sglang_fl.logging_setup import get_logger
from sglang_fl.plugin import require_adapter

logger = get_logger("platform")


@dataclass(frozen=True)
class PlatformFacts:
    enum_name: str  # sglang PlatformEnum member
    device_type: str  # torch device type
    torch_module: str  # attribute of torch holding the device API (torch.cuda, torch.npu ...)
    graphs: bool  # device graph capture/replay supported


FACTS = {
    "cuda": PlatformFacts("CUDA", "cuda", "cuda", True),
    "ascend": PlatformFacts("NPU", "npu", "npu", True),
    "musa": PlatformFacts("MUSA", "musa", "musa", True),
    "cpu": PlatformFacts("CPU", "cpu", "cpu", False),
}


def platform_qualname() -> str | None:
    settings = get_settings()
    if settings.platform not in FACTS:
        return None
    return "sglang_fl.platform:PlatformFL"


_ADAPTER = require_adapter()


class PlatformFL(_ADAPTER.srt_platform_class()):
    def __init__(self) -> None:
        self.settings = get_settings()
        self.facts = FACTS[self.settings.platform]
        self._enum = _ADAPTER.platform_enum(self.facts.enum_name)
        self.device_name = self.facts.device_type
        self.device_type = self.facts.device_type
        # What SGLang's own platform of this identity can do (graph capture, Triton, PyNccl),
        # but HiCache's device kernels, which are sgl_kernel's (not in empty mode).
        capabilities = _ADAPTER.in_tree_capabilities(self.facts.enum_name)
        if getattr(capabilities, "hicache_device_kernels", False):
            from sglang_fl.dispatch.backends import real_module_available

            if not real_module_available("sgl_kernel")[0]:
                capabilities = _ADAPTER.replace_capabilities(capabilities,
                                                             hicache_device_kernels=False)
        if capabilities is not None:
            self.capabilities = capabilities

    def __repr__(self) -> str:
        return f"PlatformFL(platform={self.settings.platform}, device={self.device_type})"

    # -- device facts ---------------------------------------------------------------------
    def _api(self):
        import torch

        if self.device_type == "cpu":
            return None
        return getattr(torch, self.facts.torch_module)

    def get_device(self, local_rank: int):
        import torch

        return torch.device(self.device_type if self.device_type == "cpu" else f"{self.device_type}:{local_rank}")

    def set_device(self, device) -> None:
        api = self._api()
        if api is not None:
            api.set_device(device)

    def get_device_name(self, device_id: int = 0) -> str:
        api = self._api()
        if api is None:
            import platform as _platform

            return _platform.processor() or _platform.machine()
        return api.get_device_name(device_id)

    def get_device_total_memory(self, device_id: int = 0) -> int:
        api = self._api()
        if api is None:
            import psutil

            return psutil.virtual_memory().total
        return api.get_device_properties(device_id).total_memory

    def get_current_memory_usage(self, device=None) -> float:
        api = self._api()
        if api is None:
            import psutil

            return float(psutil.Process().memory_info().rss)
        return float(api.memory_allocated(device))

    def get_available_memory(self, device_id: int = 0) -> tuple[int, int]:
        api = self._api()
        if api is None:
            import psutil

            vm = psutil.virtual_memory()
            return vm.available, vm.total
        return api.mem_get_info(device_id)

    def synchronize(self) -> None:
        api = self._api()
        if api is not None:
            api.synchronize()

    def empty_cache(self) -> None:
        api = self._api()
        if api is not None:
            api.empty_cache()

    def is_pin_memory_available(self, device=None) -> bool:
        """Pinned host memory for device copies (0.5.23 asks the platform; its base answers
        no, which makes every host-to-device copy pageable)."""
        return self.device_type != "cpu" and str(device) != "cpu"

    def support_cuda_graph(self) -> bool:
        return self.facts.graphs

    def get_torch_distributed_backend_str(self) -> str:
        from sglang_fl.distributed import dist_backend_string

        return dist_backend_string(self.settings)

    # -- server defaults ------------------------------------------------------------------
    def apply_server_args_defaults(self, server_args) -> None:
        from sglang_fl.sglang_glue.attention import check_attention_backends
        from sglang_fl.sglang_glue.cpu_limits import check_cpu_options
        from sglang_fl.sglang_glue.server_defaults import apply_defaults

        changed = apply_defaults(self.settings, server_args)
        origins = {name: f"sglang-fl's server default: {why}" for name, (_, why) in changed.items()}
        check_attention_backends(server_args, origins)
        if self.device_type == "cpu":
            check_cpu_options(server_args, origins)

    def get_default_attention_backend(self) -> str:
        if self.settings.attention_backend is not None:
            return self.settings.attention_backend
        return "torch_native" if self.device_type == "cpu" else "triton"

