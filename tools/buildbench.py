"""Build benchmark (numbers, not a test): cold, no-op, changed-input and -j1 vs -jN, as ratios from one run.

Runs `nox -s build-<python>` against the configured sources (APEXKIT_*_URL env or options) with a throw-away
apexkit cache and ccache directory, reads each manifest's step durations (`durations_s`, stable keys) and ccache
figures, prints a Markdown table with the issue-19 goals (met or not) and writes build/build-bench.json:

    cold            empty caches: fetch, venv + torch install, tree + patches, compile, smoke test
    no-op           the same inputs again: a wheel cache hit
    changed-input   one of our patches changed (a comment appended, in a copy of this checkout): the wheel cache
                    misses, ccache (when installed) is warm; its hits/misses are in the table
    -j1, -jN        the compile alone (--no-cache --no-smoke-test, ccache off), 1 job vs N
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from apexkit import log, paths
from apexkit.plan import matrix
from apexkit.plan.matrix import PROJECT_ROOT
from apexkit.wheel import ccachestats


def _run(root: Path, python: str, extra: list[str], env: dict, dist: Path, build: Path) -> dict:
    argv = [
        sys.executable,
        "-m",
        "nox",
        "-f",
        str(root / "noxfile.py"),
        "-s",
        f"build-{python}",
        "--",
        "--dist",
        str(dist),
        "--build-dir",
        str(build),
        *extra,
    ]
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=root)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"build failed: {' '.join(extra)}")
    manifest = json.loads(
        max(dist.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime).read_text()
    )
    return {
        "wall_s": round(wall, 2),
        "durations_s": manifest["durations_s"],
        "wheel": manifest["wheel"],
        "cache_hit": manifest.get("cache_hit"),
        "ccache": manifest.get("ccache"),
    }


def changed_checkout(tmp: Path) -> Path:
    """A copy of this checkout whose first patch has one more comment line: new patch hash, same edits."""
    copy = tmp / "checkout"
    shutil.copytree(PROJECT_ROOT, copy, ignore=paths.copy_ignore(PROJECT_ROOT), symlinks=True)
    first = sorted((copy / "patches").glob("*.toml"))[0]
    first.write_text(first.read_text() + "# changed for nox -s build-bench (changed-input run)\n")
    return copy


def _compile_s(result: dict) -> float | None:
    durations = result["durations_s"]
    if "compile" in durations:
        return durations["compile"]
    return next(
        (v for k, v in durations.items() if k.startswith("compile")), None
    )  # a manifest before stable keys


def _ccache(stats: dict | None) -> str:
    if not stats:
        return "-"
    if stats.get("hit_rate") == "unknown":
        return f"unknown ({stats.get('reason')})"
    rate = stats.get("hit_rate")
    if rate is None:
        return "no cacheable calls"
    return f"{stats['hits']}/{stats['hits'] + stats['misses']} hits ({rate:.0%})"


# The goals of issue 19, checked (not asserted) against one run: (what, value, goal, met).
def goals(results: dict[str, dict]) -> list[tuple[str, float, str, bool]]:
    cold = results["cold"]["wall_s"]
    found = []
    if "changed-input" in results:
        ratio = results["changed-input"]["wall_s"] / cold
        found.append(("changed-input wall ÷ cold wall", round(ratio, 2), "≤ 0.25", ratio <= 0.25))
    comp = _compile_s(results["cold"])
    if comp:
        found.append(
            ("cold wall ÷ its compile step", round(cold / comp, 2), "≤ 1.3", cold / comp <= 1.3)
        )
    if "no-op" in results:
        noop = results["no-op"]["wall_s"]
        found.append(("no-op wall (s)", noop, "< 1", noop < 1))
    return found


def table(results: dict[str, dict]) -> str:
    cold = results["cold"]["wall_s"]
    lines = [
        "| run | wall | vs cold | compile step | ccache | steps (s; other = total − steps) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        comp = _compile_s(r)
        durations = {k: v for k, v in r["durations_s"].items() if k != "total"}
        steps = ", ".join(f"{k.split(' (')[0]} {v:.1f}" for k, v in durations.items())
        if "total" in r["durations_s"]:
            steps += f", other {max(0.0, r['durations_s']['total'] - sum(durations.values())):.1f}"
        lines.append(
            f"| {name} | {r['wall_s']:.1f} s | {r['wall_s'] / cold:.2f}× | "
            f"{f'{comp:.1f} s' if comp else '-'} | {_ccache(r.get('ccache'))} | {steps} |"
        )
    lines.append("")
    for what, value, goal, met in goals(results):
        lines.append(f"{what}: {value} (goal {goal}: {'met' if met else 'NOT met'})")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="nox -s build-bench --",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--python", default=None, help="target Python (default: matrix.toml [pythons] default)"
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("build_options", nargs="*", help="extra build options (after --)")
    args = p.parse_args(argv)
    args.python = args.python or matrix.load().default_python
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="apexkit-bench-") as tmp:
        tmp_path = Path(tmp)
        env = dict(
            os.environ,
            APEXKIT_CACHE_DIR=str(tmp_path / "cache"),
            CCACHE_DIR=str(tmp_path / "ccache"),
            CCACHE_NOHASHDIR="1",
        )
        dist, build = tmp_path / "dist", tmp_path / "build"
        opts = [*args.build_options, "--jobs", str(args.jobs)]
        nocc = dict(env, CCACHE_DISABLE="1")
        runs = [
            ("cold", PROJECT_ROOT, opts, env),
            ("no-op", PROJECT_ROOT, opts, env),
            ("changed-input", changed_checkout(tmp_path), opts, env),
            (
                "compile -j1",
                PROJECT_ROOT,
                [*args.build_options, "--no-cache", "--no-smoke-test", "--jobs", "1"],
                nocc,
            ),
            (
                f"compile -j{args.jobs}",
                PROJECT_ROOT,
                [*opts, "--no-cache", "--no-smoke-test"],
                nocc,
            ),
        ]
        for name, root, extra, run_env in runs:
            log.info(f"▸ {name}")
            results[name] = _run(root, args.python, extra, run_env, dist, build)
            log.info(f"  {results[name]['wall_s']} s")
    text = table(results)
    print(text)
    out = paths.build_dir() / "build-bench.json"
    out.parent.mkdir(exist_ok=True)
    ccache = ccachestats.find(os.environ)  # what the builds used: the lock's ccache before PATH's
    version = (
        subprocess.run([ccache, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        if ccache
        else None
    )
    out.write_text(
        json.dumps(
            {
                "machine": f"{platform.machine()} {os.cpu_count()} cores",
                "ccache": ccache and f"{ccache} ({version})",
                "python": args.python,
                "results": results,
                "goals": [dict(zip(("what", "value", "goal", "met"), g)) for g in goals(results)],
                "table": text,
            },
            indent=2,
        )
    )
    log.info(f"wrote {out}")
    return 0
