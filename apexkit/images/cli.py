"""The `invoke image.*` commands as plain functions (tasks.py forwards options and turns errors into exits)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from apexkit import dockerclient, log, vocab
from apexkit.errors import ImageError
from apexkit.images import builder


def build(
    arch: str,
    base: str,
    tag: str | None = None,
    network: str | None = None,
    ca_bundle: str | None = None,
    extra_packages: str = "",
    uid: int = builder.BUILD_ID,
    gid: int = builder.BUILD_ID,
    pip_index: str | None = None,
    no_cache: bool = False,
    dry_run: bool = False,
    quiet: bool = False,
    pythons: str = "",
) -> int:
    plan = builder.plan_image(
        arch,
        base,
        tag=tag,
        network=network,
        ca_bundle=ca_bundle,
        extra_packages=extra_packages,
        uid=uid,
        gid=gid,
        pip_index=pip_index,
        no_cache=no_cache,
        pythons=pythons,
    )
    log.info(f"builder image {plan.tag}")
    for name, value in plan.describe():
        log.info(f"  {name:<16}{value}")
    if dry_run:
        log.info("dry run: no base made or pulled, nothing built")
        return 0
    info = builder.build(plan, verbose=not quiet)
    log.result(f"✓ {plan.tag}")
    for line in builder.summary_lines(info):
        log.info(line)
    log.info(f"build in it: {vocab.build('3.X', f'--image {plan.tag} <build options>')}")
    return 0


def list_images(as_json: bool = False) -> int:
    rows = builder.list_rows(dockerclient.client())
    if as_json:
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


def prune(everything: bool = False, dry_run: bool = False) -> int:
    kept: list[str] = []
    removed = builder.prune(
        dockerclient.client(), everything=everything, dry_run=dry_run, kept=kept
    )
    for name in kept:
        log.warn(f"kept {name}")
    if not removed and not kept:
        log.info(
            "nothing to prune"
            + (
                ""
                if everything
                else " (only stale and untagged images; --all removes every apexkit image)"
            )
        )
    for name in removed:
        log.info(f"{'would remove' if dry_run else 'removed'} {name}")
    return 0


def emulation(
    arch: str | None = None,
    enable: bool = False,
    dry_run: bool = False,
    as_json: bool = False,
    binfmt_dir: Path = builder.BINFMT_DIR,
) -> int:
    """Show whether each architecture runs here (natively or through QEMU); --enable registers QEMU."""
    arches = [dockerclient.normalize_arch(arch)] if arch else list(dockerclient.ARCHES)
    if enable:
        for a in arches:
            _enable(a, binfmt_dir, dry_run)
    from apexkit import checks

    rows = [builder.emulation(a, binfmt_dir).row() for a in arches]
    return checks.report(rows, as_json, legacy=builder.Emulation.legacy_json)


def _enable(arch: str, binfmt_dir: Path, dry_run: bool) -> None:
    state = builder.emulation(arch, binfmt_dir)
    if state.usable:
        return
    commands = []
    if not (binfmt_dir / "status").exists():
        commands.append(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt_dir)])
    if (
        shutil.which("update-binfmts") is None
        or not Path(f"/usr/share/binfmts/qemu-{arch}").exists()
    ):
        raise ImageError(
            f"QEMU user emulation for {arch} is not installed (no /usr/share/binfmts/qemu-{arch})",
            "apt-get install qemu-user-static binfmt-support (dnf install qemu-user-static), then retry",
        )
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
