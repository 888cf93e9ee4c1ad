"""The `image.*` commands: each one's options (apexkit.declare; image.build's are builder.ImageOptions) and the
function that runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from apexkit import dockerclient, log, vocab
from apexkit.declare import json_option, option
from apexkit.errors import ImageError
from apexkit.images import builder

# image.build's options are declared beside plan_image, which takes them whole (no signature restated here)
Build = builder.ImageOptions


@dataclass(frozen=True)
class List:
    """List apexkit builder and base images (stale ones: docker/ changed since they were built)."""

    as_json: bool = json_option()


@dataclass(frozen=True)
class Prune:
    """Remove stale builder images (docker/ changed since) and untagged ones; --all: every apexkit image."""

    everything: bool = option(
        False, "remove every apexkit image, not only stale and untagged ones", flag="--all"
    )
    dry_run: bool = option(False, "print what would be removed")


@dataclass(frozen=True)
class Emulation:
    """Can this host run x86_64/aarch64 containers (natively or via QEMU binfmt)? Exit 1 when not; --enable
    fixes it."""

    arch: str | None = option(None, "one architecture (default: all)")
    enable: bool = option(False, "register QEMU for it (root)")
    dry_run: bool = option(False, "with --enable: print the commands")
    as_json: bool = json_option()


def build(o: Build) -> int:
    plan = builder.plan_image(o)
    log.info(f"builder image {plan.tag}")
    for name, value in plan.describe():
        log.info(f"  {name:<16}{value}")
    if o.dry_run:
        log.info("dry run: no base made or pulled, nothing built")
        return 0
    info = builder.build(plan, verbose=not o.quiet)
    log.result(f"✓ {plan.tag}")
    for line in builder.summary_lines(info):
        log.info(line)
    log.info(f"build in it: {vocab.build('3.X', f'--image {plan.tag} <build options>')}")
    return 0


def list_images(o: List) -> int:
    rows = builder.list_rows(dockerclient.client())
    if o.as_json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        log.out(
            f"no apexkit images in this daemon "
            f"({vocab.command('image.build', '--arch x86_64 --base debootstrap')} makes one)"
        )
        return 0
    log.out(f"{'image':<48} {'kind':<8} {'arch':<8} {'size':>9}  {'created':<19}  note")
    for row in rows:
        note = (
            "stale: docker/ changed since (image.prune removes it)" if row["stale"] else row["base"]
        )
        log.out(
            f"{row['tags'][0]:<48} {row['kind']:<8} {row['arch']:<8} {row['size_mb']:>7.1f}MB  "
            f"{row['created']:<19}  {note}"
        )
    return 0


def prune(o: Prune) -> int:
    removed, kept = builder.prune(dockerclient.client(), everything=o.everything, dry_run=o.dry_run)
    for name in kept:
        log.warn(f"kept {name}")
    if not removed and not kept:
        log.info(
            "nothing to prune"
            + (
                ""
                if o.everything
                else " (only stale and untagged images; --all removes every apexkit image)"
            )
        )
    for name in removed:
        log.info(f"{'would remove' if o.dry_run else 'removed'} {name}")
    return 0


def emulation(o: Emulation, binfmt_dir: Path = builder.BINFMT_DIR) -> int:
    """Show whether each architecture runs here (natively or through QEMU); --enable registers QEMU."""
    arches = [dockerclient.normalize_arch(o.arch)] if o.arch else list(dockerclient.ARCHES)
    if o.enable:
        for a in arches:
            _enable(a, binfmt_dir, o.dry_run)
    from apexkit import checks

    rows = [builder.emulation(a, binfmt_dir).row() for a in arches]
    return checks.report(rows, o.as_json, legacy=builder.Emulation.legacy_json)


def _enable(arch: str, binfmt_dir: Path, dry_run: bool) -> None:
    if builder.emulation(arch, binfmt_dir).usable:
        return
    if (
        shutil.which("update-binfmts") is None
        or not Path(f"/usr/share/binfmts/qemu-{arch}").exists()
    ):
        raise ImageError(
            f"QEMU user emulation for {arch} is not installed (no /usr/share/binfmts/qemu-{arch})",
            "apt-get install qemu-user-static binfmt-support (dnf install qemu-user-static), then retry",
        )
    mount = ["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt_dir)]
    commands = [] if (binfmt_dir / "status").exists() else [mount]
    commands.append(["update-binfmts", "--enable", f"qemu-{arch}"])
    for argv in commands:
        log.echo_command(argv)
        if dry_run:
            continue
        if os.geteuid() != 0:
            raise ImageError("registering binfmt handlers needs root", f"sudo {' '.join(argv)}")
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            raise ImageError(
                f"{' '.join(argv)} failed: {(result.stderr or result.stdout).strip()[:200]}",
                "see the message; a container runtime may forbid it (run on the host)",
            )
    if dry_run:
        log.info("dry run: nothing registered")
