"""GPU memory plan of benchmarks/e2e_bench.py: what one SGLang server of a configuration needs,
which configurations can share the GPU, and the ``--mem-fraction-static`` each server gets.

SGLang sizes a server by ``--mem-fraction-static`` f: after loading the weights it gives its
KV pool ``rest = free_after_load - free_before_load * (1 - f)`` (0.5.11
``_profile_available_bytes``; 0.5.23 resizes the pool after graph capture by the same rule),
so a server started alone reserves ``f * free_before_load`` for weights + KV pool, and one whose
``f * free`` is below its weights stops with "Not enough memory". Beside that static part it
needs room for activations and CUDA graphs, which SGLang itself budgets as
``chunked_prefill_size * 1.5 MB + cuda_graph_max_bs * 2 MB``.

Servers are started one after another, each once the one before it is healthy, with
``f = (weights + KV pool) / free memory measured just before it starts``: every server then
reserves what it needs however many servers came before it, and no server measures its free
memory while another is still loading (the race that made side-by-side starts fragile).

Configurations that do not all fit are run in groups: the anchor (the configuration every
ratio divides by) is in every group and its server stays up across groups, so each group's
repeats are paired against the anchor measured in the same repeats.

Pure functions of sizes, so the plan is tested on CPU with made-up numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
MiB = 1 << 20
#: Part of the static reservation beyond weights + KV pool: the server's own CUDA context
#: (created before SGLang measures its free memory) and allocator rounding.
STATIC_SLACK = 1 * GiB
#: Linear-attention (Gated DeltaNet) recurrent states per running request that SGLang keeps
#: with the radix cache on: 3 (``MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO``) + 2 ping-pong
#: buffers of the extra-buffer strategy with the overlap scheduler.
MAMBA_STATES_PER_REQUEST = 5
#: SGLang's default ``mamba_full_memory_ratio``: recurrent states get 0.9 / 1.9 of the pool.
MAMBA_FULL_MEMORY_RATIO = 0.9
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class MemoryPlanError(ValueError):
    """The configurations cannot be served on this GPU; the message has the numbers."""


def weights_bytes(model_dir) -> tuple[int, str]:
    """(bytes, how they were found) of the checkpoint's weights: the safetensors files SGLang
    loads (else ``*.bin``), else the ``total_size`` of a safetensors index (the parameter
    bytes the checkpoint declares)."""
    path = Path(model_dir)
    for pattern in ("*.safetensors", "*.bin"):
        files = sorted(path.glob(pattern))
        if files:
            return sum(f.stat().st_size for f in files), f"{len(files)} {pattern} file(s)"
    index = path / "model.safetensors.index.json"
    if index.exists():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if isinstance(total, int) and total > 0:
            return total, f"{index.name} metadata.total_size"
    raise MemoryPlanError(f"{path}: no *.safetensors or *.bin weights and no safetensors index "
                          "with metadata.total_size: cannot tell how much GPU memory a server "
                          "needs (serve a local checkpoint directory)")


def _dtype_bytes(cfg: Mapping) -> int:
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    return _DTYPE_BYTES.get(name, 2)


def _int(cfg: Mapping, key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or value <= 0:
        raise MemoryPlanError(f"config.json has no positive integer {key!r} (top level or "
                              "text_config): cannot estimate the KV pool")
    return value


def attention_layers(cfg: Mapping) -> tuple[int, int]:
    """(full-attention layers, linear-attention layers) of a text config."""
    layers = _int(cfg, "num_hidden_layers")
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        linear = sum(t == "linear_attention" for t in types)
        return layers - linear, linear
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0 and "linear_num_value_heads" in cfg:
        full = layers // interval
        return full, layers - full
    return layers, 0


def kv_bytes_per_token(cfg: Mapping) -> int:
    """K and V of every full-attention layer for one token, in the checkpoint's dtype (SGLang's
    ``--kv-cache-dtype auto``)."""
    full, _ = attention_layers(cfg)
    heads = _int(cfg, "num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or _int(cfg, "hidden_size") // heads
    return 2 * full * kv_heads * head_dim * _dtype_bytes(cfg)


def recurrent_state_bytes(cfg: Mapping) -> int:
    """One request's Gated DeltaNet states (conv window in the checkpoint dtype, SSM state in
    float32, SGLang's default ``mamba_ssm_dtype``); 0 for a model without linear attention."""
    _, linear = attention_layers(cfg)
    if not linear:
        return 0
    k_heads, v_heads = _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_num_value_heads")
    k_dim, v_dim = _int(cfg, "linear_key_head_dim"), _int(cfg, "linear_value_head_dim")
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    conv = conv_dim * (cfg.get("linear_conv_kernel_dim", 4) - 1) * _dtype_bytes(cfg)
    ssm = v_heads * k_dim * v_dim * 4
    return linear * (conv + ssm)


def default_chunked_prefill(total_bytes: int) -> int:
    """The chunked-prefill size SGLang picks for a GPU of this size when the flag is left to
    it (0.5.11 and 0.5.23 ``_handle_gpu_memory_settings``; the larger where they differ)."""
    mib = total_bytes / MiB
    for limit, chunk in ((20 * 1024, 2048), (60 * 1024, 4096), (160 * 1024, 8192)):
        if mib < limit:
            return chunk
    return 16384


@dataclass(frozen=True)
class ServerNeed:
    """GPU memory of one server: ``static`` is what its ``--mem-fraction-static`` must reserve
    (weights + KV pool + slack), ``total`` adds activations and CUDA graphs."""

    weights: int
    kv_pool: int
    activations: int

    @property
    def static(self) -> int:
        return self.weights + self.kv_pool + STATIC_SLACK

    @property
    def total(self) -> int:
        return self.static + self.activations

    def describe(self) -> str:
        return (f"{self.total / GiB:.1f} GiB (weights {self.weights / GiB:.1f} + KV pool "
                f"{self.kv_pool / GiB:.1f} + slack {STATIC_SLACK / GiB:.0f} + activations and "
                f"graphs {self.activations / GiB:.1f})")


