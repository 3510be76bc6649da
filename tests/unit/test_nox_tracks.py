"""noxfile's SGLANG_FREE_TESTS, the unit modules the SGLang 0.5.23 track leaves out, stay free of
SGLang: none imports it (at any depth of its own code, nor through what it imports at collection,
checked with an import hook that refuses ``sglang``), and the track really leaves each one out.
Under .ci/run (both tracks side by side) SIDE_TRACK_TESTS move to the 0.5.23 track: each free
module then still runs in exactly one of the two."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _nox_scope(*names: str) -> dict:
    """noxfile.py's module-level tuples and functions named ``names`` (and what they read of
    each other, in file order), run without importing nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    scope: dict = {"os": os}
    for node in tree.body:
        named = [getattr(t, "id", None) for t in getattr(node, "targets", ())] or [
            getattr(node, "name", None)]
        if set(named) & set(names):
            exec(compile(ast.Module([node], []), "noxfile.py", "exec"), scope)
    return scope


def _nox_tuple(name: str) -> list[str]:
    """A module-level tuple of noxfile.py, read without importing nox (its f-strings evaluated)."""
    return list(_nox_scope("SGLANG_FREE_TESTS", name)[name])


def _is_sglang(name) -> bool:
    return str(name).split(".")[0] == "sglang"


def _imports_sglang(node: ast.AST) -> bool:
    """``import sglang...``, ``from sglang... import``, or ``importorskip("sglang...")``."""
    if isinstance(node, ast.Import):
        return any(_is_sglang(a.name) for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and _is_sglang(node.module)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip":
        return any(isinstance(a, ast.Constant) and _is_sglang(a.value) for a in node.args)
    return False


def test_the_sglang_free_modules_exist_and_the_0_5_23_track_ignores_each():
    free = _nox_tuple("SGLANG_FREE_TESTS")
    track = _nox_tuple("SGLANG_0_5_23_TESTS")
    assert free and all((ROOT / path).is_file() for path in free), free
    assert all(f"--ignore={path}" in track for path in free)
    assert "tests/unit" in track  # the rest of tests/unit still runs there


def test_no_sglang_free_module_imports_sglang_itself():
    for path in _nox_tuple("SGLANG_FREE_TESTS"):
        tree = ast.parse((ROOT / path).read_text())
        found = [n.lineno for n in ast.walk(tree) if _imports_sglang(n)]
        assert not found, f"{path} imports SGLang at line(s) {found}: drop it from SGLANG_FREE_TESTS"


def test_the_sglang_free_modules_collect_with_sglang_unimportable(tmp_path):
    (tmp_path / "refuse_sglang.py").write_text(textwrap.dedent("""
        import sys

        class _Refuse:
            def find_spec(self, name, path=None, target=None):
                if name == "sglang" or name.startswith("sglang."):
                    raise ModuleNotFoundError(f"No module named {name!r} (refused)", name=name)

        sys.meta_path.insert(0, _Refuse())
        """))
    free = _nox_tuple("SGLANG_FREE_TESTS")
    env_path = os.pathsep.join((str(tmp_path), str(ROOT)))
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "refuse_sglang", "-p", "no:cacheprovider",
                        "--collect-only", "-q", *free], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": env_path}, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    # a module that skips itself without SGLang (importorskip at its top) needs it too
    assert "error" not in last and "skipped" not in last and "SKIPPED" not in r.stdout, r.stdout[-3000:]
    # the hook was live: SGLang itself cannot be imported under it
    probe = subprocess.run([sys.executable, "-c", "import refuse_sglang, sglang"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": env_path},
                           timeout=120)
    assert probe.returncode != 0 and "(refused)" in probe.stderr


def test_side_by_side_each_free_module_runs_in_exactly_one_track():
    nox = _nox_scope("SGLANG_FREE_TESTS", "SGLANG_0_5_23_TESTS", "SIDE_TRACK_TESTS", "track_args")
    free, moved, track_args = nox["SGLANG_FREE_TESTS"], nox["SIDE_TRACK_TESTS"], nox["track_args"]
    assert moved and set(moved) < set(free)

    def runs(args, path):  # a named file runs unless --ignore'd, even inside a named folder
        return f"--ignore={path}" not in args and (path in args or "tests/unit" in args
                                                   or "tests" in args)

    for together in (False, True):
        main, side = track_args(True, together), track_args(False, together)
        assert main[0] == "tests" and side[:1] == ("tests/unit",)
        for path in free:
            where = [runs(main, path), runs(side, path)]
            assert where == ([False, True] if together and path in moved else [True, False]), (
                together, path, main, side)
    # the rest of the 0.5.23 track is as it runs alone
    def rest(args):
        return [a for a in args if a.removeprefix("--ignore=") not in moved]

    assert rest(track_args(False, True)) == rest(nox["SGLANG_0_5_23_TESTS"])
    # .ci/run is where they run side by side, and says so
    assert "export SGLANG_FL_TEST_SIDE_BY_SIDE=1" in (ROOT / ".ci" / "run").read_text()
