"""`nox -s matrix`: the build matrix as a table, JSON or a GitHub Actions matrix; `-- --run` builds every combination
here (in parallel with --jobs, one log per combination) and prints a summary; `build-<id>` sessions build one.

A combination whose arch is not the host's builds in the builder image matrix.toml [matrix.images] names for its
Python (else [matrix] image); `--image IMAGE` builds every combination in IMAGE. Before anything runs, each such
combination is checked against its image: the image must exist, be of the combination's arch and list the
combination's Python in its builder.json; otherwise it is refused in one line naming the image (and the
`invoke image.build`) that fits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from apexkit import images, log, paths
from apexkit import matrix as matrix_mod
from apexkit.errors import ApexkitError, ConfigError
from apexkit.matrix import Combination


def load_combinations(path: Path | None) -> tuple[matrix_mod.Matrix, list[Combination]]:
    """matrix.toml, or a file with [[include]] tables (and optionally its own [images] / image, as [matrix.images] /
    [matrix] image)."""
    m = matrix_mod.load()
    if path is None:
        return m, m.combinations()
    try:
        data = matrix_mod.tomllib.loads(path.read_text())
    except (OSError, matrix_mod.tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--matrix {path}: {exc}", "pass a TOML file with [[include]] tables") from None
    if "images" in data or "image" in data:
        table = dict(m.data.get("matrix", {}))
        table.update({k: data[k] for k in ("images", "image") if k in data})
        m = matrix_mod.Matrix({**m.data, "matrix": table})
    return m, m.combinations(data.get("include", []))


def image_for(m: matrix_mod.Matrix, combo: Combination, host: str | None = None,
              image: str | None = None) -> str | None:
    """The builder image this combination builds in: `image` when given, else the one for its Python when its arch
    is not the host's (None: it builds on this host)."""
    if image:
        return image
    if combo.arch == (host or images.host_arch()):
        return None
    return images.choose_image(m.data, combo.python, combo.arch).image


def build_args(m: matrix_mod.Matrix, combo: Combination, host: str | None = None, image: str | None = None) -> list[str]:
    """Options for `build-<python>` that make this combination (the builder image for a foreign arch)."""
    args = combo.build_args()
    chosen = image_for(m, combo, host, image)
    if chosen:
        args += ["--image", chosen]
    return args


def check_image(m: matrix_mod.Matrix, combo: Combination, facts: images.ImageFacts | None, host: str | None = None,
                image: str | None = None) -> tuple[str, str, str | None]:
    """(image, state, refusal): does the combination's builder image exist, have its arch and its Python?
    image '' = builds on this host; refusal is the one line that stops the combination (None: it may run)."""
    chosen = image_for(m, combo, host, image)
    if chosen is None:
        return "", "host", None
    if facts is None:
        return chosen, "not checked", None
    exists, info = facts.get(chosen)
    if facts.error:
        return chosen, "not checked", f"{combo.id}: cannot check {chosen}: {facts.error}"
    if not exists:
        return chosen, "missing", (f"{combo.id}: {chosen} is not in the Docker daemon -- next: "
                                   f"{images.build_hint(chosen, combo.arch, m.data)}")
    if info is not None and info.get("arch") and info["arch"] != combo.arch:
        return chosen, f"is {info['arch']}", (f"{combo.id}: {chosen} is an {info['arch']} image -- next: "
                                              f"{images.choose_image(m.data, combo.python, combo.arch).build_command}")
    try:
        images.require_python(info, chosen, combo.python, combo.arch, m.data, what=combo.id)
    except ApexkitError as exc:
        return chosen, f"lacks Python {combo.python}", exc.format()
    return chosen, "fits" if info is not None else "no builder.json (older recipe)", None


