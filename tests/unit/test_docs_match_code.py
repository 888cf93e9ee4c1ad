"""The docs name only what the code has: every `nox -s NAME` is a session of noxfile.py, every `invoke NAME` /
`apexkit NAME` a command, every `--flag` written after such a command one it accepts, the README's exit-code table
the codes apexkit/errors.py (and exits.UNEXPECTED) give, and every wheel name the form apexkit builds
(apex-0.1+ascend.torchX.Y.Z[.npuV]-cpXY-cpXY-PLAT.whl, the torch_npu a row or stack of matrix.toml pairs with it).

One checker, `problems(path)`, run over README.md and docs/*.md, and over a planted stale doc to show it fails.
Only code spans and code blocks are read: prose may say anything. A line whose command is another tool's (pip,
docker, git) is skipped; placeholders (`build-3.X`, `build-<id>`, `proxy.<task>`, `fleet.*`) match when some real
name fits them."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import shlex
from functools import lru_cache
from pathlib import Path

from conftest import ROOT

from tools import contracts, docgen, refresh

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# --- what the code has -------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def sessions() -> frozenset:
    """The session names noxfile.py registers (its own registry, read in a fresh one; nox's and apexkit's globals
    are put back, so no other test sees the import)."""
    import nox
    import nox.registry

    from apexkit import vocab

    saved = dict(nox.registry._REGISTRY)
    entry = dict(vocab.ENTRY)
    options = (nox.options.sessions, nox.options.default_venv_backend)
    nox.registry._REGISTRY.clear()
    try:
        spec = importlib.util.spec_from_file_location("_apexkit_noxfile", ROOT / "noxfile.py")
        assert spec and spec.loader
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        return frozenset(nox.registry._REGISTRY)
    finally:
        nox.registry._REGISTRY.clear()
        nox.registry._REGISTRY.update(saved)
        vocab.ENTRY.clear()
        vocab.ENTRY.update(entry)
        nox.options.sessions, nox.options.default_venv_backend = options


def _flags(parser: argparse.ArgumentParser) -> frozenset:
    return frozenset(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


@lru_cache(maxsize=None)
def apexkit_flags() -> dict:
    """apexkit command -> the --flags it accepts (None: it passes unknown ones on, to a bench/ script)."""
    from apexkit import cli

    top = cli.full_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    found: dict = {name: _flags(p) | {"--help"} for name, p in sub.choices.items()}
    for name in ("validate", "bench"):  # their other options go to validate_env.py / amp_bench.py
        found[name] = None
    found["matrix"] = matrix_flags()
    return found


@lru_cache(maxsize=None)
def invoke_flags() -> dict:
    """invoke task -> the --flags invoke takes for it: each option's flag, --no-X for a default-True one (invoke
    takes both spellings then), the renamed spelling; `invoke build` passes what follows a bare -- to the build."""
    from apexkit import commands, declare

    found = {}
    for c in commands.COMMANDS:
        flags = set(_flags(declare.parser(c, f"invoke {c.name}")))
        flags |= {o.flag for o in c.opts} | {"--help"}
        found[c.name] = frozenset(flags)
    return found


@lru_cache(maxsize=None)
def session_flags() -> dict:
    """What follows `nox -s NAME --`: the build options for build-*, matrix's own, none checked for the rest."""
    from apexkit.wheel import options

    build = _flags(options.parser()) | {"--help"}
    found: dict = {name: build for name in sessions() if name.startswith("build-")}
    found["build-bench"] = None
    found["matrix"] = matrix_flags()
    # the maintainers' tools (tools/, in a checkout) with their own parsers
    found["contracts"] = _flags(contracts.parser()) | {"--help"}
    found["refresh"] = _flags(refresh.parser()) | {"--help"}
    return found


def matrix_flags() -> frozenset:
    """matrix's options."""
    from apexkit.fleet import matrixrun

    return _flags(matrixrun.parser()) | {"--help"}


