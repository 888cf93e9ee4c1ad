"""apexkit sessions. `nox -l` lists them; options go after `--` (`nox -s build-3.11 -- --help`); `nox` alone runs lint.

build-<python>  build the Apex for Ascend wheel for that Python (the list comes from matrix.toml)
build-cuda-<python>  build upstream NVIDIA apex for CUDA GPUs (matrix.toml [cuda]; -- --cuda-arch "9.0")
build-<id>      one combination of matrix.toml [[matrix.include]], e.g. build-py3.11-torch2.13.0-x86_64 (-t matrix: all)
build-<stack>   one training stack of matrix.toml [stacks], e.g. build-mindspeed-llm-2.3.0 (-t stack: all)
matrix          the matrix as a table / JSON / GitHub Actions matrix (-- --format github); -- --run builds it
build-bench     cold vs cached vs -j1/-jN build times (maintainers: tools/buildbench.py)
lock            requirements/*.in -> the hashed locks (requirements/runtime.txt, requirements/dev.txt); -- --check
                (maintainers: tools/pins.py)
contracts       every torch_npu / apex name bench/ uses, checked in real wheels and apex trees (tools/contracts.py)
refresh         matrix.toml [torch_npu.versions] against the package index; -- --write applies it (tools/refresh.py)
docs            docs/commands.md's option tables from the command declarations; -- --check (tools/docgen.py)
validate        environment checks in the built wheel's venv (bench/validate_env.py)
bench           FP32 vs AMP benchmark in the built wheel's venv (bench/amp_bench.py)
tests-unit      the fast tier, tests/unit: in-process, no daemons, no network; installs and starts nothing
tests-installed apexkit's own sdist and wheel installed in fresh venvs (3.8-3.13), run from another directory
tests-e2e       tests/e2e: real venvs, git, compilers, tinyproxy, dockerd, Slurm, servers on 127.0.0.1; installs
                system tools only when asked: APEXKIT_INSTALL_SYSTEM_TOOLS=1 or CI=true, as root
tests           every tier in one pytest run (unit, installed, e2e), installing as tests-e2e does
tests-aarch64   aarch64 builder image and wheel under QEMU
lint            ruff check, mypy over apexkit/, shellcheck over docker/*.sh, bench/*.sh and .ci/run, actionlint, and last
                ruff format --check (line length 100; ruff check allows 130)

One invocation, one wheel: `nox -s build-3.8 bench -- ARGS` benches the wheel build-3.8 wrote and stops when that build
failed, never taking another from dist/. Every session gets the same ARGS: each takes the options it knows and names,
in one line, those it leaves to another session of the invocation (--device to validate/bench, --jobs to the build);
docs/validate.md.
"""

import sys
from pathlib import Path

import nox

sys.path.insert(
    0, str(Path(__file__).resolve().parent)
)  # nox does not put the noxfile's directory on sys.path

from apexkit import vocab
from apexkit.errors import ApexkitError
from apexkit.plan import matrix

vocab.set_entry(
    vocab.NOX
)  # messages name nox sessions, also in the sessions that skip run_in_session

try:  # the sessions come from matrix.toml: a broken file is one line, not a traceback at import
    _MATRIX = matrix.load()
    _COMBINATIONS = _MATRIX.combinations()
except ApexkitError as _exc:
    sys.exit(f"error: {_exc.format()}")

# A bare `nox` runs lint only: it is quick and changes nothing outside the checkout. The tests are asked for by name
# (`nox -s tests-unit`, `nox -s tests-e2e`, or both as `nox -s tests`): the e2e tier starts daemons and, where asked
# to (APEXKIT_INSTALL_SYSTEM_TOOLS=1 or CI=true), installs system packages; a default that lists the sessions
# instead would leave a bare `nox` doing nothing useful.
nox.options.sessions = ["lint"]
nox.options.default_venv_backend = (
    "none"  # apexkit makes its own venvs (virtualenv, found interpreters)
)


def _build_session(python: str, backend: str = "") -> None:
    """build-<python> (Ascend), or with `backend` "cuda" build-cuda-<python> (upstream NVIDIA apex)."""
    name = f"build-{backend}-{python}" if backend else f"build-{python}"

    def build(session: nox.Session) -> None:
        from apexkit import commands, noxrun

        prog = f"nox -s {name} --"
        first = ["--backend", backend] if backend else []
        noxrun.build(
            session, lambda argv: commands.build_wheel(python, [*first, *argv], prog=prog), prog
        )

    build.__doc__ = (
        f"Build upstream NVIDIA apex for CUDA GPUs for Python {python} (--backend cuda)."
        if backend
        else f"Build the Apex for Ascend wheel for Python {python} into dist/ (-- --help for options)."
    )
    tags = ["build-cuda"] if backend else ["build"]
    nox.session(name=name, python=False, default=False, tags=tags)(build)


for _python in _MATRIX.session_pythons:
    _build_session(_python)
for _python in _MATRIX.cuda.get("default_torch", {}):
    _build_session(_python, "cuda")


