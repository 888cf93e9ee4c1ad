"""The report of a `matrix --run`, for people: a grid (rows: torch / torch_npu stacks; columns: Python × arch; each
cell ok / failed / skipped with the wheel), a build timeline per combination from its manifest's step timings
(`durations_s`: a Markdown table with a text bar per step, and timeline.png when matplotlib imports in this
process; apexkit does not depend on it), and the same Markdown appended to $GITHUB_STEP_SUMMARY.

What comes from a child's manifest is untrusted: the timings are taken only as a JSON object of at most 64 stable
keys ([a-z0-9_]) with finite non-negative numbers; the step summary file is appended to only when it is a regular
file (no link followed), and at most STEP_SUMMARY_MAX bytes of it in all."""

from __future__ import annotations

import importlib
import itertools
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from apexkit import log, untrusted

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
STEP_SUMMARY_MAX = 1024 * 1024  # GitHub shows at most 1 MiB of a step's summary
BAR_WIDTH = 30
MAX_STEPS = 64
_STEP_KEY = re.compile(r"[a-z0-9_]{1,40}")


@dataclass(frozen=True)
class Cell:
    """One finished combination, as the grid and timeline need it."""

    id: str
    python: str
    torch: str
    torch_npu: str  # "" when none
    arch: str
    status: str  # built | cached | failed | refused
    wheel: str = ""
    detail: str = ""
    steps: Mapping[str, float] | None = None  # the manifest's durations_s (total included), checked
    cann: str = ""
    ref: str = ""


def step_timings(manifest: Mapping) -> dict[str, float] | None:
    """A manifest's `durations_s` as {step: seconds} in the order recorded, or None when it is not one (untrusted)."""
    raw = manifest.get("durations_s")
    if not isinstance(raw, dict) or not raw or len(raw) > MAX_STEPS:
        return None
    out: dict[str, float] = {}
    for key, value in raw.items():
        plain = type(value) in (int, float) and math.isfinite(value) and value >= 0
        if not (isinstance(key, str) and _STEP_KEY.fullmatch(key) and plain):
            return None
        out[key] = float(value)
    return out


def _md(text: object) -> str:
    return log.sanitise(str(text)).replace("|", "\\|").replace("`", "'")


def _version_key(text: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+]", text))


def state(status: str) -> str:
    return {"built": "ok", "cached": "ok", "failed": "failed", "refused": "skipped"}.get(
        status, status
    )


