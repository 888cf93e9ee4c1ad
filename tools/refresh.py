"""`nox -s refresh [-- --write]` (a maintainer's tool, in a checkout): which torch-npu releases the package index
serves and which torch each one requires (its Requires-Dist), as a difference against matrix.toml
[torch_npu.versions]; `--write` applies it.

Plan, then do:
- survey: the torch-npu wheels the index lists (pip's index and extra indexes, or `--index-url`) and the metadata of
  one wheel per release and arch, never the wheel, through the index reader (tools/wheelindex.py);
- `plan()` (pure) compares the releases with the table; `render()` (pure) rewrites matrix.toml with tomlkit, keeping
  every comment, the order (newest torch first) and every other table byte for byte, and updating the table's
  provenance (`source`, `read`). CANN is not in the wheel metadata: existing CANN lists are never changed, a new row
  gets `cann = []` and a comment saying where to read it.

Only releases >= 2.1 are read (older torch_npu wheels predate the tables apexkit builds from); pre-releases and
yanked releases are listed as skipped.

The index is untrusted (see tools/wheelindex.py for the caps and the links followed): a wheel whose metadata
cannot be read, or whose METADATA names another project or version, is a skipped wheel with its reason, never a
traceback; `torch_local` is merged per arch (an arch whose wheel was not read keeps its label); the report escapes
control characters from the index before they reach the terminal.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import math
import os
import re
import struct
import time
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from apexkit import fsedit, log, untrusted
from apexkit.errors import ApexkitError, ConfigError, EnvironmentSetupError, SourceError
from apexkit.index import client
from apexkit.plan import matrix
from tools import run_main, wheelindex

OLDEST = Version("2.1")
MAX_RELEASES = 200  # read at most the newest 200 releases (the real index has ~50): a page cannot make it 100,000
CANN_COMMENT = "cann: not in the wheel metadata; read it in Ascend/pytorch COMPATIBILITY.md"


def local_label(requirement: str) -> str | None:
    """`torch (==2.1.0+cpu)` -> "cpu": a torch build that PyPI's plain torch does not satisfy."""
    match = re.search(r"==\s*[0-9][^,;)\s]*\+([A-Za-z0-9.]+)", requirement)
    return match[1] if match else None