def rows(m: matrix_mod.Matrix, combos: list[Combination], facts: images.ImageFacts | None = None,
         image: str | None = None) -> list[dict]:
    out = []
    for combo in combos:
        try:
            m.validate(combo)
            refused = None
        except ConfigError as exc:
            refused = exc.cause
        chosen, state, image_refused = check_image(m, combo, facts, image=image)
        out.append({"id": combo.id, "python": combo.python, "torch": combo.torch, "torch_npu": combo.torch_npu or "",
                    "cann": combo.cann or "", "arch": combo.arch, "ref": combo.ref,
                    "runner": m.runners.get(combo.arch, "ubuntu-24.04"), "session": f"build-{combo.id}",
                    "refused": refused, "image": chosen, "image_state": state,
                    "image_refused": image_refused if facts is not None and not facts.error else None})
    return out


def github(table: list[dict]) -> str:
    """The `strategy.matrix` JSON for GitHub Actions (valid combinations only; one line for $GITHUB_OUTPUT)."""
    keys = ("id", "python", "torch", "torch_npu", "arch", "runner", "session")
    return json.dumps({"include": [{k: r[k] for k in keys} for r in table if not r["refused"]]}, separators=(",", ":"))


def refusals(table: list[dict]) -> list[tuple[str, str]]:
    """(id, why) of every refused row: by matrix.toml's tables, or by its builder image when images were checked."""
    return [(r["id"], r["refused"] or r["image_refused"]) for r in table if r["refused"] or r["image_refused"]]


def markdown(table: list[dict]) -> str:
    """The matrix for a CI job summary ($GITHUB_STEP_SUMMARY): refused combinations first, then every row."""
    def cell(text: str) -> str:
        return log.sanitise(str(text)).replace("|", "\\|")

    lines = []
    refused = refusals(table)
    if refused:
        lines += [f"### {len(refused)} of {len(table)} combinations refused", ""]
        lines += [f"- `{cell(rid)}`: {cell(why)}" for rid, why in refused] + [""]
    lines += [f"### Build matrix: {len(table) - len(refused)} of {len(table)} combinations to build", "",
              "| combination | python | torch | torch_npu | arch | runner | session |", "|---|---|---|---|---|---|---|"]
    for r in table:
        why = r["refused"] or r["image_refused"]
        lines.append(f"| {cell(r['id'])} | {r['python']} | {r['torch']} | {r['torch_npu'] or '-'} | {r['arch']} | "
                     f"{r['runner']} | {'REFUSED' if why else cell(r['session'])} |")
    return "\n".join(lines)


def print_table(table: list[dict], facts: images.ImageFacts | None = None) -> None:
    wheres = [f"{r['image']} ({r['image_state']})" if r["image"] else "this host" for r in table]
    width = max([len("builds in"), *map(len, wheres)])
    log.out(f"{'combination':<34} {'python':<7} {'torch':<8} {'torch_npu':<14} {'arch':<8} {'runner':<17} "
            f"{'builds in':<{width}} note")
    for r, where in zip(table, wheres):
        note = f"REFUSED: {r['refused']}" if r["refused"] else r["session"]
        log.out(f"{r['id']:<34} {r['python']:<7} {r['torch']:<8} {r['torch_npu'] or '-':<14} {r['arch']:<8} "
                f"{r['runner']:<17} {where:<{width}} {note}")
    if facts is not None and facts.error:
        log.info(f"images not checked: {facts.error}")


@dataclass
class Result:
    id: str
    status: str  # built | cached | refused | failed
    seconds: float = 0.0
    detail: str = ""
    wheel: str = ""
    size: int = 0
    sha256: str = ""
    cache_hit: bool = False
    log: str = ""
    extra: dict = field(default_factory=dict)