@lru_cache(maxsize=None)
def _classes() -> dict:
    """Every exception class of apexkit/ (read, not imported): name -> (base names, its own exit_code or None)."""
    found = {}
    for path in (ROOT / "apexkit").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if not re.search(r"^\s*class \w+\([\w.]*(Error|Exception)\b", text, flags=re.M):
            continue  # no exception class here: not worth parsing
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                code = None
                for stmt in node.body:
                    if (
                        isinstance(stmt, ast.Assign)
                        and any(getattr(t, "id", "") == "exit_code" for t in stmt.targets)
                        and isinstance(stmt.value, ast.Constant)
                    ):
                        code = stmt.value.value
                bases = [
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                ]
                found[node.name] = (bases, code)
    return found


def code_exit_codes() -> set:
    """The exit code of every ApexkitError subclass (its own, else its base's), 0, and exits.UNEXPECTED."""
    from apexkit import exits

    classes = _classes()

    def code(name: str, seen: tuple = ()):
        if name not in classes or name in seen:
            return None
        bases, own = classes[name]
        if own is not None:
            return own
        return next((c for c in (code(b, (*seen, name)) for b in bases) if c is not None), None)

    def is_error(name: str, seen: tuple = ()) -> bool:
        if name == "ApexkitError":
            return True
        return (
            name in classes
            and name not in seen
            and any(is_error(b, (*seen, name)) for b in classes[name][0])
        )

    codes = {code(name) for name in classes if is_error(name)}
    return {c for c in codes if c is not None} | {0, exits.UNEXPECTED}


def readme_exit_codes(text: str) -> set:
    section = text.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.M)}


# --- what a doc says ---------------------------------------------------------------------------------------------
def snippets(text: str):
    """(line number, text) of each code block line and each inline code span (a span may wrap onto the next line:
    it is joined, numbered by its first line)."""
    fence, para, start = False, [], 1

    def spans():
        joined = "\n".join(para)
        for m in re.finditer(r"``(.+?)``|`([^`]+)`", joined, flags=re.S):
            yield (
                start + joined.count("\n", 0, m.start()),
                " ".join((m.group(1) or m.group(2)).split()),
            )

    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```") or (not fence and not line.strip()):
            yield from spans()
            para, start = [], number + 1
            if line.strip():
                fence = not fence
            continue
        if fence:
            yield number, line
        else:
            para.append(line)
    yield from spans()


def _pattern(name: str) -> re.Pattern:
    """A doc's name as a pattern: <id>, NAME, * and … stand for any text, 3.X for any minor version."""
    out = ""
    for part in re.split(r"(<[^>]*>|\b[A-Z][A-Z_]+\b|\*|…|\.\.\.|3\.X\b)", name):
        if not part:
            continue
        if part == "3.X":
            out += r"3\.\d+"
        elif (
            part.startswith("<") or part in ("*", "…", "...") or re.fullmatch(r"[A-Z][A-Z_]+", part)
        ):
            out += ".+"
        else:
            out += re.escape(part)
    return re.compile(out + r"\Z")


def _known(name: str, names) -> bool:
    pattern = _pattern(name)
    return any(pattern.match(n) for n in names)


def _expand(word: str) -> list:
    """proxy.setup/check/env -> proxy.setup, proxy.check, proxy.env (the docs' shorthand)."""
    first, *rest = word.split("/")
    group = first.split(".")[0] + "." if "." in first else ""
    return [first] + [group + r for r in rest]


def _words(text: str) -> list:
    """The shell words of one command, up to the end of it (|, &&, ;, >, a # comment, a closing paren)."""
    text = re.split(r"\s(?:\||&&|>|#|→|->)\s?|;|\)", text + " ")[0]
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    return [w.strip("[]") for w in words if w.strip("[]")]  # [-- --run | --write]: optional parts


# a command where a shell reads one: a line's (span's) start, after && || ; | ( $( and a prompt, sudo/env/time
# or VAR=value words; elsewhere (`~/.cache/apexkit`, `pip install apexkit`, a layout table's prose) it is not one
COMMAND = re.compile(
    r"(?:^|&&|\|\||[;|(]|\$\()\s*(?:\$\s+)?(?:(?:sudo|time|env|exec)\s+)*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"
    r"(nox|invoke|apexkit|python3? -m apexkit)\s+(?=\S)"
)
NAME = re.compile(r"[A-Za-z0-9<][\w.<>*…/-]*\Z")


def problems(path: Path) -> list:
    """file:line: what a doc names that the code does not have."""
    text = path.read_text(encoding="utf-8")
    found = commands_named(path.name, snippets(text))
    for number, line in enumerate(text.splitlines(), 1):  # prose too
        for wheel in re.findall(r"\bapex-[0-9][^\s`|,)'\"]*", line):
            found += _wheel(f"{path.name}:{number}", wheel)
    return found


