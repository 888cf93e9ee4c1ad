"""`nox -s validate` / `nox -s bench`: run bench/validate_env.py or bench/amp_bench.py inside a venv that holds the
built wheel of a target in dist/ (the newest, or --target ID), or inside any interpreter (--interpreter PATH).

The run venv is cached per target and wheel (cache/run-venvs/): torch (+ torch_npu) as the build had it, the wheel
(--no-deps), matplotlib for the chart. apexkit itself never imports torch: it runs the venv's interpreter.
Options this module does not know are passed to the script, e.g. `nox -s bench -- --device cpu --model qwen3-block`.
APEXKIT_BENCH_ARGS adds script options too, for one command line with a build: `nox -s build-3.11 bench`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path

from apexkit import log, paths, vocab
from apexkit.errors import BenchError, ConfigError
from apexkit.plan import matrix
from apexkit.wheel import sources, venvs

ROOT = paths.ROOT
SCRIPTS = {"validate": ROOT / "bench" / "validate_env.py", "bench": ROOT / "bench" / "amp_bench.py"}
RUN_EXTRAS = ("matplotlib",)
# torch wheels built against NumPy 1.x (torch 2.1, 2.2) print a traceback-shaped warning at `import torch` and lose
# torch.from_numpy when matplotlib pulls NumPy 2 (Python >= 3.9). Asked of the venv by trying, not by torch version.
NUMPY_PROBE = paths.PROBES / "numpy_torch.py"
NUMPY_1 = "numpy<2"


def find_target(
    dist: Path, target: str | None = None, python: str | None = None
) -> tuple[Path, dict]:
    """The manifest of the requested target, else of the newest build in `dist`."""
    found = []
    for manifest_path in dist.glob("*/manifest.json"):
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if target and manifest_path.parent.name != target:
            continue
        if python and manifest.get("target", {}).get("python") != python:
            continue
        found.append((manifest_path.stat().st_mtime, manifest_path, manifest))
    if not found:
        wanted = f" for {target or f'Python {python}'}" if (target or python) else ""
        raise ConfigError(
            f"no built wheel{wanted} in {dist}/",
            "build one first (nox -s build-3.11), pick one with --target ID, or use --interpreter PATH",
        )
    _, path, manifest = max(found, key=lambda item: item[0])
    return path.parent, manifest


def run_venv(target_dir: Path, manifest: dict, cache: Path) -> venvs.Venv:
    """A cached venv with torch (+ torch_npu), the wheel and the chart library."""
    wheel = target_dir / manifest["wheel"]["file"]
    if not wheel.is_file():
        raise ConfigError(
            f"{wheel} is missing (manifest.json names it)", "rebuild: nox -s build-<python>"
        )
    spec = manifest["target"]
    torch_pin = manifest.get("tools", {}).get("torch") or spec["torch"]
    torch_npu = manifest.get("tools", {}).get("torch_npu") or spec.get("torch_npu")
    key = hashlib.sha256(
        json.dumps(
            [
                manifest["wheel"]["sha256"],
                torch_pin,
                torch_npu,
                spec["interpreter"],
                RUN_EXTRAS,
                NUMPY_PROBE.read_text(),
            ]
        ).encode()
    ).hexdigest()[:12]
    path = cache / "run-venvs" / f"{target_dir.name}-{key}"
    venv = venvs.Venv(path)
    with venvs.lock(
        path
    ):  # two validate/bench runs at once: one makes the venv, the other waits and reuses it
        if (path / ".apexkit-complete").is_file():
            return venv
        return _make_run_venv(venv, target_dir, manifest, cache, key, torch_pin, torch_npu)


def _make_run_venv(
    venv: venvs.Venv,
    target_dir: Path,
    manifest: dict,
    cache: Path,
    key: str,
    torch_pin: str,
    torch_npu: str | None,
) -> venvs.Venv:
    path, spec, wheel = venv.path, manifest["target"], target_dir / manifest["wheel"]["file"]
    log_path = cache / "run-venvs" / f"{target_dir.name}-{key}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    index = venvs.IndexOptions(torch_index_url=os.environ.get("APEXKIT_TORCH_INDEX_URL"))
    with log.step(f"run venv for {target_dir.name}") as s:
        venvs.create(spec["interpreter"], path, log_path)
        venvs.pip_install(venv, [f"torch=={torch_pin}"], index, log_path, for_torch=True)
        if torch_npu:
            venvs.install_torch_npu(venv, torch_npu, matrix.load().npu_requires, index, log_path)
        venvs.pip_install(venv, list(RUN_EXTRAS), index, log_path)
        if not numpy_works_with_torch(venv):
            log.info(
                f"torch {torch_pin} does not work with this NumPy (built against NumPy 1.x): installing {NUMPY_1}"
            )
            venvs.pip_install(venv, [NUMPY_1], index, log_path)
        venvs.pip_install(venv, [str(wheel)], index, log_path, extra=["--no-deps"])
        (path / ".apexkit-complete").write_text(manifest["wheel"]["sha256"] + "\n")
        s.note(f"{path} (log {log_path})")
    return venv


def numpy_works_with_torch(venv: venvs.Venv) -> bool:
    """Whether torch imports cleanly next to the venv's NumPy and can use it."""
    argv = [str(venv.python), str(NUMPY_PROBE)]
    log.echo_command(argv)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    return (
        proc.returncode == 0
        and "compiled using NumPy 1.x" not in proc.stderr
        and "Failed to initialize NumPy" not in proc.stderr
    )


