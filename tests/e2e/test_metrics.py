"""``launch_server --enable-metrics``: after a served request, SGLang's ``/metrics`` carries the
sglang_fl_* series next to its own (prometheus multiprocess mode: the HTTP process exports what
the scheduler process recorded).

The server runs two fallbacks on purpose: ``rms_norm`` asks for flagos first, which has no
device here (``unavailable``), and ``silu_and_mul`` is led by a vendor package whose impl raises
on every call (``raised``: the first call falls back to reference for good). The TP=2 server's
collective counts are checked on tests/distributed/test_tp_e2e.py's TP=2 server.
"""

from __future__ import annotations

import importlib.metadata

import pytest
from e2e_support import SERVER_ARGS, greedy_ids, hermetic_env, launch

from sglang_fl.dispatch.ops import OPS
from tests.integration.vendor_package import write_vendor_package

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def raising_vendor(tmp_path_factory):
    """An installed vendor package (entry point ``sglang_fl.vendors``) whose silu_and_mul raises."""
    return write_vendor_package(tmp_path_factory.mktemp("raising-vendor"), "raising", methods="""
        def silu_and_mul(self, obj, x):
            raise RuntimeError("kernel launch failed (test vendor)")
        """)


@pytest.fixture(scope="module")
def scraped(tiny_model, prompt_ids, raising_vendor, tmp_path_factory):
    """The /metrics text after one /generate request, parsed: {(name, labels): value}."""
    pytest.importorskip("prometheus_client", reason="--enable-metrics needs prometheus-client "
                        "(in the stack's requirements)")
    import os

    from prometheus_client.parser import text_string_to_metric_families

    run_dir = tmp_path_factory.mktemp("metrics")
    env = hermetic_env(run_dir, SGLANG_FL_PER_OP="rms_norm=flagos|reference;"
                                                "silu_and_mul=vendor|reference",
                       PYTHONPATH=os.pathsep.join(filter(None, [str(raising_vendor),
                                                                os.environ.get("PYTHONPATH")])))
    with launch(tiny_model, (*SERVER_ARGS, "--enable-metrics"), env, run_dir / "server.log") as srv:
        ids = greedy_ids(srv, prompt_ids[:1])
        status, body = srv.request("GET", "/metrics")
    assert status == 200
    text = body.decode() if isinstance(body, bytes) else str(body)
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return {"ids": ids, "samples": samples, "text": text}


def _series(scraped, name):
    return {labels: v for (n, labels), v in scraped["samples"].items() if n == name}


def test_sglangs_own_series_are_there_too(scraped):
    assert any(n.startswith("sglang:") for n, _ in scraped["samples"])
    assert len(scraped["ids"][0]) > 0


def test_info_names_the_install(scraped):
    (labels, value), = _series(scraped, "sglang_fl_info").items()
    info = dict(labels)
    assert value == 1
    assert info["sglang"] == importlib.metadata.version("sglang")
    assert info["torch"] == importlib.metadata.version("torch")
    assert info["version"] == importlib.metadata.version("sglang_fl")
    assert (info["platform"], info["dist_backend"], info["empty_mode"]) == ("cpu", "gloo", "true")
    assert "sgl_kernel" in info["standins"].split(",")


def test_routes_name_the_impl_of_every_op_and_bucket(scraped):
    routes = _series(scraped, "sglang_fl_op_route")
    running = {(d["op"], d["bucket"]): d["impl"] for d in map(dict, (k for k, v in routes.items() if v == 1))}
    for spec in OPS:
        for bucket in ("decode", "prefill"):
            assert running[(spec.name, bucket)] == "reference", (spec.name, bucket)
    # silu_and_mul started on the raising vendor and left it after its first call
    assert routes[(("bucket", "decode"), ("impl", "vendor.raising"), ("op", "silu_and_mul"))] == 0


def test_fallbacks_have_their_reason_class(scraped):
    fallbacks = {tuple(v for _, v in labels): n
                 for labels, n in _series(scraped, "sglang_fl_fallbacks_total").items()}
    # labels sorted by name: from_impl, op, reason, to_impl
    assert fallbacks[("flagos", "rms_norm", "unavailable", "reference")] == 1
    assert fallbacks[("vendor.raising", "silu_and_mul", "raised", "reference")] == 1
    assert {k[2] for k in fallbacks} == {"unavailable", "raised"}


def test_no_standin_was_called_and_no_collective_at_tp1(scraped):
    assert _series(scraped, "sglang_fl_standin_calls_total") == {}
    assert _series(scraped, "sglang_fl_collectives_total") == {}