def grid(cells: Sequence[Cell]) -> str:
    """The Markdown grid: one row per torch (+ torch_npu, CANN) stack, one column per Python × arch present."""
    if not cells:
        return "### Matrix grid\n\nno combinations"

    def stack(c: Cell) -> str:
        npu, cann = (
            f" + torch_npu {c.torch_npu}" if c.torch_npu else "",
            f" (CANN {c.cann})" if c.cann else "",
        )
        return f"torch {c.torch}{npu}{cann}"

    columns = sorted(
        {(c.python, c.arch) for c in cells}, key=lambda pa: (_version_key(pa[0]), pa[1])
    )
    rows = sorted(
        {(c.torch, c.torch_npu, c.cann): stack(c) for c in cells}.items(),
        key=lambda kv: (_version_key(kv[0][0]), kv[0][1], kv[0][2]),
        reverse=True,
    )
    by_place: dict[tuple, list[Cell]] = {}
    for c in cells:
        by_place.setdefault((c.torch, c.torch_npu, c.cann, c.python, c.arch), []).append(c)
    counts = {s: sum(1 for c in cells if state(c.status) == s) for s in ("ok", "failed", "skipped")}
    lines = [
        f"### Matrix grid: {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped "
        f"of {len(cells)}",
        "",
        "| stack | " + " | ".join(f"py{p} {a}" for p, a in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for key, shown in rows:
        places = [by_place.get((*key, python, arch), []) for python, arch in columns]
        out = ["<br>".join(_cell(c, len(here) > 1) for c in here) or "·" for here in places]
        lines.append(f"| {_md(shown)} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def _cell(c: Cell, several: bool) -> str:
    said = state(c.status)
    mark = {"ok": "✓ ok", "failed": "✕ failed", "skipped": "– skipped"}.get(said, _md(said))
    ref = f" ({_md(c.ref)})" if several and c.ref else ""
    cached = " (cached)" if c.status == "cached" else ""
    return f"{mark}{ref} `{_md(c.wheel)}`{cached}" if said == "ok" and c.wheel else f"{mark}{ref}"


def bar(start: float, length: float, scale: float, width: int = BAR_WIDTH) -> str:
    """A text bar: `width` cells for `scale` seconds, '█' from `start` for `length`, '·' elsewhere; a step that
    took any time gets at least one cell."""
    if scale <= 0:
        return "·" * width
    first = min(width, round(start / scale * width))
    cells = max(round(length / scale * width), 1 if length > 0 else 0)
    cells = min(cells, width - first) if first < width else 0
    if length > 0 and cells == 0 and first >= width:  # a tail step at the far end
        first, cells = width - 1, 1
    return "·" * first + "█" * cells + "·" * (width - first - cells)


def segments(steps: Mapping[str, float]) -> tuple[list[tuple[str, float, float]], float]:
    """(step, start, seconds) laid end to end in the order recorded, and the total (the manifest's `total`, or their
    sum); time the steps do not cover ends it as "other"."""
    total, parts = steps.get("total"), [(k, s) for k, s in steps.items() if k != "total"]
    starts = list(itertools.accumulate((s for _, s in parts), initial=0.0))
    out = [(key, start, seconds) for (key, seconds), start in zip(parts, starts)]
    at = starts[-1]
    if total is None or total < at:
        total = at
    elif total - at >= 0.05:
        out.append(("other", at, total - at))
    return out, total


def timeline(cells: Sequence[Cell]) -> str:
    """The Markdown timeline: per combination that recorded step timings, one row per step with a text bar, all bars
    on one scale (the longest build), so combinations compare at a glance."""
    timed = [(c, segments(c.steps)) for c in cells if c.steps]
    if not timed:
        return "### Build timeline\n\nno step timings recorded (no combination built)"
    scale = max(total for _, (_, total) in timed) or 1.0
    lines = [
        f"### Build timeline (each bar: {BAR_WIDTH} cells = {log.format_seconds(scale)})",
        "",
        "| combination | step | time | start | bar |",
        "|---|---|---|---|---|",
    ]
    for c, (parts, total) in timed:
        lines += [
            f"| {_md(c.id)} | {key} | {log.format_seconds(seconds)} | +{log.format_seconds(start)} | "
            f"`{bar(start, seconds, scale)}` |"
            for key, start, seconds in parts
        ]
        lines.append(
            f"| {_md(c.id)} | **total**{' (cache hit)' if c.status == 'cached' else ''} | "
            f"{log.format_seconds(total)} | | `{bar(0, total, scale)}` |"
        )
    return "\n".join(lines)


def draw_timeline(cells: Sequence[Cell], path: Path) -> str | None:
    """timeline.png: one horizontal bar per combination, its steps as coloured segments (matplotlib, when this
    process can import it). Returns why not drawn, or None when drawn."""
    timed = [(c, segments(c.steps)) for c in cells if c.steps]
    if not timed:
        return "no step timings recorded"
    try:
        # by name: apexkit does not depend on matplotlib (no stubs, no pin); a user's install draws the picture
        importlib.import_module("matplotlib").use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except Exception as exc:  # ImportError, or a broken install: Markdown only
        return f"matplotlib is not importable here ({exc.__class__.__name__})"
    keys: list[str] = []
    for _, (parts, _) in timed:
        keys += [k for k, _, _ in parts if k not in keys]
    colours = plt.get_cmap("tab20")
    colour = {k: colours(i % 20) for i, k in enumerate(keys)}
    fig, ax = plt.subplots(figsize=(10, max(2.6, 1.2 + 0.45 * len(timed))))
    for row, (_, (parts, _)) in enumerate(timed):
        for key, start, seconds in parts:
            ax.barh(row, seconds, left=start, color=colour[key], edgecolor="white", height=0.6)
    ax.set_yticks(range(len(timed)))
    ax.set_yticklabels([c.id for c, _ in timed], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the build started")
    ax.set_title("apexkit matrix run: build timeline (manifest step timings)", fontsize=10)
    ax.legend(  # beside the bars: never over them or the axis label
        [plt.Rectangle((0, 0), 1, 1, color=colour[k]) for k in keys],
        keys,
        fontsize=7,
        ncol=1 if len(keys) <= 12 else 2,
        loc="center left",
        bbox_to_anchor=(1.01, 0.5),
        frameon=False,
    )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, dpi=100, format="png", bbox_inches="tight")
        os.replace(tmp, path)
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    finally:
        plt.close(fig)
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return None


def append_step_summary(text: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """Append `text` to the file $GITHUB_STEP_SUMMARY names, when it names one: a regular file, not followed when a
    link, never created; what it already holds plus ours stays within STEP_SUMMARY_MAX (ours is cut at a line,
    saying so). Returns a one-line reason when nothing (or only part) was appended; None when all of it was."""
    name = environ.get(STEP_SUMMARY)
    if not name:
        return None
    shown = untrusted.shown(name)
    if not os.path.lexists(name):
        return f"${STEP_SUMMARY} {shown} does not exist: the summary was not appended"
    try:
        fd = untrusted.open_regular(name, write=True)
    except untrusted.Untrusted as exc:
        return f"${STEP_SUMMARY}: not appending to {exc}"
    try:
        room = STEP_SUMMARY_MAX - os.fstat(fd).st_size
        data = ("\n" + text.rstrip("\n") + "\n").encode()
        cut = None
        if len(data) > room:
            note = b"\n(cut: the step summary is full; the whole report is in summary.md)\n"
            head = data[: max(0, room - len(note))]
            head = head[: head.rfind(b"\n") + 1] if b"\n" in head else b""
            data = head + note if room >= len(note) else b""
            cut = f"${STEP_SUMMARY} {shown} is near its {STEP_SUMMARY_MAX // 1024} KiB cap: " + (
                "the summary was cut" if data else "nothing was appended"
            )
        if data:
            os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, data)
        return cut
    except OSError as exc:
        return f"cannot append to ${STEP_SUMMARY} {shown}: {exc.strerror or exc}"
    finally:
        os.close(fd)