def commands_named(name: str, lines) -> list:
    """name:line: each nox/invoke/apexkit command of `lines` ((number, text) pairs) the code does not have."""
    from apexkit import cli

    apexkit_names = {name for name, _, _ in cli.entries()} | {
        "--help",
        "--version",
        "-V",
        "help",
        "version",
    }
    found = []
    for number, line in lines:
        where = f"{name}:{number}"
        for m in COMMAND.finditer(line.strip()):
            tool, words = m.group(1), _words(line.strip()[m.end() :])
            if not words:
                continue
            if tool == "nox":
                found += _nox(where, words)
            elif tool == "invoke":
                found += _command(where, "invoke", words, invoke_flags())
            else:
                names = apexkit_names
                if len(words) > 1 and f"{words[0]}.{words[1]}" in names:  # `apexkit cache list`
                    words = [f"{words[0]}.{words[1]}", *words[2:]]
                if words[0] in ("-q", "--quiet"):  # apexkit's own, before the command
                    words = words[1:] or ["--quiet"]
                if not NAME.match(words[0]) and not words[0].startswith("-"):
                    continue  # `apexkit <command>`'s prose neighbours: not a name
                if (
                    words[0] not in names
                    and not words[0].startswith("-")
                    and not _known(words[0], names)
                ):
                    found.append(f"{where}: apexkit {words[0]}: no such command (apexkit --help)")
                    continue
                found += _command(where, "apexkit", words, apexkit_flags())
    return found


def _flag_problems(where: str, said: str, words: list, accepted) -> list:
    if accepted is None:
        return []
    out = []
    for i, word in enumerate(words):
        if word == "--":
            break
        flag = word.split("=", 1)[0]
        if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in accepted:
            out.append(f"{where}: {said} {flag}: no such option")
        value = (
            word.split("=", 1)[1] if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
        )
        if flag == "--stack" and value and not _known(value, _matrix().stack_names()):
            out.append(f"{where}: {said} --stack {value}: no such stack (matrix.toml [stacks])")
    return out


def _command(where: str, tool: str, words: list, flags: dict) -> list:
    head, rest = words[0], words[1:]
    if head.startswith("-"):  # invoke --list, apexkit --version: the tool's own
        return []
    out = []
    for name in _expand(head):
        if name in flags:
            out += _flag_problems(where, f"{tool} {name}", rest, flags[name])
            if (
                tool == "invoke" and name == "build" and "--" in rest
            ):  # invoke build -- <build options>
                tail = rest[rest.index("--") + 1 :]
                out += _flag_problems(where, "invoke build --", tail, _build_flags())
        elif not _known(name, flags):
            out.append(f"{where}: {tool} {name}: no such command ({tool} --help)")
    return out


def _build_flags() -> frozenset:
    from apexkit.wheel import options

    return _flags(options.parser()) | {"--help"}


