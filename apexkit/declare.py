"""How a command is declared, once (nox's `_options.py` style with stdlib dataclasses): each command is a frozen
options dataclass whose docstring is its help and whose fields carry their flag, help and default (`option()`),
plus the function that runs it (`Command`). From these declarations come `apexkit <command>`'s argparse parser
(`parser`, `parse`), the invoke tasks (apexkit.commands), `apexkit --help`'s list and completion (apexkit.cli) and
the option tables of docs/commands.md (tools/docgen.py). A shared module: the packages declare their commands'
options with it; the command edge (cli, commands, exits) runs them.

The rules every declared command keeps: a field without a default (`positional=True`) is a positional argument
that may also be given as its --flag; a default-True boolean is switched off by --no-X; `repeat=True` may be given
several times (a list, or a tuple when the declared default is one); `convert` turns the string typed (each one of a
repeated option) into what the function takes, inside the run (a bad value is one `error:` line and its exit code),
where `type` is argparse's (a bad value is a usage error, exit 2); `env`/`config`: an unset value resolves flag >
environment > project file > user file > default (apexkit.config, `setting`). `short` adds a one-letter spelling,
`choices` argparse's, `group` a titled section of --help; a declared --help replaces argparse's own. A field
without option() metadata is not an option (a value the command computes)."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from apexkit.errors import ConfigError


def option(
    default: object = None,
    help: str = "",
    flag: str | None = None,
    env: str | None = None,
    config: str | None = None,
    repeat: bool = False,
    metavar: str | None = None,
    positional: bool = False,
    convert: Callable[[Any], Any] | None = None,
    short: str | None = None,
    choices: tuple[str, ...] | None = None,
    type: Callable[[str], Any] | None = None,
    group: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass field whose metadata is its command-line option (`flag`: default --<field name>); `factory`: a
    default made per object (dataclasses' default_factory)."""
    meta = dict(flag=flag, env=env, config=config, repeat=repeat, metavar=metavar, positional=positional,
                convert=convert, help=help, short=short, choices=choices, type=type, group=group)  # fmt: skip
    factory = factory or (list if repeat and default is None else None)
    if factory:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def json_option(help: str = "print JSON on stdout") -> Any:
    return option(False, help, flag="--json")


def whole_number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{value!r} is not a number", "pass a whole number") from None


def fraction(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{value!r} is not a number", "pass a fraction such as 0.10") from None


@dataclass(frozen=True)
class Opt:
    """One declared option, as the generators read it."""

    dest: str  # the field's name: the keyword the function takes
    flag: str  # --name
    help: str
    default: object
    repeat: bool
    positional: bool
    metavar: str | None
    convert: Callable[[Any], Any] | None
    env: str | None
    config: str | None
    short: str | None = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    group: str | None = None

    @property
    def name(self) -> str:
        """The flag as a Python name (invoke's parameter): --node-interpreter -> node_interpreter."""
        return self.flag[2:].replace("-", "_")


def options_of(cls: type) -> tuple[Opt, ...]:
    out = []
    for f in (f for f in dataclasses.fields(cls) if "flag" in f.metadata):
        m = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else [] if m["repeat"] else None
        out.append(Opt(**{**m, "dest": f.name, "flag": m["flag"] or "--" + f.name.replace("_", "-"),
                          "default": default}))  # fmt: skip
    return tuple(out)


@dataclass(frozen=True)
class Command:
    name: str  # "proxy.setup"
    options: type  # the frozen options dataclass; its docstring is the command's help
    run: Callable[..., object]  # run(options) -> exit code (or a Path: the dist/<target>/ written)
    rest: bool = False  # run(options, rest): what follows a bare -- of `invoke NAME -- ...` (build's options)

    @property
    def doc(self) -> str:
        return " ".join((self.options.__doc__ or "").split())

    @property
    def opts(self) -> tuple[Opt, ...]:
        return options_of(self.options)


@dataclass(frozen=True)
class Spread:
    """A run function for a library function that takes the options as keywords (plus `fixed` ones)."""

    func: Callable[..., object]
    fixed: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def __call__(self, o: object) -> object:
        return self.func(**values(o), **self.fixed)


def values(o: object) -> dict[str, object]:
    return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}  # type: ignore[arg-type]


def setting(opt: Opt, value: object, environ: Mapping[str, str], cfg=None, default: object = None):
    """The config.Value of an option with a config key, and where it came from: the one resolution, flag >
    environment > project file > user file > `default` (apexkit.config; `cfg`: the files, read once)."""
    from apexkit import config

    return (cfg or config.load(environ)).get(str(opt.config), environ, flag=value, default=default)


