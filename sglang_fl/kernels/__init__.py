"""sglang-fl's own Triton kernels, for ops where the kernel library a backend wraps has none
that is correct (or fast) enough. Each module here imports Triton only when a kernel is first
launched, so the package imports on hosts without Triton (CPU CI, empty mode).

- `rope`: in-place RoPE for the ``flagos`` backend, because FlagGems 5.0.2's in-place
  ``apply_rotary_pos_emb`` races (compat ledger ``flaggems:rope-inplace``).
- `silu_mul`: ``silu_and_mul`` for the ``flagos`` backend, because FlagGems 5.0.2's costs
  ~145 us of launch per eager call (the largest FlagGems-only prefill gap) and runs slower.
- `rms_norm`: ``rms_norm`` and ``gemma_rms_norm`` for the ``flagos`` backend, because
  FlagGems' norms cost 114-130 us of host time per eager call (H100), and FlagGems has no
  Gemma norm (scale by ``1 + weight``): forming that weight per call cost two kernels.
- `gdn_qk`: q and k for FlagGems' chunked GDN kernel, L2-normalised and expanded to the value
  heads in one pass, because in PyTorch that prologue was some sixteen eager kernels per
  prefill call.
- `launch`: how the kernels above (but `gdn_decode`, which runs in CUDA graphs) launch: through
  the runner Triton compiled for the call's specialisation, not ``JITFunction.run`` (less host
  time per eager call; ``bound_launch``).
- `gdn_decode`: the Gated DeltaNet decode ops for the ``flagos`` backend, because FlagGems'
  recurrent kernel keeps states as ``[K, V]``: serving SGLang's ``[V, K]`` pool through it cost
  a gather, two transposes and a scatter of every state, 20x SGLang's kernel (H100).
"""


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``): Triton block sizes, computed
    without importing Triton."""
    return 1 << max(0, n - 1).bit_length()