def _nox(where: str, words: list) -> list:
    if words[0] not in ("-s", "--session", "--sessions"):
        return []  # nox -l, nox -t build: nox's own
    names, rest = [], words[1:]
    while rest and not rest[0].startswith("-") and NAME.match(rest[0]):
        names += _expand(rest.pop(0))
    out = []
    known = sessions()
    accepted: frozenset | None = (
        frozenset()
    )  # one `-- ARGS` for all: each session takes its own (apexkit.noxrun)
    for name in names:
        if name not in known and not _known(name, known):
            out.append(f"{where}: nox -s {name}: no such session (nox -l)")
            continue
        flags = session_flags().get(name, _build_flags() if name.startswith("build-") else None)
        accepted = None if flags is None or accepted is None else accepted | flags
    if "--" in rest and names and not out:
        said = f"nox -s {' '.join(names)} --"
        out += _flag_problems(where, said, rest[rest.index("--") + 1 :], accepted)
    return out


WHEEL = re.compile(
    r"apex-(?P<version>[^-]+)-(?P<python>cp\d+|…|\.\.\.|\*)(?:-(?P<abi>cp\d+)-(?P<plat>[A-Za-z0-9_]+)\.whl)?"
)


def _wheel(where: str, name: str) -> list:
    """An apex wheel name (an ellipsis may stand for its tail) in the form the code gives it."""
    from apexkit.plan import target

    m = WHEEL.match(name)
    cuda = re.fullmatch(  # an NVIDIA apex CUDA wheel: target.Target.version
        re.escape(target.NVIDIA_BASE_VERSION)
        + r"\+cu(?P<cu>\d{3,4})\.torch(?P<torch>\d+\.\d+\.\d+)",
        m.group("version") if m else "",
    )
    if cuda:
        cu = cuda["cu"]
        made = target.Target.of(
            "3", cuda["torch"], "x86_64", backend="cuda", cuda=f"{cu[:-1]}.{cu[-1]}"
        )
        if made.version != m.group("version"):
            return [
                f"{where}: {name}: not what target.Target({cuda['torch']}, cuda …).version writes"
            ]
        return []
    label = re.fullmatch(
        re.escape(target.BASE_VERSION)
        + r"\.torch(?:(?P<torch>\d+\.\d+\.\d+)|X\.Y\.Z|<T>)(?:\.npu(?P<npu>[0-9a-z.]+?|V|<N>))?"
        + r"(?P<asan>\.asan)?",  # a --sanitize build (apexkit/plan/target.py SANITIZED)
        m.group("version") if m else "",
    )
    if not m or not label:
        return [
            f"{where}: {name}: not an apexkit wheel name "
            f"(apex-{target.BASE_VERSION}.torchX.Y.Z[.npuV]-cpXY-cpXY-PLAT.whl: plan/target.py Target.label)"
        ]
    if (
        label["torch"]
        and target.Target.of("3", label["torch"], "x86_64", torch_npu=label["npu"]).label
        + (label["asan"] or "")
        != m.group("version")[len(target.BASE_VERSION) :]
    ):
        return [
            f"{where}: {name}: its label is not Target.label of torch {label['torch']}, npu {label['npu']}"
        ]
    if m.group("abi") and m.group("abi") != m.group("python"):
        return [f"{where}: {name}: python tag {m.group('python')} with abi tag {m.group('abi')}"]
    if label["torch"] and label["npu"] and label["npu"][0].isdigit():
        return _pair(where, name, label["torch"], label["npu"], _matrix())
    return []


def _pair(where: str, name: str, torch: str, npu: str, m) -> list:
    pairs = {(torch_, row["torch_npu"]) for torch_, row in m.data["torch_npu"]["versions"].items()}
    pairs |= {(s.torch, s.torch_npu) for s in (m.stack(n) for n in m.stack_names()) if s.torch_npu}
    if (torch, npu) in pairs:
        return []
    return [
        f"{where}: {name}: torch {torch} with torch_npu {npu} is no row of matrix.toml (nor a stack)"
    ]