def settled(opt: Opt, value: object, environ: Mapping[str, str]) -> Any:
    """A given value converted, or an unset one resolved: config key, else environment variable, else default."""
    if opt.config:
        got = setting(opt, value, environ)
        return got.value if got.configured else opt.default
    if value in (None, []) and opt.env and environ.get(opt.env, "").strip():
        value = environ[opt.env].strip()
    if value is None or value == []:
        return opt.default
    if isinstance(
        value, list
    ):  # repeated: each converted, in the declared default's kind (a list, a tuple)
        return type(opt.default)(opt.convert(v) if opt.convert else v for v in value)  # type: ignore[call-arg]
    return opt.convert(value) if opt.convert and isinstance(value, str) else value


def _fits(opt: Opt, value: object) -> bool:
    """Whether a value read from an options file (JSON: untrusted) has the kind a door would have given `opt`."""
    if isinstance(opt.default, bool):
        return isinstance(value, bool)
    if opt.repeat:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    number = (
        isinstance(opt.default, (int, float)) or opt.convert is not None
    )  # uid 1000, --threshold 0.1
    kinds = (str, int, float) if number else (str,)
    return value is None or (isinstance(value, kinds) and not isinstance(value, bool))


def from_data(
    command: Command, data: Mapping[str, object], environ: Mapping[str, str] | None = None
):
    """The options object of `command` from an options file's values (by field name), each checked to be of its
    option's kind and then settled as a typed one is; None when a name is not an option or a value not of its kind."""
    opts = {o.dest: o for o in command.opts}
    if not set(data) <= set(opts) or not all(_fits(opts[k], v) for k, v in data.items()):
        return None
    environ = os.environ if environ is None else environ
    return command.options(**{d: settled(o, data.get(d), environ) for d, o in opts.items()})


def make(command: Command, given: Mapping[str, object], environ: Mapping[str, str] | None = None):
    """The options object of `command` from what a door parsed (by flag name), every value settled."""
    environ = os.environ if environ is None else environ
    return command.options(**{o.dest: settled(o, given.get(o.name), environ) for o in command.opts})


# --- argparse: `apexkit <command>` (builder images have no invoke) ----------------------------------------------


def parser(command: Command, prog: str):
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=command.doc, allow_abbrev=False,
                                add_help=all(o.flag != "--help" for o in command.opts))  # fmt: skip
    groups: dict[str | None, Any] = {None: p}
    for opt in command.opts:
        if opt.group not in groups:
            groups[opt.group] = p.add_argument_group(opt.group)
        add = functools.partial(groups[opt.group].add_argument, *(opt.short,) if opt.short else ())
        if opt.positional:  # positional, or as --name (as invoke takes it): one of the two
            upper = opt.name.upper()
            p.add_argument(f"_{opt.name}", metavar=upper, nargs="?", help=opt.help)
            add(opt.flag, dest=opt.name, metavar="VALUE", help=f"the same as {upper}")
        elif opt.default is True:
            add(
                f"--no-{opt.flag[2:]}",
                dest=opt.name,
                action="store_false",
                default=True,
                help=opt.help,
            )
        elif opt.default is False:
            add(opt.flag, dest=opt.name, action="store_true", help=opt.help)
        else:
            add(opt.flag, dest=opt.name, metavar=opt.metavar or (None if opt.choices else "VALUE"), default=None,
                action="append" if opt.repeat else "store", choices=opt.choices, type=opt.type,
                help=opt.help)  # fmt: skip
    return p


def parse(command: Command, argv: list[str], prog: str) -> dict[str, object]:
    """The parsed options of `command` by name, each positional one given as a --flag or as a positional word."""
    p = parser(command, prog)
    given = vars(p.parse_args(argv))
    required = [o for o in command.opts if o.positional]
    # argparse fills the positionals first to last; the ones given as --flag take none of them
    words = [w for w in (given.pop(f"_{o.name}", None) for o in required) if w is not None]
    free = [o for o in required if given.get(o.name) is None]
    if len(words) > len(free):
        named = ", ".join(o.flag for o in required if o not in free)
        p.error(
            f"{len(words)} positional argument(s) for {len(free)} place(s) "
            f"({' '.join(o.name.upper() for o in free) or 'none'}; {named} given as an option)"
        )
    for opt, word in zip(free, words):
        given[opt.name] = word
    for opt in required:
        if given.get(opt.name) is None:
            p.error(f"{opt.name.upper()} is required (or {opt.flag} VALUE)")
    return given