def server_need(cfg: Mapping, weights: int, *, max_total_tokens: int, max_running_requests: int,
                chunked_prefill: int, graph_max_bs: int, draft_tokens: int = 0) -> ServerNeed:
    """What one server of this checkpoint needs with the benchmark's flags.

    KV pool: ``max_total_tokens`` of full-attention K/V (the cap SGLang is given). A hybrid
    model also keeps `MAMBA_STATES_PER_REQUEST` recurrent states per running request with the
    radix cache on, and SGLang gives those only 0.9/1.9 of the pool, so the pool is sized for
    that share. ``draft_tokens`` (speculative decoding): the draft's one-layer KV pool and,
    for a hybrid, the per-draft-token states SGLang sets aside."""
    per_token = kv_bytes_per_token(cfg)
    states = recurrent_state_bytes(cfg) * max_running_requests * MAMBA_STATES_PER_REQUEST
    kv = per_token * max_total_tokens
    if states:
        kv = max(kv, math.ceil(states / MAMBA_FULL_MEMORY_RATIO)) + states
    if draft_tokens:
        full, _ = attention_layers(cfg)
        kv += per_token // max(full, 1) * max_total_tokens
        kv += recurrent_state_bytes(cfg) * max_running_requests * draft_tokens
    activations = int((chunked_prefill * 1.5 + graph_max_bs * 2) * MiB)
    return ServerNeed(weights, kv, activations)


def footprint(need: ServerNeed, free: int, fraction: float | None = None) -> tuple[float, int] | None:
    """(``--mem-fraction-static``, bytes taken) for a server started with ``free`` bytes free,
    or None when it cannot start there. Without ``fraction`` it gets exactly its static need;
    with one (``--mem-fraction``) it may take all of ``fraction * free``, which must hold its
    weights and KV pool."""
    if fraction is None:
        if need.total > free:
            return None
        return math.ceil(need.static / free * 1e4) / 1e4, need.total
    static = int(fraction * free)
    if static < need.static or static + need.activations > free:
        return None
    return fraction, static + need.activations


def twin_of(name: str, suffixes: Sequence[str]) -> str | None:
    """``NAME`` for ``NAME+suffix`` (its last variant suffix stripped), else None."""
    for suffix in suffixes:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name.removesuffix(suffix)
    return None


def twin_units(names: Sequence[str], anchor: str, suffixes: str | Sequence[str]) -> list[list[str]]:
    """The non-anchor configurations in order, each ``NAME+suffix`` kept in one unit with its
    plain twin ``NAME`` (their paired ratio needs them in the same repeats), transitively
    (``a``, ``a+pcg``, ``a+pcg+mtp``); the anchor's twins are units alone, since the anchor is
    in every group."""
    suffixes = (suffixes,) if isinstance(suffixes, str) else tuple(suffixes)
    present = [n for n in names if n != anchor]
    root = {n: n for n in present}

    def find(n):
        while root[n] != n:
            n = root[n]
        return n

    for name in present:
        twin = twin_of(name, suffixes)
        if twin in root:
            root[find(name)] = find(twin)
    def depth(n):  # plain twin first, then its variants
        d = 0
        while (n := twin_of(n, suffixes)) is not None:
            d += 1
        return d

    units: dict[str, list[str]] = {}
    for name in present:
        units.setdefault(find(name), []).append(name)
    return sorted((sorted(unit, key=lambda n: (depth(n), present.index(n))) for unit in units.values()),
                  key=lambda unit: min(present.index(n) for n in unit))


def _fits(names: Sequence[str], needs: Mapping[str, ServerNeed], free: int,
          fraction: float | None) -> bool:
    for name in names:
        taken = footprint(needs[name], free, fraction)
        if taken is None:
            return False
        free -= taken[1]
    return True


def plan_groups(names: Sequence[str], anchor: str, needs: Mapping[str, ServerNeed], free: int,
                total: int, *, fraction: float | None = None,
                units: Callable[[Sequence[str], str], list[list[str]]] | None = None
                ) -> list[list[str]]:
    """Groups of configurations, each starting with ``anchor``, whose servers fit in ``free``
    bytes when started one after another; as few groups as that allows, in the order given.
    Raises `MemoryPlanError` with every number when even the anchor with one other unit does
    not fit."""
    units = (units or (lambda n, a: [[x] for x in n if x != a]))(names, anchor)

    def refuse(what: str) -> MemoryPlanError:
        per = "; ".join(f"{n}: {needs[n].describe()}" for n in names)
        how = (f"--mem-fraction {fraction}: each server reserves {fraction} of the free memory "
               "it sees and needs its weights + KV pool within it" if fraction is not None
               else "servers started one after another")
        return MemoryPlanError(f"cannot serve {what} on this GPU: {free / GiB:.1f} GiB free of "
                               f"{total / GiB:.1f} GiB total ({how}). Per server: {per}")

    if not _fits([anchor], needs, free, fraction):
        raise refuse(f"the anchor {anchor!r} alone")
    groups: list[list[str]] = []
    current = [anchor]
    for unit in units:
        if _fits([*current, *unit], needs, free, fraction):
            current += unit
            continue
        if not _fits([anchor, *unit], needs, free, fraction):
            raise refuse(f"{' + '.join([anchor, *unit])} together")
        groups.append(current)
        current = [anchor, *unit]
    groups.append(current)
    return groups
