"""README_zh.md keeps pace with README.md (most of the product's users read Chinese first):
the same sections in the same order, the same commands in its code blocks, and every variable,
nox session and file the English README names."""

from __future__ import annotations

import re

from pkg_helpers import ROOT

EN = (ROOT / "README.md").read_text(encoding="utf-8")
ZH = (ROOT / "README_zh.md").read_text(encoding="utf-8")


def code_lines(text: str) -> list[str]:
    """Lines of the fenced code blocks, comments dropped (those are translated)."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).rstrip()
            if line and not line.lstrip().startswith("#"):
                lines.append(line)
    return lines


def test_same_sections_in_the_same_order():
    assert len(re.findall(r"^## ", EN, re.M)) == len(re.findall(r"^## ", ZH, re.M))
    assert len(re.findall(r"^\| ", EN, re.M)) == len(re.findall(r"^\| ", ZH, re.M)), \
        "every table row has its translation"


def test_same_commands():
    assert code_lines(ZH) == code_lines(EN)


def test_every_name_of_the_english_readme_is_in_the_chinese_one():
    names = set(re.findall(r"`([^`\s]*(?:SGLANG_|FLAGCX_|USE_FLAGGEMS)[^`\s]*)`", EN))
    names |= set(re.findall(r"nox -s ([a-z-]+)", EN))
    names |= set(re.findall(r"`((?:docs|docker|deploy|ci|requirements)/[^`\s]*)`", EN))
    missing = sorted(n for n in names if n not in ZH)
    assert missing == []
    assert "README_zh.md" in EN and "README.md" in ZH


def test_every_command_the_english_readme_names_is_in_the_chinese_one():
    """``sglang-fl <command>`` for each subcommand of the CLI the English README names."""
    import argparse

    from sglang_fl.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    named = {c for c in sub.choices if re.search(rf"sglang-fl {c}\b", EN)}
    assert {"config", "ops", "doctor"} <= named
    assert sorted(c for c in named if not re.search(rf"sglang-fl {c}\b", ZH)) == []