def positive_seconds(value: str) -> float:
    """argparse type of --timeout: 0 < seconds < inf (a socket refuses the rest with a ValueError)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a positive number of seconds (e.g. --timeout 20)"
        )
    return seconds


# ---------------------------------------------------------------------------------------------------------------
# Releases
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Release:
    version: str  # torch_npu
    platforms: list[str]  # arches of its wheels
    requires: dict[str, str] = field(default_factory=dict)  # arch -> Requires-Dist on torch
    torch: str | None = None  # the torch release it pins
    inferred: bool = False  # torch taken from the torch_npu version (no == pin)
    skipped: str = ""  # why its metadata could not be read (no wheel of it read)
    how: str = ""  # how the metadata was read
    unread: dict[str, str] = field(default_factory=dict)  # arch -> why its wheel was not read

    @property
    def local(self) -> dict[str, str]:
        return {
            arch: label
            for arch, req in sorted(self.requires.items())
            if (label := local_label(req))
        }


@dataclass
class Survey:
    releases: list[Release]  # >= 2.1, final, newest first
    ignored: dict[str, list[str]]  # reason -> versions
    indexes: dict[str, str]  # index -> what it gave


def survey(session: client.Client, settings: client.IndexSettings, workers: int = 8) -> Survey:
    wheels: list[wheelindex.WheelFile] = []
    indexes: dict[str, str] = {}
    for index in settings.urls:
        found = wheelindex.fetch_index(session, index)
        indexes[client.public_url(index)] = (
            "no torch-npu project" if found is None else f"{len(found)} torch-npu wheels"
        )
        wheels += found or []
    if not wheels:
        raise SourceError(
            f"no torch-npu wheels on {', '.join(client.public_url(u) for u in settings.urls)} (HTTP 404 or an "
            f"empty project page)",
            client.INDEX_HINT,
        )
    by_version: dict[Version, list[wheelindex.WheelFile]] = {}
    ignored: dict[str, list[str]] = {}
    for wheel in wheels:
        try:
            version = Version(wheel.version)
        except InvalidVersion:
            ignored.setdefault("not a PEP 440 version", []).append(wheel.version)
            continue
        by_version.setdefault(version, []).append(wheel)
    chosen: dict[Version, list[wheelindex.WheelFile]] = {}
    for version, files in sorted(by_version.items(), reverse=True):
        live = [f for f in files if not f.yanked]
        reason = (
            "older than 2.1"
            if version < OLDEST
            else "pre-release"
            if version.is_prerelease
            else "yanked"
            if not live
            else ""
        )
        if not reason and len(chosen) >= MAX_RELEASES:
            reason = f"beyond the newest {MAX_RELEASES}"
        if reason:
            ignored.setdefault(reason, []).append(str(version))
            continue
        # one wheel per arch (the first index that has one wins, as in pip)
        per_arch: dict[str, wheelindex.WheelFile] = {}
        order = sorted(
            live, key=lambda w: (bool(w.refused), settings.urls.index(w.index), w.filename)
        )
        for wheel in order:  # a wheel whose link is followed first
            per_arch.setdefault(wheel.arch, wheel)
        chosen[version] = [per_arch[a] for a in (*wheelindex.ARCHES, "other") if a in per_arch][:2]
    jobs = [(version, wheel) for version, files in chosen.items() for wheel in files]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda job: _read_one(session, job[1]), jobs))
    releases = {
        v: Release(str(v), sorted({w.arch for w in by_version[v]} - {"other"})) for v in chosen
    }
    for (version, wheel), result in zip(jobs, results):
        release = releases[version]
        if isinstance(result, str):
            release.unread[wheel.arch] = f"{wheel.filename}: {result}"
            release.skipped = release.skipped or release.unread[wheel.arch]
            continue
        meta, how = result
        release.requires[wheel.arch] = meta.torch
        release.how = how
        if meta.torch_version and not release.torch:
            release.torch = meta.torch_version
    for version, release in releases.items():
        if (
            release.torch is None
        ):  # no == pin on torch (or unread): torch_npu X.Y.Z[.postN] belongs to torch X.Y.Z
            release.torch, release.inferred = matrix.torch_npu_torch(str(version)), True
        if release.requires:
            release.skipped = ""  # one readable wheel is enough
    if releases and all(r.skipped for r in releases.values()):
        first = next(iter(releases.values()))
        raise SourceError(
            f"could not read the metadata of any torch-npu release on {', '.join(indexes)} (e.g. "
            f"{first.skipped})",
            "pass --index-url with an index that serves PEP 658 .metadata files "
            "or answers HTTP range requests (e.g. https://pypi.org/simple)",
        )
    return Survey(list(releases.values()), ignored, indexes)


def _read_one(
    session: client.Client, wheel: wheelindex.WheelFile
) -> tuple[wheelindex.Metadata, str] | str:
    """The metadata of `wheel` and how it was read, or why it was not: whatever the index answers (a refused link, a
    cap, a lying Content-Range, an unreachable host a page chose, an answer nested too deep) is a reason."""
    try:
        data, how = wheelindex.read_metadata(session, wheel)
        meta = wheelindex.parse_metadata(data)
    except wheelindex.NoMetadata as exc:
        return str(exc)
    except ApexkitError as exc:  # an unreachable host or a URL urllib refuses: this wheel only
        return exc.cause
    except (
        OSError,
        http.client.HTTPException,
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        zlib.error,
        struct.error,
        EOFError,
        ValueError,
        LookupError,
        RecursionError,
        MemoryError,
        NotImplementedError,
    ) as exc:
        reason = client.failure_reason(exc, session.settings.timeout)[:160]
        return f"unreadable ({type(exc).__name__}: {reason})"
    return wheelindex.mismatch(meta, wheel) or (meta, how)


# ---------------------------------------------------------------------------------------------------------------
# Plan (pure): the table against the releases
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowChange:
    torch: str
    kind: str  # add | update | same | absent (no release for the row's torch) | unread | older (< 2.1)
    old: str | None  # the row's torch_npu
    new: str | None  # the newest torch_npu for this torch on the index
    local: tuple[tuple[str, str], ...] = ()  # (arch, label) the newest release pins torch with
    old_local: tuple[tuple[str, str], ...] = ()
    requires: str = ""  # the newest release's Requires-Dist, for the report

    @property
    def changes_file(self) -> bool:
        return self.kind in ("add", "update")


def _key(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        return Version("0")


def plan(rows: Mapping[str, Mapping], releases: Sequence[Release]) -> list[RowChange]:
    """One RowChange per torch in the table or on the index, newest torch first."""
    newest: dict[str, Release] = {}
    unread = {r.torch: r.version for r in releases if r.skipped}
    release: Release | None  # each release, then the newest of each torch (None: not on the index)
    for release in releases:
        if release.skipped:
            continue
        if release.torch and (
            release.torch not in newest
            or _key(release.version) > _key(newest[release.torch].version)
        ):
            newest[release.torch] = release
    out = []
    for torch in sorted(set(rows) | set(newest), key=_key, reverse=True):
        row, release = rows.get(torch), newest.get(torch)
        old = str(row["torch_npu"]) if row else None
        old_local = tuple(
            sorted((str(k), str(v)) for k, v in (row or {}).get("torch_local", {}).items())
        )
        if release is None:
            kind = "older" if _key(torch) < OLDEST else "unread" if torch in unread else "absent"
            out.append(RowChange(torch, kind, old, unread.get(torch), old_local, old_local))
            continue
        # merged per arch: an arch whose wheel was read gets its label (or none); one not read keeps the row's
        merged = {arch: label for arch, label in old_local if arch not in release.requires}
        local = tuple(sorted({**merged, **release.local}.items()))
        requires = "; ".join(f"{arch}: {req}" for arch, req in sorted(release.requires.items()))
        if len(set(release.requires.values())) == 1:
            requires = next(iter(release.requires.values()))
        if row is None:
            kind = "add"
        elif _key(release.version) > _key(old or "0") or local != old_local:
            kind = "update"
        else:
            kind = "same"
        new = release.version if kind == "add" or _key(release.version) > _key(old or "0") else old
        out.append(RowChange(torch, kind, old, new, local, old_local, requires))
    return out


def describe(change: RowChange) -> str:
    """One line of the difference."""
    t = change.torch
    local = ", ".join(f'{arch} = "{label}"' for arch, label in change.local)
    if change.kind == "add":
        extra = f", torch_local = {{ {local} }}" if local else ""
        text = f'+ "{t}" = {{ torch_npu = "{change.new}", cann = []{extra} }}   new: {change.requires}; CANN: fill in by hand'
    elif change.kind == "update":
        parts = []
        if change.new != change.old:
            parts.append(
                f"torch_npu {change.old} -> {change.new} ({change.requires}; CANN list kept: check it for "
                f"{change.new})"
            )
        if change.local != change.old_local:
            parts.append(f"torch_local = {{ {local} }}" if local else "torch_local removed")
        text = f'~ "{t}": ' + "; ".join(parts)
    elif change.kind == "same":
        text = f'= "{t}": torch_npu {change.old} is the newest ({change.requires})'
    elif change.kind == "unread":
        text = f'? "{t}": torch_npu {change.old}: the metadata of {change.new} could not be read (row kept)'
    elif change.kind == "absent":
        text = f'? "{t}": torch_npu {change.old}: no release for torch {t} on the index (row kept)'
    else:
        text = f'  "{t}": torch_npu {change.old}: torch < 2.1, not checked'
    if change.local and change.kind in ("add", "update", "same"):
        pins = ", ".join(f"{arch} wheels pin torch=={t}+{label}" for arch, label in change.local)
        text += f"  [local label: {pins}; pip refuses PyPI's plain torch {t} for them]"
    return text


# ---------------------------------------------------------------------------------------------------------------
# Render (pure): matrix.toml with the plan applied, through tomlkit
# ---------------------------------------------------------------------------------------------------------------


def _row_item(torch_npu: str, cann: str, local: Sequence[tuple[str, str]], comment: str):
    import tomlkit

    text = f'torch_npu = "{torch_npu}", cann = {cann}'
    if local:
        text += (
            ", torch_local = { " + ", ".join(f'{arch} = "{label}"' for arch, label in local) + " }"
        )
    line = f"x = {{ {text} }}" + (f"  # {comment}" if comment else "")
    return tomlkit.parse(line + "\n").item("x")


def _row_keys(versions) -> list[str]:
    """The rows of a tomlkit table in document order (iterating the table gives insertion order instead)."""
    return [key.key for key, _ in versions.value.body if key is not None]


def _versions_table(doc, name: str):
    """doc's [torch_npu.versions] as a tomlkit table with a header of its own; anything else is refused."""
    from tomlkit.container import OutOfOrderTableProxy
    from tomlkit.items import InlineTable, Table

    table = doc.get("torch_npu")
    versions = table.get("versions") if hasattr(table, "get") else None
    if isinstance(versions, Table) and not versions.is_super_table():
        return table, versions
    how = (
        "an inline table (versions = { ... })"
        if isinstance(versions, InlineTable)
        else 'dotted keys (versions."X" = ...)'
        if isinstance(versions, (Table, OutOfOrderTableProxy))
        else "not a table"
    )
    raise ConfigError(
        f"{name}: [torch_npu.versions] is written as {how}; --write edits only a "
        f"[torch_npu.versions] table with one row per line",
        "rewrite it as a [torch_npu.versions] table, or apply the difference above by hand",
    )