def parse(argv: list[str], prog: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog=prog, add_help=False, description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--target", help="target id in dist/ (default: the newest build)")
    parser.add_argument("--python", help="the newest target for this Python (e.g. 3.11)")
    parser.add_argument(
        "--interpreter",
        dest="in_env",
        metavar="PATH",
        help="run with this interpreter as it is (no run venv)",
    )
    vocab.alias(parser, "--in-env", "--interpreter", dest="in_env", metavar="PATH")
    parser.add_argument(
        "--dist",
        default=os.environ.get("APEXKIT_DIST_DIR") or str(ROOT / "dist"),
        help="where the builds are (default: $APEXKIT_DIST_DIR, else dist/)",
    )
    parser.add_argument(
        "--reports",
        default=os.environ.get("APEXKIT_REPORTS_DIR") or str(ROOT / "reports"),
        help="where outputs go by default: <reports>/<target>/ (default: $APEXKIT_REPORTS_DIR, else reports/)",
    )
    parser.add_argument(
        "--apexkit-help", action="store_true", help="this help (--help shows the script's)"
    )
    args, rest = parser.parse_known_args(argv)
    vocab.finish(args)
    if args.apexkit_help:
        parser.print_help()
        raise SystemExit(0)
    return args, rest + shlex.split(os.environ.get("APEXKIT_BENCH_ARGS", ""))


def main(script: str, argv: list[str], prog: str) -> int:
    args, rest = parse(argv, prog)
    env = dict(os.environ)
    if args.in_env:
        python, label = args.in_env, "in-env"
    else:
        target_dir, manifest = find_target(Path(args.dist), args.target, args.python)
        python, label = (
            str(run_venv(target_dir, manifest, sources.cache_dir()).python),
            target_dir.name,
        )
        env["APEXKIT_APEX_WHEEL_SHA256"] = manifest["wheel"][
            "sha256"
        ]  # the bench's environment block records it
    reports = Path(args.reports) / label
    if (
        script == "bench"
        and not any(a == "--out" or a.startswith("--out=") for a in rest)
        and "--compare" not in rest
    ):
        rest += ["--out", str(reports / "bench")]
    if script == "validate" and not any(a == "--json" or a.startswith("--json=") for a in rest):
        rest += ["--json", str(reports / "validate.json")]
    argv_run = [python, str(SCRIPTS[script]), *rest]
    log.echo_command(argv_run)
    code = subprocess.call(argv_run, env=env)
    if code != 0:
        what = (
            "the environment is not ready (see the table above)"
            if script == "validate"
            else f"{SCRIPTS[script].name} exited with {code}"
        )
        raise BenchError(what, f"fix what the report says, then run nox -s {script} again")
    return 0