def _combination_session(combo: matrix.Combination) -> None:
    def build(session: nox.Session) -> None:
        from apexkit import commands, noxrun
        from apexkit.fleet import matrixrun

        m, prog = matrix.load(), f"nox -s build-{combo.id} --"

        def go(argv: "list[str]"):
            m.validate(combo)
            return commands.build_wheel(
                combo.python, argv, prog=prog, given=matrixrun.build_options(m, combo)
            )

        noxrun.build(session, go, prog)

    build.__doc__ = (
        ("Stack" if combo.stack else "Matrix")
        + f": Python {combo.python}, torch {combo.torch}"
        + (f", torch_npu {combo.torch_npu}" if combo.torch_npu else "")
        + f", {combo.arch} ({combo.ref})."
    )
    nox.session(
        name=f"build-{combo.id}",
        python=False,
        default=False,
        tags=["matrix", combo.arch, f"py{combo.python}", *(["stack"] if combo.stack else [])],
    )(build)


for _combo in _COMBINATIONS:
    _combination_session(_combo)


@nox.session(name="matrix", python=False, default=False)
def matrix_session(session: nox.Session) -> None:
    """The build matrix: -- --format github (GitHub Actions JSON) | json | table; -- --run [--parallel N] builds it."""
    from apexkit.exits import run_in_session
    from apexkit.fleet import matrixrun

    run_in_session(session, lambda: matrixrun.main(session.posargs))


def _dev_tool(session: nox.Session, name: str):
    """A module of tools/ (the maintainers' tools: locks, the tests' system tools, build timing, API contracts, the
    torch_npu table's refresh): in a checkout only, not in an installed apexkit, whose noxfile copy then stops with
    one line instead of an ImportError."""
    import importlib

    try:
        return importlib.import_module(f"tools.{name}")
    except ImportError:
        session.error(
            f"tools/{name}.py is part of a checkout of apexkit, not of an installed one: run this session "
            "from a git clone (the README's commands)"
        )


@nox.session(name="build-bench", python=False, default=False, tags=["bench"])
def build_bench(session: nox.Session) -> None:
    """Measure cold build, cached rebuild and -j1 vs -jN compile (numbers for the README, not a test)."""
    _dev_tool(session, "buildbench").main(session.posargs)


@nox.session(name="lock", python=False, default=False)
def lock(session: nox.Session) -> None:
    """requirements/*.in -> requirements/runtime.txt and requirements/dev.txt, hashed, for Python 3.8-3.13 (uv pip
    compile); -- --check compares them with the .in files and writes nothing."""
    from apexkit.exits import run_in_session
    from apexkit.wheel import uvtools

    pins = _dev_tool(session, "pins")

    def go() -> None:
        uv = uvtools.find()
        if uv is None and "--check" not in session.posargs:
            session.error("uv is not installed: pip install -r requirements/runtime.txt brings it")
        if pins.lock(uv.binary if uv else "", only_check="--check" in session.posargs):
            session.error("a lock does not match its requirements/*.in: run nox -s lock")

    run_in_session(session, go)


@nox.session(python=False, default=False)
def contracts(session: nox.Session) -> None:
    """Check every torch_npu and apex name and keyword bench/ uses against real torch_npu wheels and Ascend apex trees
    (read, never imported): release x ref -> ok/drift; fails on a drift; -- --help for the options."""
    from apexkit.exits import run_in_session

    tool = _dev_tool(session, "contracts")
    if run_in_session(session, lambda: tool.main(session.posargs)):
        session.error(
            "bench/ uses a name the checked torch_npu or apex lacks (the drift lines above)"
        )


@nox.session(python=False, default=False)
def refresh(session: nox.Session) -> None:
    """matrix.toml [torch_npu.versions] against the torch-npu releases on the package index (pip's index, proxy and
    CA bundle); -- --write applies the difference, -- --help for the options."""
    from apexkit.exits import run_in_session

    tool = _dev_tool(session, "refresh")
    run_in_session(session, lambda: tool.main(session.posargs))


@nox.session(python=False, default=False)
def docs(session: nox.Session) -> None:
    """docs/commands.md's option tables, generated from the command declarations (apexkit/commands.py); -- --check
    writes nothing and fails when the committed tables differ."""
    if _dev_tool(session, "docgen").main(session.posargs):
        session.error("docs/commands.md differs from the declarations: run nox -s docs")


@nox.session(python=False, default=False)
def install(session: nox.Session) -> None:
    """Install the apexkit wheel that fits a venv (index hit, else build), torch untouched; -- --venv DIR --index URL."""
    from apexkit import commands

    code = commands.main("install", session.posargs, prog="nox -s install --")
    if code:
        session.error(f"apexkit install failed (exit {code})")


@nox.session(python=False, default=False, tags=["bench"])
def validate(session: nox.Session) -> None:
    """Check the environment for the built wheel (torch, torch_npu, CANN, apex, device, AMP step); -- --device cpu|npu|cuda.
    After a build-* session in the same invocation: that build's wheel, or a stop when it failed."""
    from apexkit import noxrun

    noxrun.run(session, "validate")