def expected_rows(rows: Mapping[str, Mapping], changes: Sequence[RowChange]) -> dict[str, dict]:
    """The rows `render` must leave: `rows` with every add/update applied."""
    out = {str(k): dict(v) for k, v in rows.items()}
    for change in changes:
        if not change.changes_file:
            continue
        row = out.get(change.torch) if change.kind == "update" else None
        row = {**(row or {"cann": []}), "torch_npu": change.new or ""}
        row.pop("torch_local", None)
        if change.local:
            row["torch_local"] = dict(change.local)
        out[change.torch] = row
    return out


def check_rendered(out: str, want: Mapping[str, Mapping], name: str) -> None:
    """Refuse a rendered matrix that is not TOML or does not read back as the rows `want`."""
    hint = "apply the difference above by hand (nothing was written)"
    try:
        got = matrix.tomllib.loads(out)["torch_npu"]["versions"]
    except (matrix.tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{name}: the refreshed file would not be valid TOML ({exc})", hint
        ) from None
    if got != want:
        wrong = sorted(set(got) ^ set(want)) or [k for k in want if got.get(k) != want[k]]
        raise ConfigError(
            f"{name}: the refreshed [torch_npu.versions] would not read back as planned "
            f"(rows {', '.join(wrong)})",
            hint,
        )


