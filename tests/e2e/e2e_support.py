"""Helpers of the end-to-end suite (imported by its tests and its conftest).

The servers run ``--dtype float32``: for a float32 checkpoint SGLang's ``auto`` picks float16,
while the reference ids come from HF transformers in float32; the same precision on both sides
is what makes exact greedy-id equality a fair test.

Servers start with SGLang's own defaults for everything a user leaves alone (radix cache,
chunked prefill, graphs): a check that turns one off serves differently from its users. A test
that is about one of those options sets it and says so.

Every server started through `serve` / `launch` has its log registered (`SERVER_LOGS`): when a
test fails, the e2e conftest prints the failure and that log's tail at once and writes both
under ``$OUT/served-failures/``.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from sglang_fl.serving import launched_server

MAX_NEW_TOKENS = 12
PROMPT_TEXTS = (
    "The server answered the question about the kernel.",
    "Hello world, please write a small model",
    "Yes",
)
SERVER_ARGS = ("--dtype", "float32")
EXPECTED_DISPATCH = {
    "RMSNorm": "[OOT-DISPATCH] RMSNorm → reference(reference)",
    "SiluAndMul": "[OOT-DISPATCH] SiluAndMul → reference(reference)",
    "RotaryEmbedding": "[OOT-DISPATCH] RotaryEmbedding → reference(reference)",
}


def hermetic_env(tmp_path: Path, **overrides) -> dict:
    """Drop every sglang-fl/SGLang plugin variable of the test process, then apply ``overrides``;
    the dispatch log goes to a fresh file."""
    env = {k: None for k in os.environ
           if k.startswith("SGLANG_FL_") or k in ("USE_FLAGGEMS", "SGLANG_PLUGINS", "SGLANG_PLATFORM")}
    env["SGLANG_FL_DISPATCH_LOG"] = str(tmp_path / "dispatch.log")
    env.update(overrides)
    return env


def process_env(tmp_path: Path, **overrides) -> dict:
    """The whole environment for a child process: this one's, made hermetic (`hermetic_env`)."""
    env = dict(os.environ)
    for key, value in hermetic_env(tmp_path, **overrides).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


#: (test node id, server log) of every server started here, in order (see `register_log`).
SERVER_LOGS: list[tuple[str, Path]] = []


