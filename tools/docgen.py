"""The option tables of docs/commands.md, generated from the command declarations (apexkit/commands.py, the build
options of apexkit/wheel/options.py, validate/bench of apexkit/venvrun.py; apexkit.declare), and README's "Behind a
firewall" table, generated from apexkit/config.py SETTINGS: what is between the marker comments is rewritten, the
prose around it is kept. `nox -s docs` writes them; `nox -s docs -- --check` (and tests/unit/test_docs_match_code.py)
fails when a committed file differs."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "commands.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- docgen:options:begin -->", "<!-- docgen:options:end -->"
FIREWALL = "<!-- docgen:firewall:begin -->", "<!-- docgen:firewall:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _spelling(opt) -> str:
    if opt.positional:
        return f"`{opt.name.upper()}` or `{opt.flag} {opt.name.upper()}`"
    short = f" / `{opt.short}`" if opt.short else ""
    if opt.default is True:
        return f"`--no-{opt.flag[2:]}`"
    if opt.default is False:
        return f"`{opt.flag}`{short}"
    value = opt.metavar or ("{" + ",".join(opt.choices) + "}" if opt.choices else "VALUE")
    return f"`{opt.flag} {value}`{short}" + (" (repeatable)" if opt.repeat else "")


def _default(opt) -> str:
    """The declared default; none where the help says it (`(default: …)`: an environment variable, a file)."""
    if (
        opt.positional
        or opt.repeat
        or isinstance(opt.default, bool)
        or opt.default in (None, "", ())  # not 1 or 0, equal to True and False
        or "(default:" in opt.help
    ):
        return ""
    return f"`{opt.default}`"


def sections() -> tuple:
    """The declared commands whose options docs/commands.md lists."""
    from apexkit import commands, venvrun
    from apexkit.fleet import matrixrun
    from apexkit.wheel import options

    return (*commands.COMMANDS, options.COMMAND, matrixrun.COMMAND, venvrun.COMMAND)


def tables() -> str:
    """One section per declared command: its help, then its options (spelling, default, help)."""
    out = []
    for c in sections():
        out += [f"### `{c.name}`", "", _cell(c.doc), ""]
        if c.opts:
            out += ["| option | default | what it does |", "|---|---|---|"]
            out += [f"| {_spelling(o)} | {_default(o)} | {_cell(o.help)} |" for o in c.opts]
            out.append("")
    return "\n".join(out)


def firewall() -> str:
    """README's table of the outside hosts a build can touch: one row per config setting."""
    from apexkit import config

    def code(word: str) -> str:
        return f"`{word}`" if word else ""

    rows = [
        "| outside host | what comes from it | config key | variable | flag |",
        "|---|---|---|---|---|",
    ]
    rows += [
        f"| {s.host} | {_cell(s.what)} | {code(s.key)} | {code(s.env)} | {code(s.flag)} |"
        for s in config.SETTINGS
    ]
    return "\n".join(rows) + "\n"


def _between(text: str, markers: tuple[str, str], body: str) -> str:
    head, rest = text.split(markers[0], 1)
    return f"{head}{markers[0]}\n{body}{markers[1]}{rest.split(markers[1], 1)[1]}"


def generated(text: str) -> str:
    """docs/commands.md's `text` with its marked block replaced by the tables."""
    return _between(text, (BEGIN, END), f"\n{tables()}\n")


def generated_readme(text: str) -> str:
    """README's `text` with its firewall table replaced by the one config.SETTINGS gives."""
    return _between(text, FIREWALL, firewall())


def main(argv: list[str]) -> int:
    stale = []
    for path, make in ((DOC, generated), (README, generated_readme)):
        text = path.read_text(encoding="utf-8")
        new = make(text)
        if new == text:
            continue
        if "--check" in argv:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(new, encoding="utf-8")
            print(f"written: {path.relative_to(ROOT)}")
    if stale:
        print(f"{', '.join(stale)} differ from the declarations: run nox -s docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
