"""The pages of a published index that are not PEP 503's: what `invoke publish` writes beside simple/ every time,
inside the same temporary directory that is swapped in (apexkit.index.publish.write), so they never disagree with it.

- `<wheel>.metadata` beside each wheel (PEP 658/714): the bytes of the wheel's *.dist-info/METADATA, read from the
  copy of the wheel in the new index (a wheel published earlier gets its file regenerated the same way); the simple
  page's anchor carries `data-dist-info-metadata` and `data-core-metadata` (`sha256=<hex>`) and, when METADATA has
  one, `data-requires-python`, so pip and uv resolve without downloading wheels.
- `index.html` at the root, for people: a grid (rows torch / torch_npu / CANN, columns Python x arch), each cell the
  wheel with its size, sha256, signer key id (or "unsigned"), SBOM / provenance / signature / metadata links and the
  copy-paste `apexkit install` and `pip install` lines, and the cells of matrix.toml that have no wheel
  ("missing"). Plain HTML, inline CSS, no JavaScript.
- `torch-<version>.html` at the root, one per torch: a find-links page (`pip install apex -f <URL>/torch-2.13.0.html`),
  the way PyG and PyTorch serve theirs.

Everything shown comes from index.json, manifests and wheels, which others may have written: every value is
html-escaped, METADATA is size-capped and must be UTF-8 text, and the base URL the lines name (--base-url) carries
no userinfo, so a password never lands in a page.
"""

from __future__ import annotations

import contextlib
import email.parser
import hashlib
import html
import re
import urllib.parse
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

from apexkit import log
from apexkit.errors import ApexkitError, ConfigError
from apexkit.plan import target as plan_target
from apexkit.wheel import cachedirs