@nox.session(python=False, default=False, tags=["bench"])
def bench(session: nox.Session) -> None:
    """FP32 vs AMP benchmark in the built wheel's venv (JSON, Markdown, PNG); -- --device cpu --model qwen3-block.
    After a build-* session in the same invocation: that build's wheel, or a stop when it failed."""
    from apexkit import noxrun

    noxrun.run(session, "bench")


def _test_env(session: nox.Session) -> "dict[str, str]":
    """Only when asked (APEXKIT_INSTALL_SYSTEM_TOOLS=1, or CI=true) and where it can (root + apt): install every system
    tool the tests need (git, patch, g++, binutils, tinyproxy, docker.io, debootstrap, qemu-user-static,
    binfmt-support), register qemu-aarch64, and make a missing service a failure instead of a skip. Otherwise nothing
    is installed: missing build tools stop the session with the command that installs them, and the tests that need a
    missing service skip with the reason (tools.testtools)."""
    import os

    from apexkit.exits import run_in_session
    from apexkit.images import cli

    testtools = _dev_tool(session, "testtools")
    systools = _dev_tool(session, "systools")

    plan = testtools.decide(os.environ, systools.can_install())
    if plan.missing_build_tools:
        session.error(
            f"missing build tools: {', '.join(plan.missing_build_tools)} -- next: "
            f"{testtools.install_command(plan.missing_build_tools)} (or {testtools.OPT_IN}=1 as root)"
        )
    if plan.not_installed:
        session.log(
            f"not installing {', '.join(testtools.packages(plan.not_installed))} (the tests that need them "
            f"skip): {testtools.install_command(plan.not_installed)}, or {testtools.OPT_IN}=1 as root"
        )
    if not plan.install and not plan.register_binfmt:
        return {}
    installed = systools.ensure(plan.install)
    if installed:
        session.log(f"installed {' '.join(installed)}")
    run_in_session(session, lambda: cli.emulation(cli.Emulation("aarch64", enable=True)))
    return {"APEXKIT_REQUIRE_SERVICES": "1"}


@nox.session(name="tests-unit", python=False)
def tests_unit(session: nox.Session) -> None:
    """The fast tier (tests/unit): in-process tests, no daemons, no network, no system tools installed."""
    session.run("python3", "-m", "pytest", "tests/unit", *session.posargs)


@nox.session(name="tests-installed", python=False)
def tests_installed(session: nox.Session) -> None:
    """The product as users install it (tests/installed): apexkit's sdist and wheel in fresh venvs of every Python
    3.8-3.13 found, each run from a foreign directory; installs nothing on the host (a few minutes)."""
    session.run("python3", "-m", "pytest", "tests/installed", *session.posargs)


@nox.session(name="tests-e2e", python=False)
def tests_e2e(session: nox.Session) -> None:
    """tests/e2e: real venvs, git, compilers, tinyproxy, dockerd, Slurm; with APEXKIT_INSTALL_SYSTEM_TOOLS=1 or CI=true
    (as root + apt) installs the missing system tools first (tinyproxy, docker.io, debootstrap, qemu-user-static):
    then the service tests must run."""
    session.run("python3", "-m", "pytest", "tests/e2e", *session.posargs, env=_test_env(session))


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Every tier in one pytest run (tests/unit, tests/installed, then tests/e2e; -- ARGS go to pytest), installing
    system tools as tests-e2e does."""
    session.run("python3", "-m", "pytest", *session.posargs, env=_test_env(session))


@nox.session(name="tests-aarch64", python=False)
def tests_aarch64(session: nox.Session) -> None:
    """aarch64 builder image + wheel under QEMU (minutes); with APEXKIT_INSTALL_SYSTEM_TOOLS=1 or CI=true installs
    qemu-user-static and registers binfmt first."""
    session.run(
        "python3",
        "-m",
        "pytest",
        "-m",
        "aarch64",
        "tests/e2e/test_images.py",
        *session.posargs,
        env=_test_env(session),
    )


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff check over the repository; mypy over apexkit/ (pyproject.toml [tool.mypy]; skipped, saying so, on Python
    3.8/3.9, where requirements/dev.txt has no mypy: 2.x needs 3.10); shellcheck over docker/*.sh, bench/*.sh and
    .ci/run; actionlint over the GitHub Actions workflow; last, ruff format --check (line length 100), so the checks
    above run first."""
    import shutil

    session.run("ruff", "check", ".")
    if shutil.which("mypy"):
        session.run("mypy")
    elif sys.version_info < (3, 10):
        session.log(
            f"mypy: skipped on Python {sys.version_info[0]}.{sys.version_info[1]} (mypy 2.x needs 3.10+; "
            "requirements/dev.txt installs it there): run nox -s lint on 3.10+ to type-check apexkit/"
        )
    else:
        session.error(
            "mypy is not installed -- next: python -m pip install -r requirements/dev.txt"
        )
    scripts = sorted(
        str(p) for pattern in ("docker/*.sh", "bench/*.sh") for p in Path().glob(pattern)
    )
    session.run("shellcheck", *scripts, ".ci/run")
    session.run("actionlint", ".github/workflows/build.yml")
    session.run("ruff", "format", "--check", ".")
