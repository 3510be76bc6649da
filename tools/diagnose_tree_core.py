"""Why SGLang 0.5.23's Rust TreeCore fails (or not) under the running torch: which tensor, which
kind, and what the extension was built for. Prints one line per probe; exit 0 always (a
diagnosis, not a test: tests/integration/test_tree_core_choice.py is the test).

    python tools/diagnose_tree_core.py

Each probe inserts one 3-token key into a fresh Rust TreeCore through SGLang's own adapter
class, with the value tensor in a different dtype/device; tch reads the tensor's scalar type
through the C++ headers the extension was compiled with. A kind number that is not the dtype's
(int64 is 4, int32 3, in c10::ScalarType order) for every dtype means the extension misreads the
tensor itself (a layout that differs between the torch it was built for and this one), not that
SGLang passed an unusual dtype.
"""

from __future__ import annotations

import importlib.metadata
import platform

import torch


def main() -> None:
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    pins = [r for r in importlib.metadata.requires("sglang") or () if r.startswith("torch==")]
    print(f"torch {torch.__version__} (cxx11 abi {torch.compiled_with_cxx11_abi()}, cuda "
          f"{torch.version.cuda}), SGLang {importlib.metadata.version('sglang')} pins {pins}, "
          f"python {platform.python_version()}")
    if adapter.TREE_CORE_REGISTRY is None:
        print(f"SGLang {adapter.version}: no Rust TreeCore")
        return
    from sglang.srt.mem_cache.rust_tree_core import extension

    print(f"extension: {getattr(extension.bindings, '__file__', extension.bindings)}")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for dtype in ("int64", "int32", "float32"):
            try:
                adapter.rust_tree_core_insert(device, dtype)
                print(f"{device} {dtype}: ok, the tree holds the 3 tokens")
            except BaseException as exc:  # noqa: BLE001 - a Rust panic arrives as any of these
                print(f"{device} {dtype}: {type(exc).__name__}: {' '.join(str(exc).split())[:240]}")
    for device in devices:
        print(f"adapter check on {device}: {adapter.rust_tree_core_problem(device) or 'passes'}")


if __name__ == "__main__":
    main()