@lru_cache(maxsize=None)
def _matrix():
    from apexkit.plan import matrix

    return matrix.load()


def labels(path: Path) -> list:
    """Version labels written alone (0.1+ascend.torch2.7.1.npu2.7.1.post8): a torch_npu pair matrix.toml has."""
    from apexkit.plan import target

    out = []
    for number, line in snippets(path.read_text(encoding="utf-8")):
        for torch, npu in re.findall(
            re.escape(target.BASE_VERSION)
            + r"\.torch(\d+\.\d+\.\d+)\.npu(\d+\.\d+\.\d+(?:\.post\d+)?)",
            line,
        ):
            out += _pair(f"{path.name}:{number}", f"{target.BASE_VERSION}.torch{torch}.npu{npu}", torch, npu,
                         _matrix())  # fmt: skip
    return out


def sessions_named(path: Path) -> list:
    """file:line: each `nox -s NAME` anywhere in the file (prose, comments too) that is no session."""
    found, known = [], sessions()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in re.finditer(r"\bnox -s ([A-Za-z0-9<][\w.<>*…/-]*)", line):
            for name in _expand(m.group(1).rstrip(".")):
                if name not in known and not _known(name, known):
                    found.append(f"{path.name}:{number}: nox -s {name}: no such session (nox -l)")
    return found


def help_texts():
    """(where, text) of every help string a user reads: each command's doc and option help, the build options."""
    from apexkit import commands
    from apexkit.fleet import matrixrun
    from apexkit.wheel import options

    for c in commands.COMMANDS:
        yield f"{c.name} --help", c.doc
        for o in c.opts:
            yield f"{c.name} --help {o.flag}", o.help
    for name, p in (("build --help", options.parser()), ("matrix --help", matrixrun.parser())):
        yield name, p.description or ""
        for a in p._actions:
            if a.help and a.help != argparse.SUPPRESS:
                yield f"{name} {'/'.join(a.option_strings)}", a.help


# --- the tests ---------------------------------------------------------------------------------------------------
def test_every_doc_names_only_what_the_code_has():
    found = [p for doc in DOCS for p in problems(doc) + labels(doc)]
    assert not found, "stale docs:\n" + "\n".join(dict.fromkeys(found))


def test_the_readme_exit_codes_are_the_codes_apexkit_exits_with():
    said = readme_exit_codes((ROOT / "README.md").read_text(encoding="utf-8"))
    code = code_exit_codes()
    assert said == code, f"README only: {sorted(said - code)}; code only: {sorted(code - said)}"


def test_a_planted_stale_line_is_reported_with_its_file_and_line(tmp_path):
    doc = tmp_path / "stale.md"
    doc.write_text(
        "# stale\n\nBuild a stack with `nox -s build-stack-foo`.\n\n```bash\ninvoke no.such --flag\n"
        "apexkit build 3.11 --no-such-option --stack no-such-stack\napexkit publish --index DIR --split-by-torch\n"
        "pip install apexkit --index-url URL    # another tool's line\n```\n"
        "The wheel: `apex-0.1+ascend-cp311-cp311-linux_x86_64.whl`, label `0.1+ascend.torch2.7.1.npu2.7.1.post8`.\n",
        encoding="utf-8",
    )
    found = problems(doc) + labels(doc)
    assert any(p.startswith("stale.md:3: nox -s build-stack-foo") for p in found), found
    assert any(p.startswith("stale.md:6: invoke no.such") for p in found), found
    assert any(p.startswith("stale.md:7: apexkit build --no-such-option") for p in found), found
    assert any(p.startswith("stale.md:7: apexkit build --stack no-such-stack") for p in found), (
        found
    )
    assert any(p.startswith("stale.md:11: apex-0.1+ascend-cp311") for p in found), found
    assert any("stale.md:11: 0.1+ascend.torch2.7.1.npu2.7.1.post8" in p for p in found), found
    assert not any(":8:" in p or ":9:" in p for p in found), found  # real flags, pip's line