def current_test() -> str:
    """The node id of the test pytest is running (setup, call or teardown), or ""."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def register_log(log_path: Path) -> None:
    """Name ``log_path`` as the log of a server the current test (or the fixture it is setting
    up) started, for the failure report of the e2e conftest."""
    SERVER_LOGS.append((current_test(), Path(log_path)))


def launch(model, args: Sequence[str], env: Mapping[str, str | None], log_path: Path,
           timeout: float = 240):
    """`launched_server` with its log registered (`register_log`)."""
    register_log(log_path)
    return launched_server(model, args, env, log_path=log_path, timeout=timeout)


def serve(model, tmp_path: Path, timeout: float = 240, *, args: Sequence[str] = SERVER_ARGS,
          **env_overrides):
    """A server of ``model`` with ``args`` (float32 by default), the hermetic environment plus
    ``env_overrides``, its log in ``tmp_path``."""
    return launch(model, args, hermetic_env(tmp_path, **env_overrides), tmp_path / "server.log",
                  timeout)


#: Pool caps of a server that shares its GPU (`shared_gpu_args`): what a few short prompts
#: need with room to spare. The CPU platform caps the same two pools for the same reason
#: (sglang_glue/server_defaults.py).
SHARED_GPU_MAX_TOTAL_TOKENS = 32768
SHARED_GPU_MAX_MAMBA_CACHE_SIZE = 256


#: Checkpoints the GPU verify makes ahead of its empty-mode servers (``SGLANG_FL_TEST_MODELS``,
#: `made_ahead`): name -> (preset, make_tiny_model options). Qwen3.6-27B's layers take most of
#: a served test's three minutes to write on the CPU (H100, 2026-12-05: 227 s of which the
#: server ~20 s); the verify writes it beside its JIT warm-up instead.
MADE_AHEAD = {"qwen3.6-27b-4l": ("qwen3.6-27b", {"num_layers": 4, "vocab_size": 32768})}


#: The marker a writer of ``$SGLANG_FL_TEST_MODELS`` keeps there while it writes (`made_ahead`
#: waits for it to go; `make_ahead` removes it also when writing fails).
WRITING = ".writing"


def ahead_wait_seconds() -> float:
    """How long `made_ahead` waits for that writer: ``SGLANG_FL_TEST_AHEAD_WAIT`` (the GPU verify
    sets it below its empty-mode timeout, so a slow writer is named rather than killed), else
    900 s."""
    return float(os.environ.get("SGLANG_FL_TEST_AHEAD_WAIT", "900"))


def made_ahead(name: str, tmp_path_factory) -> Path:
    """The checkpoint ``name`` of `MADE_AHEAD`: under ``$SGLANG_FL_TEST_MODELS`` where set (made
    there ahead, or now; while the folder holds `WRITING`, first wait for the writer), else in
    a fresh temporary folder."""
    import time

    from sglang_fl.models import make_tiny_model

    preset, options = MADE_AHEAD[name]
    root = os.environ.get("SGLANG_FL_TEST_MODELS")
    if not root:
        return make_tiny_model(tmp_path_factory.mktemp("model") / name, preset=preset, **options)
    wait = ahead_wait_seconds()
    deadline = time.monotonic() + wait
    while (Path(root) / WRITING).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{root}/{WRITING} still there after {wait:g} s: the checkpoints "
                               "written ahead did not finish in time")
        time.sleep(1)
    return make_tiny_model(Path(root) / name, preset=preset, **options)


def make_ahead(root: str) -> None:
    """Write every `MADE_AHEAD` checkpoint under ``root`` (``python tests/e2e/e2e_support.py
    ROOT``, from the GPU verify), with `WRITING` there until it ends, also by an error. Each is
    written beside its place and moved in whole, so a reader never sees half of one; one
    already there whole is reused, a leftover of a killed writer replaced."""
    import shutil

    from sglang_fl.models import make_tiny_model
    from sglang_fl.models.tiny import MANIFEST

    marker = Path(root) / WRITING
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    try:
        for name, (preset, options) in MADE_AHEAD.items():
            final, partial = Path(root) / name, Path(root) / f"{name}.partial"
            if final.exists() and not (final / MANIFEST).exists():
                shutil.rmtree(final)  # a killed writer's (before this was atomic)
            if not final.exists():
                shutil.rmtree(partial, ignore_errors=True)
                make_tiny_model(partial, preset=preset, **options)
                os.replace(partial, final)
            print(make_tiny_model(final, preset=preset, **options), flush=True)  # checks it
    finally:
        marker.unlink(missing_ok=True)


def shared_mem_fraction(workers: int) -> float:
    """Each server's ``--mem-fraction-static`` beside ``workers - 1`` others: ``0.8 / workers``,
    or ``SGLANG_FL_TEST_MEM_FRACTION`` when set. The GPU verify sets it where other work (the
    GPU suite, a smoke) shares the card too: with the pools capped, the fraction is only the
    margin for what others allocate while this server loads, so there it is larger."""
    raw = os.environ.get("SGLANG_FL_TEST_MEM_FRACTION")
    if raw is None:
        return 0.8 / workers
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:
        raise ValueError(f"SGLANG_FL_TEST_MEM_FRACTION={raw!r}: expected a number between 0 and 1 "
                         "(each served test's --mem-fraction-static)")
    return value


def shared_gpu_args(hybrid: bool = False) -> tuple[str, ...]:
    """Arguments that let the servers of ``pytest -n N`` (pytest-xdist, one server per worker)
    share one GPU; none for a run without workers, which keeps SGLang's own memory defaults.

    SGLang sizes its KV pool (and a hybrid model's state pool) as the memory free after its
    weights load less ``1 - mem_fraction_static`` of what was free before they loaded: what
    other servers allocate in between comes out of it, and past that margin the server does
    not start. Beside N - 1 others each server gets ``0.8 / N`` and its pools are capped, so
    what the others allocate meanwhile (capped pools, weights, graphs) stays well inside its
    margin; uncapped, each pool would fill its server's share and leave the next none."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return ()
    args = ("--mem-fraction-static", f"{shared_mem_fraction(workers):.2f}",
            "--max-total-tokens", str(SHARED_GPU_MAX_TOTAL_TOKENS))
    if hybrid:
        args += ("--max-mamba-cache-size", str(SHARED_GPU_MAX_MAMBA_CACHE_SIZE))
    return args


def greedy_ids(server, prompt_ids, max_new_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    body = server.post_json("/generate", {
        "input_ids": prompt_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    })
    return [item["output_ids"] for item in body]


def hf_greedy_ids(model_path, prompt_ids, device: str = "cpu") -> list[list[int]]:
    """Greedy continuations from HF transformers (float32), no EOS stop: the ground truth.
    On a GPU the model's memory is given back before this returns: servers started next (or
    beside, under pytest-xdist) size their pools from the free memory."""
    from sglang_fl.models.hf_reference import hf_greedy_ids as greedy

    return greedy(model_path, prompt_ids, MAX_NEW_TOKENS, device)


def dispatch_lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "dispatch.log"
    return sorted(path.read_text(encoding="utf-8").splitlines()) if path.exists() else []


def standin_calls_in(log_text: str) -> list[str]:
    from sglang_fl.compat import CALL_LOG_PREFIX

    return [line for line in log_text.splitlines() if CALL_LOG_PREFIX in line]


def installed(dist: str) -> bool:
    """Whether the distribution ``dist`` is installed (the real package, not a stand-in)."""
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


if __name__ == "__main__":
    import sys

    make_ahead(sys.argv[1])
