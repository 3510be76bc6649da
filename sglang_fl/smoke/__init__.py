"""Layer-isolated smoke suite: the same checks on a CPU host and inside every vendor image.

``python -m sglang_fl.smoke`` runs five checks, each in a fresh interpreter with its own
environment, so one layer's state can never make another pass:

====== ============================================ =========================================
layer  environment                                  what must happen
====== ============================================ =========================================
doctor the platform's defaults                      ``sglang-fl doctor`` reports a verdict
                                                    other than "cannot serve" (exit 0 or 1)
1      USE_FLAGGEMS=1, SGLANG_FL_OOT_ENABLED=0      FlagGems replaces ATen ops and a real op
                                                    lands in the FlagGems log; on a CPU host
                                                    Layer 1 must *report itself disabled* with
                                                    the reason (FlagGems needs a device)
2      USE_FLAGGEMS=0, SGLANG_FL_OOT_ENABLED=1      real SGLang RMSNorm / SiluAndMul go through
                                                    the dispatch bridge, match SGLang's native
                                                    forward, and the dispatch log names the
                                                    backend (reference on CPU, never reference
                                                    on a device)
3      USE_FLAGGEMS=0, SGLANG_FL_OOT_ENABLED=0      two processes, SGLang GroupCoordinator,
                                                    collectives delegated to CommunicatorFL
                                                    with exact results
all    the platform's defaults                      ``launch_server`` on a tiny random Qwen2
                                                    answers a /generate request
====== ============================================ =========================================

``--layer N`` runs one check in this process (what the suite runs in each child).
The suite is what ``nox -s smoke-cpu`` runs on the host and ``nox -s smoke-<vendor>`` runs in
the image (``docker run IMAGE smoke``).
"""

from __future__ import annotations

LAYERS = ("doctor", "1", "2", "3", "all")

# Switches each check pins; everything else comes from the platform / user configuration.
LAYER_ENV = {
    "doctor": {},
    "1": {"USE_FLAGGEMS": "1", "SGLANG_FL_OOT_ENABLED": "0"},
    "2": {"USE_FLAGGEMS": "0", "SGLANG_FL_OOT_ENABLED": "1"},
    "3": {"USE_FLAGGEMS": "0", "SGLANG_FL_OOT_ENABLED": "0"},
    "all": {},
}


class SmokeFailure(AssertionError):
    """A smoke check saw the wrong behaviour; the message says what and what was expected."""


class SmokeSkip(Exception):
    """A check that cannot run on this machine (e.g. Layer 3 on a one-device host)."""