def render(
    text: str, changes: Sequence[RowChange], today: str, index: str, name: str = "matrix.toml"
) -> str:
    """`text` (matrix.toml) with every add/update applied; everything else as it was, line endings included.
    Raises ConfigError when [torch_npu.versions] is not a table of its own, or the result would not read back."""
    try:
        import tomlkit
    except ImportError:
        raise ConfigError(
            "tomlkit (the comment-keeping TOML writer) is not installed",
            "pip install -r requirements/runtime.txt",
        ) from None

    todo = [c for c in changes if c.changes_file]
    if not todo:
        return text
    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    if crlf:  # tomlkit writes new lines with \n: edit with \n, then put the file's \r\n back
        text = text.replace("\r\n", "\n")
    want = expected_rows(matrix.tomllib.loads(text)["torch_npu"]["versions"], todo)
    doc = tomlkit.parse(text)
    table, versions = _versions_table(doc, name)
    for change in todo:
        if change.kind == "update":
            old = versions[change.torch]
            comment = old.trivia.comment.lstrip("#").strip() if old.trivia.comment else ""
            versions[change.torch] = _row_item(
                change.new or "", old["cann"].as_string(), change.local, comment
            )
            continue
        item = _row_item(change.new or "", "[]", change.local, CANN_COMMENT)
        older = [k for k in _row_keys(versions) if _key(k) < _key(change.torch)]
        if older:
            position = next(
                i
                for i, (k, _) in enumerate(versions.value.body)
                if k is not None and k.key == older[0]
            )
            versions.value._insert_at(position, change.torch, item)
        else:
            newer = [k for k in _row_keys(versions) if _key(k) > _key(change.torch)]
            if newer:
                versions.value._insert_after(newer[-1], change.torch, item)
            else:
                versions.append(change.torch, item)
    table["read"] = today
    source = str(table.get("source", ""))
    if "package index" not in source:
        table["source"] = (f"{source}; " if source else "") + (
            f"torch_npu releases and their torch: package index "
            f"{client.public_url(index)} (Requires-Dist)"
        )
    out = tomlkit.dumps(doc)
    check_rendered(out, want, name)
    return out.replace("\n", "\r\n") if crlf else out


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nox -s refresh --",
        description="compare matrix.toml [torch_npu.versions] with the torch-npu releases "
        "on the package index (through pip's index, proxy and CA bundle)",
    )
    p.add_argument(
        "--write",
        action="store_true",
        help="apply the difference to the matrix file (atomic; comments, "
        "order and the other tables kept)",
    )
    p.add_argument(
        "--matrix",
        type=Path,
        default=matrix.MATRIX_PATH,
        metavar="FILE",
        help="the matrix file to compare and write (default: the repository's matrix.toml)",
    )
    p.add_argument(
        "--index-url",
        metavar="URL",
        help="ask this simple index only (default: pip's index-url and "
        "extra-index-url; https://pypi.org/simple when pip sets none)",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=20.0,
        metavar="S",
        help="per request (default 20 s; 3 tries)",
    )
    return p


