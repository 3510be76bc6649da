"""Fixtures shared by the packaging tests."""

from __future__ import annotations

import stat

import pytest


@pytest.fixture
def fake_python(tmp_path):
    """Stands in for the image's python: records the argv the entrypoint execs."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$ARGV_OUT\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script