def test_a_missing_exit_code_is_reported_both_ways():
    table = "### Exit codes\n\n| code | meaning |\n|---|---|\n| 0 | done |\n| 2 | configuration |\n| 99 | none |\n"
    said, code = readme_exit_codes(table), code_exit_codes()
    assert 1 in code - said and 70 in code - said and 99 in said - code


def test_every_help_string_names_only_what_the_code_has():
    found = []
    for where, text in help_texts():
        found += commands_named(where, [(0, text)])
        for wheel in re.findall(r"\bapex-[0-9][^\s`|,)'\"]*", text):
            found += _wheel(where, wheel)
        if re.search(r"name does\s+not carry the torch", text):
            found.append(
                f"{where}: says wheel names lack the torch (they carry it: docs/wheels.md)"
            )
    assert not found, "stale help:\n" + "\n".join(dict.fromkeys(found))


def test_every_session_named_in_prose_and_in_matrix_toml_exists(tmp_path):
    found = [p for path in [*DOCS, ROOT / "matrix.toml"] for p in sessions_named(path)]
    assert not found, "stale session names:\n" + "\n".join(found)
    planted = tmp_path / "matrix.toml"
    planted.write_text(
        "# one stack: nox -s build-stack-NAME, or nox -s build-NAME\n", encoding="utf-8"
    )
    assert sessions_named(planted) == [
        "matrix.toml:1: nox -s build-stack-NAME: no such session (nox -l)"
    ]


def _commands_table() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("## Commands", 1)[1].split("\n## ", 1)[0]


def test_the_readme_commands_table_names_every_command_and_session():
    """The other way: what `apexkit --help` and `nox -l` offer is in the README's table (a group's shorthand,
    proxy.setup/check/env, counts for each; a nox-named one counts: its row says `apexkit <command>` runs every
    command above; a session counts when a `nox -s` pattern there fits it)."""
    from apexkit import cli

    table = _commands_table()
    named = set()
    for m in re.finditer(r"(?:apexkit|invoke|nox -s) ([a-z][\w.-]*(?:/[\w-]+)*)", table):
        named |= set(_expand(m.group(1)))
    missing = [name for name, _, _ in cli.entries() if name not in named]
    patterns = [
        _pattern(n) for m in re.finditer(r"nox -s ([^\s`]+)", table) for n in _expand(m.group(1))
    ]
    unlisted = [s for s in sorted(sessions()) if not any(p.match(s) for p in patterns)]
    assert not missing and not unlisted, (
        f"README ## Commands lacks commands {missing}, sessions {unlisted}"
    )


def test_the_build_options_table_is_the_build_parser():
    """docs/building.md ## Options lists every build option (wheel/options.py; hidden spellings aside), no other."""
    from apexkit.wheel import options

    shown = {
        s
        for a in options.parser()._actions
        if a.help != argparse.SUPPRESS
        for s in a.option_strings
        if s.startswith("--") and s != "--help"
    }
    text = (ROOT / "docs" / "building.md").read_text(encoding="utf-8")
    section = text.split("## Options", 1)[1].split("\n## ", 1)[0]
    table = {
        f
        for row in re.findall(r"^\| (.*?) \|", section, flags=re.M)
        for f in re.findall(r"--[a-z][a-z0-9-]*", row)
    }
    assert table == shown, (
        f"table only: {sorted(table - shown)}; options.py only: {sorted(shown - table)}"
    )