def main(
    argv: Sequence[str], env: Mapping[str, str] | None = None, today: str | None = None
) -> int:
    """Print the difference; with --write apply it. Raises ApexkitError (one line) on failure; nothing written then."""
    args = parser().parse_args(list(argv))
    env = os.environ if env is None else env
    path: Path = args.matrix
    try:
        # bytes: read_text would turn \r\n into \n, and the file would never match again; a regular file only
        # (a named pipe would hang the read), through a link, capped
        raw = untrusted.read_regular(path, None, fsedit.MAX_READ, follow=True)
        text = raw.decode("utf-8")
        rows = matrix.tomllib.loads(text)["torch_npu"]["versions"]
    except untrusted.Refused as exc:
        why = (
            f"it is {untrusted.file_kind(exc.mode)}, not a regular file"
            if exc.kind == "type"
            else f"it {exc.why}"
            if exc.kind == "size"
            else exc.strerror or exc.why
        )
        raise ConfigError(
            f"cannot read {path}: {why}", "pass --matrix with an existing file"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
            "save it as UTF-8, or pass --matrix with a UTF-8 copy",
        ) from None
    except (matrix.tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{path} has no readable [torch_npu.versions] table ({exc})",
            "fix the file (git diff matrix.toml) or pass --matrix",
        ) from None
    check_rows(rows, path)
    settings = client.resolve_settings(args.index_url, env, args.timeout)
    session = client.Client(settings)
    log.info(
        f"▸ torch-npu on {', '.join(client.public_url(u) for u in settings.urls)} ({settings.origin}"
        f"{session.via(settings.urls[0])}); releases >= 2.1 only"
    )
    started = time.monotonic()
    result = survey(session, settings)
    log.info(
        f"✓ {sum(1 for r in result.releases if r.requires)} releases' metadata read with {session.requests} "
        f"requests, {session.received / 1024:.0f} KiB, no wheel downloaded "
        f"({log.format_seconds(time.monotonic() - started)})"
    )
    changes = plan(rows, result.releases)
    print(report(result, changes, path))
    new_text = render(
        text, changes, today or datetime.date.today().isoformat(), settings.urls[0], str(path)
    )
    if new_text == text:
        print(f"{path}: up to date with the index")
        return 0
    target = path.resolve()  # a symlinked matrix: write its target, keep the link
    change = fsedit.Change(
        str(path), target, new_text.encode("utf-8"), mode=fsedit.file_mode(target) or 0o644
    )
    print(change.diff(), end="")
    if not args.write:
        print(f"nothing written; run again with --write to apply it to {path}")
        return 0
    fsedit.preflight([change], f"make {path} writable, or pass --matrix with a copy")
    if fsedit.read_target(target, str(path)) != raw:
        raise ConfigError(
            f"{path} changed while the index was read; nothing was written", "run the refresh again"
        )
    try:
        fsedit.atomic_write(target, change.new or b"", change.mode)
    except OSError as exc:
        raise EnvironmentSetupError(
            f"cannot write {path}: {exc.strerror or exc}; nothing was changed",
            "free space or fix the permissions, then run again",
        ) from None
    print(
        f"wrote {path} ({sum(c.changes_file for c in changes)} rows changed; [torch_npu] read = "
        f"{today or datetime.date.today().isoformat()})"
    )
    return 0