def run_one(m: matrix_mod.Matrix, combo: Combination, passthrough: list[str], dist: Path, build_dir: Path,
            jobs_each: int, logs: Path, facts: images.ImageFacts | None = None, image: str | None = None) -> Result:
    try:
        m.validate(combo)
    except ConfigError as exc:
        return Result(combo.id, "refused", detail=exc.cause)
    _, _, refusal = check_image(m, combo, facts or images.ImageFacts(), image=image)
    if refusal:
        return Result(combo.id, "refused", detail=refusal)
    log_path = logs / f"{combo.id}.log"
    argv = [sys.executable, "-m", "apexkit", "build", combo.python, *build_args(m, combo, image=image), "--dist",
            str(dist), "--build-dir", str(build_dir), "--jobs", str(jobs_each), *passthrough]
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as fh:
        fh.write("+ " + log.mask(" ".join(argv)) + "\n")
        fh.flush()
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=matrix_mod.PROJECT_ROOT,
                              env=dict(os.environ, COLUMNS="160"))
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        lines = [x for x in log_path.read_text(errors="replace").splitlines() if x.startswith("error:")]
        return Result(combo.id, "failed", seconds, (lines[-1][7:] if lines else f"exit {proc.returncode}")[:200],
                      log=str(log_path))
    target = _target_dir(dist, combo)
    manifest = json.loads((target / "manifest.json").read_text()) if target else {}
    wheel = manifest.get("wheel", {})
    return Result(combo.id, "cached" if manifest.get("cache_hit") else "built", seconds, str(target or ""),
                  wheel.get("file", ""), wheel.get("size", 0), wheel.get("sha256", ""), bool(manifest.get("cache_hit")),
                  str(log_path))


def _target_dir(dist: Path, combo: Combination) -> Path | None:
    from apexkit.build import target_id

    identity = {"torch_npu": combo.torch_npu} if combo.torch_npu else {}  # a stack's torch_npu: its own +npu target
    path = dist / target_id(combo.python, combo.torch, combo.arch, combo.ref, identity)
    return path if (path / "manifest.json").is_file() else None


