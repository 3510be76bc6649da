"""Developer and CI sessions. ``python3 -m nox -s tests`` is the test command of the README and
of .ci/run: it builds a fresh venv with the tested CPU stack (SGLang 0.5.11 in empty mode,
torch 2.13.0 CPU) and runs the whole suite."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

CPU_STACK = "requirements/sglang-0.5.11-cpu.txt"
NO_DEPS = ("sglang==0.5.11", "flag_gems==5.0.2")


def install_cpu_stack(session: nox.Session) -> None:
    session.install("-r", CPU_STACK)
    session.install("--no-deps", *NO_DEPS)
    session.install("--no-deps", ".")
    session.install("pytest>=8", "pytest-timeout>=2.3")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    install_cpu_stack(session)
    session.run("python", "-m", "pytest", "tests", *session.posargs)


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """Serve the embedded tiny model with the plugin and print one chat reply."""
    install_cpu_stack(session)
    session.run("sglang-fl", "demo", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "sglang_fl", "tests", "benchmarks", "noxfile.py")
