"""The option tables of docs/commands.md, generated from the command declarations (apexkit/commands.py, the build
options of apexkit/wheel/options.py, validate/bench of apexkit/venvrun.py; apexkit.declare): what is between the
marker comments is rewritten, the prose around it is kept. `nox -s docs` writes them; `nox -s docs -- --check` (and
tests/unit/test_docs_match_code.py) fails when the committed file differs."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "commands.md"
BEGIN, END = "<!-- docgen:options:begin -->", "<!-- docgen:options:end -->"


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
        or opt.default in (None, True, False, "", ())
        or "(default:" in opt.help
    ):
        return ""
    return f"`{opt.default}`"


def sections() -> tuple:
    """The declared commands whose options docs/commands.md lists."""
    from apexkit import commands, venvrun
    from apexkit.wheel import options

    return (*commands.COMMANDS, options.COMMAND, venvrun.COMMAND)


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


def generated(text: str) -> str:
    """`text` with its marked block replaced by the tables."""
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n\n{tables()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    new = generated(text)
    if "--check" in argv:
        if new != text:
            print(
                f"{DOC.relative_to(ROOT)} differs from the declarations: run nox -s docs",
                file=sys.stderr,
            )
            return 1
        return 0
    if new != text:
        DOC.write_text(new, encoding="utf-8")
        print(f"written: {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
