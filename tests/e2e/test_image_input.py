"""An image sent to a Qwen3.5 image-text model served without torchvision (empty mode: the
torchvision import stand-in): the request gets a 400 whose message names the missing package
and what to install, and the server keeps serving. (SGLang answered a bare 500 "Internal Server
Error" before the stand-in's error became a ValueError, which its HTTP handlers report.)
Skipped where a working torchvision is installed: the image is then processed for real."""

from __future__ import annotations

import base64
import io

import pytest
from e2e_support import installed, serve

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

if installed("torchvision"):
    pytest.skip("torchvision is installed: images are processed for real (or fail in it)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from sglang_fl.models import make_tiny_model

    work = tmp_path_factory.mktemp("image-input")
    model = make_tiny_model(work / "tiny-qwen3.5", preset="qwen3.5")
    with serve(model, work, timeout=400) as srv:
        yield srv


def _png() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_an_image_without_torchvision_gets_a_400_naming_it_and_the_server_keeps_serving(server):
    status, body = server.request("POST", "/generate", {
        "text": "<|vision_start|><|image_pad|><|vision_end|>What is this?", "image_data": _png(),
        "sampling_params": {"max_new_tokens": 4}})
    assert status == 400, (status, body)
    message = body["error"]["message"]
    assert "torchvision" in message and "not installed" in message
    assert "image/video inputs need a torchvision build" in message
    assert server.healthy()
    answer = server.post_json("/generate", {"text": "Still there?",
                                            "sampling_params": {"max_new_tokens": 2}})
    assert answer["meta_info"]["completion_tokens"] == 2