def run_all(m: matrix_mod.Matrix, combos: list[Combination], passthrough: list[str], dist: Path, build_dir: Path,
            jobs: int, image: str | None = None) -> list[Result]:
    cores = os.cpu_count() or 1
    jobs = max(1, min(jobs, cores, len(combos) or 1))
    jobs_each = max(1, cores // jobs)
    logs = build_dir / "matrix"
    logs.mkdir(parents=True, exist_ok=True)
    log.info(f"▸ {len(combos)} combinations, {jobs} at a time ({jobs_each} compile jobs each); logs in {logs}/")
    results: dict[str, Result] = {}
    facts = images.ImageFacts()  # every image is asked once, before its combinations run

    def one(combo: Combination) -> Result:
        result = run_one(m, combo, passthrough, dist, build_dir, jobs_each, logs, facts, image)
        mark = {"built": "✓", "cached": "✓", "refused": "✕", "failed": "✕"}[result.status]
        log.info(f"  {mark} {combo.id}: {result.status} ({log.format_seconds(result.seconds)})"
                 + (f" — {result.detail}" if result.status in ("refused", "failed") else ""))
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for result in pool.map(one, combos):
            results[result.id] = result
    return [results[c.id] for c in combos]


def summary(results: list[Result]) -> str:
    lines = ["| combination | wheel | size | sha256 | build time | cache hit |", "|---|---|---|---|---|---|"]
    for r in results:
        if r.status in ("refused", "failed"):
            lines.append(f"| {r.id} | {r.status.upper()}: {r.detail} | | | {log.format_seconds(r.seconds) if r.seconds else ''}"
                         f" | |")
        else:
            lines.append(f"| {r.id} | {r.wheel} | {r.size / 1024:.0f} KiB | {r.sha256[:12]} | "
                         f"{log.format_seconds(r.seconds)} | {'yes' if r.cache_hit else 'no'} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nox -s matrix --", description="the build matrix: list, GitHub JSON, or run it")
    p.add_argument("--format", choices=("table", "json", "github", "markdown"), default="table",
                   help="table (default), json (every field, refused ones too), github (strategy.matrix; a refused "
                   "combination fails it, see --allow-refused), markdown (for $GITHUB_STEP_SUMMARY, refused ones first)")
    p.add_argument("--allow-refused", action="store_true", help="with --format github: leave refused combinations "
                   "out of the matrix and exit 0 (default: exit 1 naming them, so CI cannot lose a combination)")
    p.add_argument("--matrix", type=Path, metavar="FILE", help="a TOML file with [[include]] tables instead of "
                   "matrix.toml [[matrix.include]]")
    p.add_argument("--only", action="append", default=[], metavar="ID", help="only this combination (repeat)")
    p.add_argument("--run", action="store_true", help="build the combinations here and print a summary")
    p.add_argument("--image", metavar="IMAGE", help="build every combination in this builder image (default: a "
                   "combination of another arch builds in the image matrix.toml [matrix.images] names for its Python)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="with --run: combinations in parallel "
                   "(bounded by the CPU count)")
    p.add_argument("--dist", type=Path, help="with --run: output directory (default: $APEXKIT_DIST_DIR, else ./dist)")
    p.add_argument("--build-dir", type=Path, help="with --run: work directory (default: $APEXKIT_BUILD_DIR, else ./build)")
    p.add_argument("--refresh", action="store_true", help="compare [torch_npu.versions] with the torch-npu releases "
                   "on the package index; --write applies it (nox -s matrix -- --refresh --help)")
    p.add_argument("build_options", nargs="*", help="after --: passed to every build (e.g. -- --wheelhouse DIR)")
    return p


def main(argv: list[str]) -> int:
    if "--refresh" in argv:  # its own options (--write, --matrix FILE = the matrix.toml to compare, --index-url)
        from apexkit import refresh

        return refresh.main(argv)
    args = parser().parse_args(argv)
    m, combos = load_combinations(args.matrix)
    if args.only:
        unknown = sorted(set(args.only) - {c.id for c in combos})
        if unknown:
            raise ConfigError(f"--only {', '.join(unknown)}: not in the matrix", f"ids: {', '.join(c.id for c in combos)}")
        combos = [c for c in combos if c.id in args.only]
    if not args.run:
        # the GitHub matrix (and its summary) is for another machine's daemon: only the table and JSON ask this one
        facts = None if args.format in ("github", "markdown") else images.ImageFacts()
        table = rows(m, combos, facts, image=args.image)
        if args.format == "github":
            refused = refusals(table)
            if refused and not args.allow_refused:
                raise MatrixError(f"{len(refused)} of {len(table)} combinations refused: "
                                  + "; ".join(f"{rid}: {why}" for rid, why in refused),
                                  "fix or remove those rows (nox -s matrix shows every row), or pass --allow-refused "
                                  "to build the others")
            print(github(table))
        elif args.format == "markdown":
            print(markdown(table))
        elif args.format == "json":
            print(json.dumps(table, indent=1))
        else:
            print_table(table, facts)
        return 0
    if args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: must be at least 1", "pass --jobs 1 or more")
    dist = (args.dist or paths.dist_dir()).resolve()
    build_dir = (args.build_dir or paths.build_dir()).resolve()
    results = run_all(m, combos, args.build_options, dist, build_dir, args.jobs, image=args.image)
    table = summary(results)
    (build_dir / "matrix" / "summary.md").write_text(table + "\n")
    (build_dir / "matrix" / "summary.json").write_text(json.dumps([r.__dict__ for r in results], indent=1) + "\n")
    log.info(table)
    bad = [r for r in results if r.status in ("refused", "failed")]
    if bad:
        raise MatrixError(f"{len(bad)} of {len(results)} combinations did not build "
                          f"({', '.join(f'{r.id}: {r.status}' for r in bad)})",
                          f"see the summary above and {build_dir / 'matrix'}/<id>.log")
    return 0


class MatrixError(ApexkitError):
    exit_code = 1
