"""Build benchmark (numbers, not a test): cold build, cached rebuild, -j1 vs -jN compile.

Runs `nox -s build-<python>` four times against the configured sources (APEXKIT_*_URL env or options) with a
throw-away cache, reads each manifest's durations, prints a Markdown table and writes build/build-bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from apexkit import log
from apexkit.matrix import PROJECT_ROOT


def _run(python: str, extra: list[str], env: dict, dist: Path, build: Path) -> dict:
    argv = [sys.executable, "-m", "nox", "-f", str(PROJECT_ROOT / "noxfile.py"), "-s", f"build-{python}", "--",
            "--dist", str(dist), "--build-dir", str(build), *extra]
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"build failed: {' '.join(extra)}")
    manifest = json.loads(next(dist.glob("*/manifest.json")).read_text())
    return {"wall_s": round(wall, 2), "durations_s": manifest["durations_s"], "wheel": manifest["wheel"]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="nox -s build-bench --", description=__doc__)
    p.add_argument("--python", default="3.11")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("build_options", nargs="*", help="extra build options (after --)")
    args = p.parse_args(argv)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="apexkit-bench-") as tmp:
        env = dict(os.environ, APEXKIT_CACHE_DIR=str(Path(tmp) / "cache"))
        dist, build = Path(tmp) / "dist", Path(tmp) / "build"
        opts = list(args.build_options)
        runs = [
            ("cold (empty cache: fetch, venv, compile, smoke test)", [*opts, "--jobs", str(args.jobs)]),
            ("cached rebuild (same inputs)", [*opts, "--jobs", str(args.jobs)]),
            ("compile -j1 (venv reused, --no-cache)", [*opts, "--no-cache", "--no-smoke-test", "--jobs", "1"]),
            (f"compile -j{args.jobs} (venv reused, --no-cache)",
             [*opts, "--no-cache", "--no-smoke-test", "--jobs", str(args.jobs)]),
        ]
        for name, extra in runs:
            log.info(f"▸ {name}")
            results[name] = _run(args.python, extra, env, dist, build)
            log.info(f"  {results[name]['wall_s']} s")
    cold = results[runs[0][0]]["wall_s"]
    lines = ["| run | wall time | compile step |", "|---|---|---|"]
    for name, r in results.items():
        comp = next((v for k, v in r["durations_s"].items() if k.startswith("compile")), None)
        ratio = f" ({100 * r['wall_s'] / cold:.1f} % of cold)" if name.startswith("cached") else ""
        lines.append(f"| {name} | {r['wall_s']:.1f} s{ratio} | {f'{comp:.1f} s' if comp else '-'} |")
    table = "\n".join(lines)
    print(table)
    out = PROJECT_ROOT / "build" / "build-bench.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": f"{platform.machine()} {os.cpu_count()} cores", "python": args.python,
                               "results": results, "table": table}, indent=2))
    log.info(f"wrote {out}")
    return 0