def check_rows(rows: object, path: Path) -> None:
    """[torch_npu.versions] is a table of rows `"X.Y.Z" = { torch_npu = "...", cann = [...] }`: one line otherwise."""
    shape = '"2.1.0" = { torch_npu = "2.1.0.post17", cann = ["8.0.0"] }'
    if not isinstance(rows, dict):
        raise ConfigError(
            f"{path}: [torch_npu.versions] is {json.dumps(rows, default=str)[:60]}, not a table",
            f"write it as a [torch_npu.versions] table of rows like {shape}",
        )
    for torch, row in rows.items():
        if not (
            isinstance(row, dict)
            and isinstance(row.get("torch_npu"), str)
            and isinstance(row.get("cann"), list)
            and isinstance(row.get("torch_local", {}), dict)
        ):
            raise ConfigError(
                f'{path}: [torch_npu.versions] row "{torch}" = {json.dumps(row, default=str)[:80]} is '
                f"not a table with torch_npu (a string) and cann (a list)",
                f"write it like {shape}",
            )


def report(result: Survey, changes: Sequence[RowChange], path: Path) -> str:
    """The survey and the difference, for the terminal: every line with its control characters escaped (version
    strings, file names and Requires-Dist lines come from the index)."""
    lines = [f"{client.public_url(index)}: {what}" for index, what in result.indexes.items()]
    lines.append(f"{'torch_npu':<16} {'torch (Requires-Dist)':<44} platforms")
    for release in result.releases:
        if release.skipped:
            lines.append(f"{release.version:<16} {'SKIPPED: ' + release.skipped}")
            lines += [
                f"{'':<16} {arch} not read either ({why})"
                for arch, why in sorted(release.unread.items())
                if why != release.skipped
            ]
            continue
        reqs = sorted(set(release.requires.values()))
        req = (
            reqs[0]
            if len(reqs) == 1
            else "; ".join(f"{a}: {r}" for a, r in sorted(release.requires.items()))
        )
        req = req or "(no torch requirement)"
        if release.inferred:
            req += f" (torch {release.torch} from the version)"
        lines.append(f"{release.version:<16} {req:<44} {' '.join(release.platforms) or '-'}")
        for arch, why in sorted(release.unread.items()):
            lines.append(f"{'':<16} {arch} not read ({why}): its torch_local kept as it was")
    for reason, versions in result.ignored.items():
        more = f" and {len(versions) - 20} more" if len(versions) > 20 else ""
        lines.append(f"ignored ({reason}): {', '.join(versions[:20])}{more}")
    lines.append(f"{path} [torch_npu.versions] against the index:")
    lines += [describe(c) for c in changes]
    return "\n".join(log.sanitise(line) for line in lines)


# `python -m tools.X ARGS` in a checkout: what its nox session runs, with apexkit's exit codes
if __name__ == "__main__":  # pragma: no cover
    run_main(main)
