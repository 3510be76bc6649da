"""Moore Threads MUSA: torch_musa's native kernels (SwishGLU module, ATen rms_norm)."""

from __future__ import annotations

from sglang_fl.dispatch.backends import Backend, load_real_module


class MusaBackend(Backend):
    name = "musa"

    def is_available(self) -> bool:
        if load_real_module(self, "torch_musa") is None:
            return False
        import torch

        if not torch.musa.is_available():
            self.unavailable_reason = "torch_musa imports but no MUSA device is visible"
            return False
        if not hasattr(torch.nn, "SwishGLU"):
            self.unavailable_reason = "this torch_musa has no nn.SwishGLU"
            return False
        self._swiglu = torch.nn.SwishGLU()
        return True

    def silu_and_mul(self, obj, x):
        return self._swiglu(x)

    def rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        import torch
        import torch.nn.functional as F

        if residual is None:
            return F.rms_norm(x, (x.shape[-1],), obj.weight.data, obj.variance_epsilon)
        # No fused add here: sum in fp32 and normalise that sum, as RMSNorm.forward_native does.
        orig_dtype = x.dtype
        x = x.to(torch.float32) + residual.to(torch.float32)
        if post_residual_addition is not None:
            x = x + post_residual_addition.to(torch.float32)
        out = F.rms_norm(x, (x.shape[-1],), None, obj.variance_epsilon) * obj.weight.data
        return out.to(orig_dtype), x.to(orig_dtype)
