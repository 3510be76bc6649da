"""Huawei Ascend: torch_npu's fused kernels (the same calls SGLang's forward_npu makes)."""

from __future__ import annotations

from sglang_fl.dispatch.backends import Backend, load_real_module


class AscendBackend(Backend):
    name = "ascend"

    def is_available(self) -> bool:
        self._npu = load_real_module(self, "torch_npu")
        if self._npu is None:
            return False
        import torch

        if not torch.npu.is_available():
            self.unavailable_reason = "torch_npu imports but no NPU is visible"
            return False
        return True

    def silu_and_mul(self, obj, x):
        return self._npu.npu_swiglu(x)

    def rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        if residual is not None:
            if post_residual_addition is not None:  # the kernel adds only two inputs (in fp32)
                total, rest = self.residual_sum_parts(x, residual, post_residual_addition)
                out = self._npu.npu_add_rms_norm(total, rest, obj.weight.data, obj.variance_epsilon)[0]
                return out, total
            out, _, residual = self._npu.npu_add_rms_norm(residual, x, obj.weight.data, obj.variance_epsilon)
            return out, residual
        return self._npu.npu_rms_norm(x, obj.weight.data, obj.variance_epsilon)[0]

    def gemma_rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        if residual is not None:
            if post_residual_addition is not None:
                residual = residual + post_residual_addition
            x = x + residual
            residual = x
        out = self._npu.npu_gemma_rms_norm(x, obj.weight, obj.variance_epsilon)[0]
        return out if residual is None else (out, residual)