def firewall_table(text: str) -> set[tuple[str, str, str]]:
    """README ## Behind a firewall: (config key, variable, flag) of each row ("" where a cell is empty)."""
    section = text.split("## Behind a firewall", 1)[1].split("\n## ", 1)[0]
    found = set()
    for row in re.findall(r"^\|(.*)\|$", section, flags=re.M):
        cells = [c.strip().strip("`") for c in row.split("|")]
        if len(cells) == 5 and re.fullmatch(r"[a-z_]+", cells[2]) and cells[2] != "---":
            found.add((cells[2], cells[3], cells[4]))
    return found


def test_the_readme_firewall_table_is_the_config_table():
    """Both ways: every setting of apexkit/config.py is a row of README's firewall table with its variable and
    flag, and the table names no key, variable or flag the code does not have."""
    from apexkit import config

    said = firewall_table((ROOT / "README.md").read_text(encoding="utf-8"))
    code = {(s.key, s.env, s.flag) for s in config.SETTINGS}
    assert said == code, (
        f"README only: {sorted(said - code)}; config.py only: {sorted(code - said)}"
    )


def test_the_readme_firewall_table_is_generated_from_the_settings():
    """README's "Behind a firewall" table is what config.SETTINGS generates (nox -s docs); a stale cell is caught."""
    text = docgen.README.read_text(encoding="utf-8")
    assert docgen.generated_readme(text) == text, (
        "README.md's firewall table is stale: run nox -s docs"
    )
    planted = text.replace("| Docker Hub | openeuler,", "| Docker Hub | fedora,")
    assert planted != text and docgen.generated_readme(planted) != planted


def test_a_stale_firewall_row_is_caught():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    planted = text.replace("`APEXKIT_DEBIAN_MIRROR`", "`APEXKIT_DEBIAN_URL`")
    from apexkit import config

    code = {(s.key, s.env, s.flag) for s in config.SETTINGS}
    assert firewall_table(planted) != code


def test_the_commands_option_tables_are_what_the_declarations_generate():
    """docs/commands.md's option tables are generated (nox -s docs, tools/docgen.py): what is committed is what the
    declarations give, every declared option in them (the build's and validate/bench's too); a planted stale row
    is caught."""
    text = docgen.DOC.read_text(encoding="utf-8")
    assert docgen.generated(text) == text, "docs/commands.md is stale: run nox -s docs"
    assert {"build <python>", "validate/bench"} <= {c.name for c in docgen.sections()}
    for c in docgen.sections():  # the commands, the build options, validate/bench
        assert f"### `{c.name}`" in text and all(o.flag[2:] in text for o in c.opts), c.name
    planted = text.replace(
        "| `--daemon-mode VALUE` | `auto` |", "| `--daemon-mode VALUE` | `systemd` |"
    )
    assert planted != text and docgen.generated(planted) != planted


def test_the_air_gapped_path_is_in_start_here_and_a_wheelhouse_is_documented_from_the_code():
    """issue 41 A/B: README's Start here had no air-gapped row, command 1 no offline recipe, and no doc said what a
    wheelhouse must hold; the requirements listed are the ones the build installs (matrix.toml)."""
    from apexkit.plan import matrix

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.split("## Start here", 1)[1].split("\n## ", 1)[0]
    row = next((line for line in start.splitlines() if line.startswith("| air-gapped")), "")
    assert "--offline --wheelhouse DIR" in row, row
    assert "docs/building.md#mirrors-for-air-gapped-sites" in row, row
    assert "pip download -r requirements/runtime.txt -d DIR" in readme
    assert "pip install --no-index --find-links DIR -r requirements/runtime.txt" in readme
    building = (ROOT / "docs" / "building.md").read_text(encoding="utf-8")
    section = building.split("### What a wheelhouse must hold", 1)[1].split("\n## ", 1)[0]
    m = matrix.load()
    for requirement in {*m.build_requires, *m.cuda_requires, *m.npu_requires}:
        assert f"`{requirement}`" in section, requirement
    assert "pip download wheel 'setuptools>=61' -d W" in section