METADATA_SUFFIX = ".metadata"
METADATA_MAX = (
    1 << 20
)  # bytes; apex's METADATA is under 1 KiB, a package's long description rarely 100 KiB
_METADATA_MEMBER = re.compile(r"[^/]+\.dist-info/METADATA")
_TORCH_PAGE = re.compile(r"torch-(?P<version>[0-9A-Za-z.!+_-]+)\.html")
_ARCHES = ("x86_64", "aarch64", "ppc64le", "s390x", "armv7l", "i686")
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1f2328;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
p.lead{color:#57606a;margin:0 0 16px}
table.grid{border-collapse:collapse;width:100%;table-layout:fixed}
.grid th,.grid td{border:1px solid #d0d7de;padding:6px;vertical-align:top;text-align:left;overflow-wrap:anywhere}
.grid thead th{background:#f6f8fa;font-weight:600}
.grid thead th:first-child{width:9em}
.grid tbody th{background:#f6f8fa;font-weight:600}
.grid tbody th span{display:block;font-weight:400;color:#57606a;font-size:12px}
td.empty{color:#8c959f;text-align:center;vertical-align:middle}
td.missing{background:#fff8c5;color:#7d4e00}
.wheel+.wheel{border-top:1px dashed #d0d7de;margin-top:8px;padding-top:8px}
.name{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px;font-weight:600}
.meta{color:#57606a;font-size:11px;margin:2px 0}
.meta code{font-size:11px}
.links a{margin-right:8px;font-size:12px}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:4px;padding:4px 6px;margin:4px 0 0;font-size:11px;
white-space:pre-wrap;overflow-wrap:anywhere;user-select:all}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
ul.missing li{margin:2px 0}
"""


@dataclass(frozen=True)
class Metadata:
    filename: str  # <wheel>.metadata
    sha256: str
    requires_python: str | None  # as METADATA says, checked to be a PEP 440 specifier set


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def count(n: int, thing: str) -> str:
    """ "1 wheel", "2 wheels"."""
    return f"{n} {thing}{'' if n == 1 else 's'}"


# --- --base-url -----------------------------------------------------------------------------------------------------


def check_base_url(url: str) -> str:
    """--base-url, checked: http(s):// or file://, no userinfo (a password would be printed in every page), no
    query or fragment, no spaces or control characters. Returned without its trailing slash."""
    hint = "pass where the index will be served, e.g. --base-url https://wheels.example.com/apex (no user:password@)"
    if any(not ch.isprintable() or ch.isspace() for ch in url):
        raise ConfigError("--base-url has spaces or control characters", hint)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        raise ConfigError("--base-url is not a URL", hint) from None
    if parts.scheme not in ("http", "https", "file"):
        raise ConfigError(
            f"--base-url {log.sanitise(log.mask(url))!r} is not an http(s):// or file:// URL", hint
        )
    if "@" in parts.netloc:
        raise ConfigError(
            "--base-url holds a user name or password: index.html would show it to every reader",
            "publish with the plain URL; readers give their credentials to pip (netrc, keyring) themselves",
        )
    if parts.scheme != "file" and not parts.hostname:
        raise ConfigError(f"--base-url {url!r} names no host", hint)
    if parts.query or parts.fragment or any(c in url for c in "\"'<>`\\"):
        raise ConfigError(f"--base-url {url!r} has a query, fragment or quote characters", hint)
    return url.rstrip("/")


# --- PEP 658 metadata -----------------------------------------------------------------------------------------------


def read_metadata(wheel: Path) -> bytes:
    """The bytes of the one *.dist-info/METADATA of the wheel `wheel` (a file publish itself copied and hashed),
    refused (ConfigError) when there is none, several, or one larger than METADATA_MAX."""
    hint = "rebuild that target (its wheel has no readable METADATA)"
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [i for i in zf.infolist() if _METADATA_MEMBER.fullmatch(i.filename)]
            if len(members) != 1:
                raise ConfigError(
                    f"{wheel.name}: {'no' if not members else len(members)} *.dist-info/METADATA in the wheel",
                    hint,
                )
            info = members[0]
            if info.file_size > METADATA_MAX:
                raise ConfigError(
                    f"{wheel.name}: its METADATA is {info.file_size} bytes (more than {METADATA_MAX})",
                    hint,
                )
            with zf.open(info) as fh:
                data = fh.read(METADATA_MAX + 1)
    except ConfigError:
        raise
    except (
        zipfile.BadZipFile,
        OSError,
        EOFError,
        ValueError,
        NotImplementedError,
        RuntimeError,
    ) as exc:
        raise ConfigError(
            f"{wheel.name}: cannot read its METADATA ({type(exc).__name__}: {log.sanitise(str(exc))[:80]})",
            hint,
        ) from None
    if len(data) > METADATA_MAX:
        raise ConfigError(f"{wheel.name}: its METADATA is more than {METADATA_MAX} bytes", hint)
    return data


def requires_python(data: bytes) -> str | None:
    """METADATA's Requires-Python when it is a PEP 440 specifier set (pip ignores a bad one anyway)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    value = email.parser.HeaderParser().parsestr(text, headersonly=True).get("Requires-Python")
    if not isinstance(value, str) or not value.strip():
        return None
    value = " ".join(value.split())
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        log.warn(
            f"  ignoring Requires-Python {log.sanitise(value)[:60]!r}: not a PEP 440 specifier set"
        )
        return None
    return value


def write_metadata(folder: Path, filename: str) -> Metadata | None:
    """<wheel>.metadata beside the wheel `folder/filename` (PEP 658), from the wheel's METADATA; None, with one warning
    line, when it has none to read (the wheel is published as before, its anchor without the metadata attributes:
    pip then reads the METADATA from the wheel itself, and refuses a broken one there)."""
    try:
        data = read_metadata(folder / filename)
    except ConfigError as exc:
        log.warn(f"  {exc.cause}: published without PEP 658 metadata")
        return None
    name = filename + METADATA_SUFFIX
    with open(folder / name, "xb") as out:
        out.write(data)
    return Metadata(name, hashlib.sha256(data).hexdigest(), requires_python(data))


def anchor(href: str, text: str, metadata: Metadata | None = None) -> str:
    """One anchor of a PEP 503 page, with the PEP 658/714 and requires-python attributes when known."""
    attrs = f' href="{esc(href)}"'
    if metadata is not None:
        digest = f"sha256={metadata.sha256}"
        attrs += f' data-dist-info-metadata="{digest}" data-core-metadata="{digest}"'
        if metadata.requires_python:
            attrs += f' data-requires-python="{esc(metadata.requires_python)}"'
    return f"<a{attrs}>{esc(text)}</a>"


def simple_page(title: str, links: Sequence[tuple[str, str, Metadata | None]]) -> str:
    body = "\n".join(f"    {anchor(href, text, meta)}<br/>" for href, text, meta in links)
    return (
        f'<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{esc(title)}</title>\n  </head>\n  <body>\n{body}\n  </body>\n</html>\n"
    )


# --- what a wheel is for --------------------------------------------------------------------------------------------


def facts(entry: Any) -> dict[str, Any]:
    """python, arch, torch, torch_npu, cann, version, python_tag, platform_tag of a publish Entry: its recorded
    `facts` (index.json, from the build's manifest) where they name a value, else read off its wheel filename and
    target id."""
    _name, version, _, tags = parse_wheel_filename(entry.filename)
    tag = sorted(tags, key=str)[0]
    label = plan_target.read_version(version)
    derived: dict[str, Any] = {
        "version": str(version),
        "python_tag": tag.interpreter,
        "abi_tag": tag.abi,
        "platform_tag": tag.platform,
        "arch": next((a for a in _ARCHES if tag.platform.endswith(a)), tag.platform),
        "python": _python_of(tag.interpreter),
        "torch": entry.torch or (label and label.torch) or "?",
        "torch_npu": label and label.torch_npu,
        "cann": None,
    }
    try:
        from_target = plan_target.Target.from_id(entry.target).facts()
    except ApexkitError:
        from_target = {}
    derived.update({k: v for k, v in from_target.items() if v})
    recorded = getattr(entry, "facts", None)
    if isinstance(recorded, Mapping):
        derived.update(
            {
                k: v
                for k, v in recorded.items()
                if k in derived and isinstance(v, str) and v  # null: not recorded
            }
        )
    with contextlib.suppress(InvalidVersion):
        derived["torch"] = Version(str(derived["torch"])).public
    return derived


def _python_of(interpreter: str) -> str:
    found = re.fullmatch(r"(?:cp|py)(\d)(\d+)", interpreter)
    return f"{found[1]}.{found[2]}" if found else interpreter


# --- coverage -------------------------------------------------------------------------------------------------------


def matrix_cells(matrix: Any) -> list[Any]:
    """The combinations of matrix.toml (apexkit.plan.matrix.Combination: the cells coverage compares with the index)
    that validate (a refused one cannot be built, so it is never "missing")."""
    cells = []
    for combo in matrix.combinations():
        try:
            matrix.validate(combo)
        except ApexkitError:
            continue
        cells.append(combo)
    return cells


def _key(f: Mapping[str, Any]) -> tuple:
    return (f["python"], f["torch"], f["arch"], f.get("torch_npu") or None)


def _cell_key(c: Any) -> tuple:
    """A matrix cell as `_key` gives a wheel's facts: its torch the public version."""
    return (c.python, Version(c.torch).public, c.arch, c.torch_npu)


def missing(cells: Sequence[Any], entries: Sequence[Any]) -> list[Any]:
    """The cells with no wheel among `entries` (compared by python, torch, arch and torch_npu)."""
    have = {_key(facts(e)) for e in entries}
    return [c for c in cells if _cell_key(c) not in have]


def coverage_lines(cells: Sequence[Any], absent: Sequence[Any], where: str) -> list[str]:
    """The `publish --coverage` report: a count, then one Markdown list line per missing cell (the CI job summary
    shows it as it is)."""
    lines = [
        f"coverage: {len(cells) - len(absent)} of {len(cells)} cells of matrix.toml have a wheel in {where}"
        + (f"; {len(absent)} missing:" if absent else "")
    ]
    lines += [f"- {c.id}: {_cell_words(c)} (build: nox -s build-{c.id})" for c in absent]
    return lines


def _cell_words(c: Any) -> str:
    return ", ".join(
        [f"Python {c.python}", f"torch {Version(c.torch).public}"]
        + ([f"torch_npu {c.torch_npu}"] if c.torch_npu else [])
        + ([f"CANN {c.cann}"] if c.cann else [])
        + [c.arch]
    )


# --- index.html and torch-<version>.html ----------------------------------------------------------------------------


def torch_page_name(torch: str) -> str:
    return f"torch-{torch}.html"


def _vkey(text: str | None) -> tuple:
    try:
        return (0, Version(text)) if text else (1, Version("0"))
    except InvalidVersion:
        return (2, Version("0"), str(text))


def write_pages(
    root: Path,
    entries: Sequence[Any],
    metadata: Mapping[str, Metadata],
    base_url: str,
    cells: Sequence[Any] = (),
    generated: str = "",
) -> list[str]:
    """index.html and one torch-<version>.html per torch into the new index `root` (its simple/ already written).
    Returns the names written."""
    by_torch: dict[str, list[Any]] = {}
    for e in entries:
        by_torch.setdefault(facts(e)["torch"], []).append(e)
    names = []
    for torch, mine in sorted(by_torch.items(), key=lambda kv: _vkey(kv[0]), reverse=True):
        name = torch_page_name(torch)
        if _vkey(torch)[0] != 0 or not _TORCH_PAGE.fullmatch(
            name
        ):  # a torch that is no version never names a file
            continue
        (root / name).write_text(
            simple_page(
                f"apex wheels for torch {torch}",
                [
                    (
                        f"simple/{e.project}/{e.filename}#sha256={e.sha256}",
                        e.filename,
                        metadata.get(e.filename),
                    )
                    for e in mine
                ],
            )
        )
        names.append(name)
    (root / "index.html").write_text(
        grid_page(root, entries, metadata, base_url, cells, names, generated)
    )
    return ["index.html", *names]


def grid_page(
    root: Path,
    entries: Sequence[Any],
    metadata: Mapping[str, Metadata],
    base_url: str,
    cells: Sequence[Any],
    torch_pages: Sequence[str],
    generated: str = "",
) -> str:
    """index.html: the compatibility grid, the missing cells, the find-links pages."""
    absent = missing(cells, entries)
    grid = _grid_cells(root, entries, metadata, base_url, cells, absent)
    rows = sorted({row for row, _col in grid}, key=lambda r: tuple(map(_vkey, r)), reverse=True)
    cols = sorted({col for _row, col in grid}, key=lambda c: (_vkey(c[0]), c[1]))
    torches = len({facts(e)["torch"] for e in entries})
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>apex for Ascend: wheel index</title>",
        f"<style>{CSS}</style>",
        "</head>",
        "<body>",
        "<h1>apex for Ascend: wheel index</h1>",
        f'<p class="lead">{count(len(entries), "wheel")} for {count(torches, "torch release")}'
        + (f", published {esc(generated)}" if generated else "")
        + f". Served from <code>{esc(base_url)}/</code>. Install the wheel that fits a venv with "
        "<code>apexkit install</code>; with pip, name the exact version and keep <code>--no-deps</code>, so pip never "
        "changes the venv's torch.</p>",
        f"<pre>apexkit install --index {esc(base_url)}</pre>",
        "<h2>Wheels by torch / torch_npu / CANN and Python &times; arch</h2>",
        '<table class="grid">',
        "<thead><tr><th>torch / torch_npu / CANN</th>"
        + "".join(f"<th>Python {esc(py)} &middot; {esc(arch)}</th>" for py, arch in cols)
        + "</tr></thead>",
        "<tbody>",
    ]
    for torch, npu, cann in rows:
        out += [
            f"<tr><th>torch {esc(torch)}<span>torch_npu {esc(npu or '-')}</span>"
            f"<span>CANN {esc(cann or '-')}</span></th>",
            *(
                grid.get(((torch, npu, cann), col), '<td class="empty">&ndash;</td>')
                for col in cols
            ),
            "</tr>",
        ]
    out += ["</tbody>", "</table>", *_missing_html(absent, len(cells))]
    out.append("<h2>Find-links pages, one per torch</h2><ul>")
    out += [
        f'<li><a href="{esc(name)}">{esc(name)}</a>: '
        f"<code>pip install --no-deps apex -f {esc(base_url)}/{esc(name)}</code></li>"
        for name in torch_pages
    ]
    out.append(
        '</ul><p>PEP 503 simple index: <a href="simple/">simple/</a> (with PEP 658 metadata); '
        'what each file was built from: <a href="index.json">index.json</a>.</p>'
    )
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def _grid_cells(
    root: Path,
    entries: Sequence[Any],
    metadata: Mapping[str, Metadata],
    base_url: str,
    cells: Sequence[Any],
    absent: Sequence[Any],
) -> dict[tuple, str]:
    """The grid's filled cells: ((torch, torch_npu, CANN), (python, arch)) -> its <td>, the wheels there or else
    the matrix cells missing there."""
    stack_cann = {_cell_key(c): c.cann for c in cells if c.cann}
    wheels: dict[tuple, list[str]] = {}
    for e in entries:
        f = facts(e)
        cann = f.get("cann") or stack_cann.get(
            _key(f)
        )  # the matrix cell's CANN when the build recorded none
        key = ((f["torch"], f.get("torch_npu"), cann), (f["python"], f["arch"]))
        wheels.setdefault(key, []).append(_wheel_html(root, e, f, metadata, base_url))
    holes: dict[tuple, list[str]] = {}
    for c in absent:
        holes.setdefault(((_cell_key(c)[1], c.torch_npu, c.cann), (c.python, c.arch)), []).append(
            f'<div class="meta">matrix cell <code>{esc(c.id)}</code>; build: '
            f"<code>nox -s build-{esc(c.id)}</code></div>"
        )
    return {
        **{
            key: '<td class="missing">missing' + "".join(divs) + "</td>"
            for key, divs in holes.items()
        },
        **{
            key: '<td class="wheel-cell">' + "".join(divs) + "</td>" for key, divs in wheels.items()
        },
    }


def _missing_html(absent: Sequence[Any], total: int) -> list[str]:
    """The "missing" section of index.html: the cells of matrix.toml with no wheel."""
    head = f'<h2 id="missing">Missing: cells of matrix.toml with no wheel ({len(absent)} of {total})</h2>'
    if not absent:
        return [head, "<p>None: every cell of matrix.toml has a wheel here.</p>"]
    return [
        head,
        '<ul class="missing">',
        *[
            f"<li><code>{esc(c.id)}</code>: {esc(_cell_words(c))} &mdash; build: "
            f"<code>nox -s build-{esc(c.id)}</code></li>"
            for c in absent
        ],
        "</ul>",
    ]


def _wheel_html(
    root: Path, e: Any, f: dict, metadata: Mapping[str, Metadata], base_url: str
) -> str:
    folder = f"simple/{e.project}/"
    try:
        size = cachedirs.human((root / folder / e.filename).stat().st_size)
    except OSError:
        size = "?"
    sig = getattr(e, "signature", None)  # <wheel>.intoto.jsonl; its keyid: the signer
    files = {
        **{a.kind: a.filename for a in getattr(e, "attestations", ())},
        "wheel": e.filename,
        "METADATA": getattr(metadata.get(e.filename), "filename", None),
        "signature": sig and sig.filename,
    }
    order = {
        "wheel": "wheel",
        "sbom": "SBOM",
        "provenance": "provenance",
        "signature": "signature",
        "METADATA": "METADATA",
    }
    signer = (
        f'signed by <code class="signer" title="{esc(sig.keyid)}">{esc(sig.keyid[:16])}</code>'
        if sig
        else '<span class="signer">unsigned</span>'
    )
    links = [
        f'<a href="{esc(folder + files[k])}">{text}</a>'
        for k, text in order.items()
        if files.get(k)
    ]
    return (
        '<div class="wheel">'
        f'<div class="name">{esc(e.filename)}</div>'
        f'<div class="meta">{esc(size)} &middot; sha256 <code title="{esc(e.sha256)}">{esc(e.sha256[:12])}</code>'
        f" &middot; target <code>{esc(e.target)}</code> &middot; {signer}</div>"
        f'<div class="links">{" ".join(links)}</div>'
        f"<pre>apexkit install --index {esc(base_url)}</pre>"
        f'<pre>pip install --no-deps "{esc(e.project)}=={esc(f["version"])}" --index-url {esc(base_url)}/simple/</pre>'
        "</div>"
    )
