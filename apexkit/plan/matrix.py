"""matrix.toml: refs and their setup.py flags, Pythons, torch pairings, torch_npu, build requirements.

Pure functions over data; every refusal names the table that rules a combination out.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from apexkit import paths, vocab
from apexkit.errors import ConfigError
from apexkit.plan import cudaarch, target

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROJECT_ROOT = paths.ROOT  # the checkout, or apexkit/_data when installed
MATRIX_PATH = paths.MATRIX


@dataclass(frozen=True)
class RefSpec:
    """What one Ascend apex ref needs: setup.py flags and the modules it compiles."""

    name: str
    flags: tuple[str, ...]
    extensions: tuple[str, ...]
    needs_npu_headers: bool
    known: bool  # False: not in matrix.toml, flags detected from the sources


@dataclass(frozen=True)
class Matrix:
    data: dict

    # --- sources -----------------------------------------------------------------------------------------------
    @property
    def ascend_apex_url(self) -> str:
        return self.data["sources"]["ascend_apex_url"]

    @property
    def nvidia_apex_url(self) -> str:
        return self.data["sources"]["nvidia_apex_url"]

    @property
    def source_urls(self) -> dict[str, str]:
        """The upstream git URLs by config key: the defaults config.effective_with resolves against."""
        return {"ascend_apex_url": self.ascend_apex_url, "nvidia_apex_url": self.nvidia_apex_url}

    @property
    def default_ref(self) -> str:
        return self.data["sources"]["default_ref"]

    @property
    def nvidia_apex_commit(self) -> str:
        return self.data["sources"]["nvidia_apex_commit"]

    # --- refs --------------------------------------------------------------------------------------------------
    def known_refs(self) -> list[str]:
        return [name for entry in self.data["refs"] for name in entry["names"]]

    def ref(self, name: str) -> RefSpec | None:
        for entry in self.data["refs"]:
            if name in entry["names"]:
                return RefSpec(
                    name=name,
                    flags=tuple(entry["flags"]),
                    extensions=tuple(entry["extensions"]),
                    needs_npu_headers=bool(entry["needs_npu_headers"]),
                    known=True,
                )
        return None

    # --- pythons and torch -------------------------------------------------------------------------------------
    @property
    def session_pythons(self) -> list[str]:
        return list(self.data["pythons"]["sessions"])

    @property
    def default_python(self) -> str:
        """The target Python when a command names none (matrix.toml [pythons] default)."""
        return str(self.data["pythons"]["default"])

    @property
    def supported_pythons(self) -> list[str]:
        return list(self.data["pythons"]["supported"])

    def check_python(self, version: str) -> None:
        refused = self.data["pythons"].get("refused", {})
        if version in refused:
            raise ConfigError(
                f"Python {version} is refused: {refused[version]}",
                f"build for Python {self.supported_pythons[0]} or newer, e.g. {vocab.build('3.10')}",
            )
        if version not in self.supported_pythons:
            raise ConfigError(
                f"Python {version} is not supported (matrix.toml [pythons] supported: "
                f"{', '.join(self.supported_pythons)})",
                f"pick one of those, e.g. {vocab.build('3.10')}",
            )

    def default_torch(self, python: str) -> str:
        self.check_python(python)
        return self.data["pythons"]["default_torch"][python]

    def check_torch_python(self, torch: str, python: str) -> None:
        """Refuse a torch release that ships no wheel for this Python (matrix.toml [torch_python])."""
        series = torch_series(torch)
        table = self.data["torch_python"]
        if series not in table:
            known = ", ".join(k for k in table if k[0].isdigit())
            raise ConfigError(
                f"torch {torch} is not in matrix.toml [torch_python] (known series: {known})",
                "pick a listed torch, or add its row after reading PyTorch's release notes",
            )
        pythons = table[series]
        if python not in pythons:
            raise ConfigError(
                f"torch {torch} has no wheels for Python {python} (matrix.toml [torch_python] "
                f"row {series}: Python {', '.join(pythons)})",
                f"use --torch {self.newest_torch_for(python) or '<a release for this Python>'} or another Python",
            )

    def newest_torch_for(self, python: str) -> str | None:
        series = [
            k for k, v in self.data["torch_python"].items() if isinstance(v, list) and python in v
        ]
        if not series:
            return None
        best = max(series, key=lambda s: tuple(int(p) for p in s.split(".")))
        for torch, entry in self.data["torch_npu"]["versions"].items():
            if torch_series(torch) == best and entry:
                return torch
        return f"{best}.0"

    def torch_npu_for(self, torch: str) -> str:
        base = torch.split("+", 1)[0]
        versions = self.data["torch_npu"]["versions"]
        if base not in versions:
            raise ConfigError(
                f"no torch_npu release is known for torch {base} (matrix.toml [torch_npu.versions]: "
                f"{', '.join(versions)})",
                "pick a torch that has one (e.g. --torch 2.1.0 or 2.7.1), or drop --npu",
            )
        return versions[base]["torch_npu"]

    def check_torch_npu(self, torch: str, torch_npu: str) -> None:
        """Refuse a torch_npu release that belongs to another torch (torch_npu X.Y.Z[.postN] pairs with torch X.Y.Z)."""
        base = torch.split("+", 1)[0]
        npu_base = torch_npu_torch(torch_npu)
        if npu_base != base:
            row = self.data["torch_npu"]["versions"].get(base)
            raise ConfigError(
                f"torch_npu {torch_npu} is built for torch {npu_base}, not torch {base} (Ascend/pytorch pairs "
                f"torch_npu X.Y.Z[.postN] with torch X.Y.Z)",
                f"use --torch-npu {row['torch_npu']}"
                if row
                else f"use --torch {npu_base}, or pick a torch with a row in matrix.toml [torch_npu.versions]",
            )

    # --- named training stacks --------------------------------------------------------------------------------
    def stack_names(self) -> list[str]:
        return list(self._stack_entries())

    def _stack_entries(self) -> dict[str, dict]:
        """matrix.toml [stacks], checked for shape: each name is a session name (build-<name>) and a file name (logs),
        so it is plain, and it must not take over another session; each entry is a table of known string keys."""
        stacks = self.data.get("stacks", {})
        if not isinstance(stacks, dict):
            raise ConfigError(
                "matrix.toml [stacks] is not a table",
                "write each stack as [stacks.NAME] with its keys",
            )
        include_ids = {
            Combination(
                python=str(e.get("python")),
                torch=str(e.get("torch")),
                arch=str(e.get("arch")),
                ref=str(e.get("ref") or self.default_ref),
                default_ref=self.default_ref,
            ).id
            for e in self.data.get("matrix", {}).get("include", [])
            if isinstance(e, dict)
        }
        reserved = {*self.session_pythons, *self.supported_pythons, "bench", *include_ids}
        for name, entry in stacks.items():
            where = (
                f"matrix.toml [stacks.{name}]"
                if _STACK_NAME.match(name)
                else f"matrix.toml [stacks] {name!r}"
            )
            if not _STACK_NAME.match(name) or name in reserved:
                raise ConfigError(
                    f"{where}: a stack name must be lower-case letters, digits, '.', '_' or '-' and not "
                    f"a Python version, 'bench' or a [[matrix.include]] id (its session is build-<name>)",
                    "rename the stack, e.g. mindspeed-llm-2.3.0",
                )
            if not isinstance(entry, dict):
                raise ConfigError(
                    f"{where} is not a table",
                    "write it as [stacks.NAME] with python, torch, arch, ...",
                )
            unknown = set(entry) - _STACK_KEYS
            if unknown:
                raise ConfigError(
                    f"{where}: unknown keys {', '.join(sorted(unknown))}",
                    f"keys: {', '.join(sorted(_STACK_KEYS))}",
                )
            missing = {"python", "torch", "arch", "source", "read"} - set(entry)
            if missing:
                raise ConfigError(
                    f"{where} lacks {', '.join(sorted(missing))}",
                    "every stack names python, torch, arch, its source and the date it was read",
                )
            not_text = sorted(k for k, v in entry.items() if not isinstance(v, str))
            if not_text:
                raise ConfigError(
                    f"{where}: {', '.join(not_text)} must be quoted strings (python = 3.10 is the "
                    "number 3.1 in TOML)",
                    'write python = "3.10", torch = "2.7.1"',
                )
            for key in (
                "torch",
                "torch_npu",
            ):  # they become parts of paths (build/<target>, dist/<target>)
                if key in entry:
                    target.check_version(
                        entry[key],
                        f"{where}: {key}",
                        f'write {key} = "2.7.1" (torch_npu may end in .postN)',
                    )
        return stacks

    def stack(self, name: str) -> Stack:
        stacks = self._stack_entries()
        if name not in stacks:
            raise ConfigError(
                f"unknown stack '{name}' (matrix.toml [stacks]: {', '.join(stacks) or 'none'})",
                "pick one of those, or add a [stacks.NAME] table with its source and date",
            )
        entry = stacks[name]
        stack = Stack(
            name=name,
            python=entry["python"],
            torch=entry["torch"],
            arch=entry["arch"],
            torch_npu=entry.get("torch_npu") or None,
            cann=entry.get("cann") or None,
            description=entry.get("description", ""),
            source=entry["source"],
            read=entry["read"],
        )
        try:
            self.validate(self._combination(entry, ref=self.default_ref, stack=name))
        except ConfigError as exc:
            cause = exc.cause if exc.cause.startswith(f"{name}: ") else f"{name}: {exc.cause}"
            raise ConfigError(f"stack {cause}", exc.hint) from None
        return stack

    def torch_build(self, arch: str) -> dict | None:
        """What the default package index serves as torch for this arch (matrix.toml [index.torch_builds])."""
        return self.data.get("index", {}).get("torch_builds", {}).get(arch)

    @property
    def build_requires(self) -> list[str]:
        return list(self.data["build"]["requires"])

    @property
    def npu_requires(self) -> list[str]:
        return list(self.data["build"]["npu_requires"])

    # --- NVIDIA apex on CUDA ([cuda]) ---------------------------------------------------------------------------
    @property
    def cuda(self) -> dict:
        table = self.data.get("cuda")
        if not isinstance(table, dict):
            raise ConfigError(
                "matrix.toml has no [cuda] table: this apexkit cannot build NVIDIA apex on CUDA",
                "restore matrix.toml (git checkout matrix.toml)",
            )
        return table

    @property
    def cuda_default_ref(self) -> str:
        return str(self.cuda["default_ref"])

    @property
    def cuda_default_arch_list(self) -> str:
        return str(self.cuda["default_arch_list"])

    @property
    def cuda_requires(self) -> list[str]:
        return list(self.cuda["requires"])

    def cuda_default_torch(self, python: str) -> str:
        torch = self.cuda.get("default_torch", {}).get(python)
        if torch is None:
            known = ", ".join(sorted(self.cuda.get("default_torch", {})))
            raise ConfigError(
                f"matrix.toml [cuda.default_torch] names no torch for Python {python} (it has {known})",
                f"pass --torch VERSION (a CUDA build of torch for Python {python}), or build for one of those",
            )
        return str(torch)

    def torch_cuda(self, torch: str) -> str | None:
        """The CUDA release of the default index's build of `torch` ([cuda.torch_cuda]), None when unknown."""
        found = self.cuda.get("torch_cuda", {}).get(torch.split("+")[0])
        return str(found) if found is not None else None

    # --- the build matrix ---------------------------------------------------------------------------------------
    @property
    def runners(self) -> dict[str, str]:
        return dict(self.data.get("matrix", {}).get("runners", {}))

    def image_for(self, arch: str) -> str:
        return (
            self.data.get("matrix", {})
            .get("image", "apexkit/builder:debian-bookworm-{arch}")
            .format(arch=arch)
        )

    def combinations(self, entries: list[dict] | None = None) -> list[Combination]:
        """matrix.toml [[matrix.include]] then every [stacks] entry (or only `entries`) as Combinations, not yet
        validated. A stack's id is its name (session build-<name>)."""
        defaults = entries is None
        entries = self.data.get("matrix", {}).get("include", []) if defaults else entries
        combos = []
        if not isinstance(entries, list):
            raise ConfigError(
                "matrix.toml [matrix] include is not a list of tables",
                "write each as [[matrix.include]]",
            )
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ConfigError(
                    f"matrix entry {i + 1} is not a table", "write each as [[matrix.include]]"
                )
            unknown = set(entry) - {
                "python",
                "torch",
                "torch_npu",
                "cann",
                "arch",
                "ref",
                "backend",
                "cuda_arch",
            }
            if unknown or not {"python", "torch", "arch"} <= set(entry):
                raise ConfigError(
                    f"matrix entry {i + 1} {entry}: needs python, torch, arch"
                    + (f"; unknown keys {', '.join(sorted(unknown))}" if unknown else ""),
                    "keys: python, torch, arch, and optionally torch_npu, cann, ref, backend, cuda_arch",
                )
            for key in ("torch", "torch_npu"):  # part of the id: a session name and a log file name
                if key in entry:
                    target.check_version(
                        str(entry[key]),
                        f"matrix entry {i + 1}: {key}",
                        f'write {key} = "2.7.1" (torch_npu may end in .postN)',
                    )
            cuda = entry.get("backend") == "cuda"
            default = self.cuda_default_ref if cuda else self.default_ref
            combos.append(self._combination(entry, ref=str(entry.get("ref") or default)))
        if defaults:
            combos += [
                self._combination(entry, ref=self.default_ref, stack=name)
                for name, entry in self._stack_entries().items()
            ]
        ids = [c.id for c in combos]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:  # one id is one session, one --target, one log
            raise ConfigError(
                f"matrix.toml has two combinations named {twice[0]}",
                "make them differ (torch, ref, arch, or cuda_arch), or drop one",
            )
        return combos

    def _combination(self, entry: dict, ref: str, stack: str | None = None) -> Combination:
        cuda = entry.get("backend") == "cuda"
        return Combination(
            python=str(entry.get("python")),
            torch=str(entry.get("torch")),
            arch=str(entry.get("arch")),
            ref=ref,
            torch_npu=str(entry["torch_npu"]) if entry.get("torch_npu") else None,
            cann=str(entry["cann"]) if entry.get("cann") else None,
            default_ref=self.cuda_default_ref if cuda else self.default_ref,
            stack=stack,
            backend=str(entry.get("backend") or "ascend"),
            cuda_arch=str(entry.get("cuda_arch") or self.cuda_default_arch_list) if cuda else None,
            cuda_default_arch=self.cuda_default_arch_list if cuda else None,
        )

    def validate(self, combo: Combination) -> None:
        """Refuse a combination the tables rule out, naming the row."""
        self.check_python(combo.python)
        self.check_torch_python(combo.torch, combo.python)
        if combo.arch not in ("x86_64", "aarch64"):
            raise ConfigError(f"{combo.id}: unknown arch '{combo.arch}'", "use x86_64 or aarch64")
        if combo.backend not in ("ascend", "cuda"):
            raise ConfigError(
                f"{combo.id}: unknown backend '{combo.backend}'", "use ascend or cuda"
            )
        if combo.backend == "cuda":
            if combo.torch_npu or combo.cann:
                raise ConfigError(
                    f"{combo.id}: a CUDA combination has no torch_npu or CANN",
                    "drop torch_npu and cann",
                )
            if self.torch_cuda(combo.torch) is None:
                raise ConfigError(
                    f"{combo.id}: matrix.toml [cuda.torch_cuda] does not say which CUDA torch {combo.torch} is built with",
                    "add its row (torch.version.cuda of the index's build)",
                )
            cudaarch.parse_arch_list(combo.cuda_arch or "")
            return
        if self.ref(combo.ref) is None:
            raise ConfigError(
                f"{combo.id}: unknown Ascend apex ref '{combo.ref}' (matrix.toml [[refs]])",
                f"known: {', '.join(self.known_refs())}",
            )
        if combo.torch_npu is None and combo.cann is None:
            return
        base = combo.torch.split("+", 1)[0]
        rows = self.data["torch_npu"]["versions"]
        if base not in rows:
            raise ConfigError(
                f"{combo.id}: no torch_npu release pairs with torch {base} (matrix.toml "
                f"[torch_npu.versions] has rows {', '.join(rows)})",
                "pick a torch with a row",
            )
        row = rows[base]
        if combo.torch_npu is not None and torch_npu_torch(combo.torch_npu) != base:
            raise ConfigError(
                f"{combo.id}: torch_npu {combo.torch_npu} does not pair with torch {base} "
                f"(matrix.toml [torch_npu.versions] row {base}: torch_npu {row['torch_npu']})",
                f'use torch_npu = "{row["torch_npu"]}"',
            )
        if combo.cann is not None and combo.cann not in row["cann"]:
            raise ConfigError(
                f"{combo.id}: CANN {combo.cann} is not listed for torch {base} (matrix.toml "
                f"[torch_npu.versions] row {base}: CANN {', '.join(row['cann'])})",
                "pick one of those CANN versions, or another torch",
            )


@dataclass(frozen=True)
class Combination:
    python: str
    torch: str
    arch: str
    ref: str
    torch_npu: str | None = None
    cann: str | None = None
    default_ref: str = "master"
    stack: str | None = None  # a named stack of matrix.toml [stacks]
    backend: str = "ascend"  # or "cuda": upstream NVIDIA apex (matrix.toml [cuda])
    cuda_arch: str | None = None
    cuda_default_arch: str | None = (
        None  # [cuda] default_arch_list: a combination with it says only -cuda
    )

    @property
    def target(self) -> target.Target:
        """This combination as the one target codec sees it (apexkit.plan.target)."""
        identity = (
            {"backend": "cuda", "cuda_arch": self.cuda_arch} if self.backend == "cuda" else {}
        )
        return target.Target.of(
            self.python, self.torch, self.arch, self.ref, torch_npu=self.torch_npu,
            backend=self.backend, identity=identity,
        )  # fmt: skip

    @property
    def id(self) -> str:
        """The matrix's name of this combination: a stack's name, else py3.11-torch2.13.0-x86_64[-cuda…][-REF]."""
        return self.stack or self.target.cell_id(self.default_ref, self.cuda_default_arch)

    @property
    def target_id(self) -> str:
        """The dist/<target-id>/ its build writes, e.g. py3.11-torch2.13.0-x86_64-master+npu2.7.1; `--target` of
        every command takes this id, and the matrix's also takes the combination's own `id`."""
        return self.target.id

    def build_options(self) -> dict[str, str]:
        """The build options that make this combination, by their option names (apexkit.wheel.options)."""
        if self.stack:
            return {"stack": self.stack}
        given = {"torch": self.torch}
        if self.backend == "cuda":
            given.update(backend="cuda", cuda_arch=self.cuda_arch or "")
        if self.torch_npu:
            given["torch_npu"] = self.torch_npu
        if self.ref != self.default_ref:
            given["apex_ref"] = self.ref
        return given


_STACK_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*\Z")
_STACK_KEYS = {"python", "torch", "torch_npu", "cann", "arch", "description", "source", "read"}


@dataclass(frozen=True)
class Stack:
    """A training stack people run (matrix.toml [stacks]): what a build for it installs, and where that is from."""

    name: str
    python: str
    torch: str
    arch: str
    torch_npu: str | None
    cann: str | None
    description: str
    source: str
    read: str


def torch_npu_torch(torch_npu: str) -> str:
    """The torch release a torch_npu version belongs to: 2.1.0.post17 -> 2.1.0, 2.7.1rc1 -> 2.7.1."""
    m = re.match(r"^(\d+\.\d+\.\d+)", torch_npu)
    if not m:
        raise ConfigError(
            f"'{torch_npu}' is not a torch_npu version", "pass --torch-npu like 2.1.0.post10"
        )
    return m.group(1)


def torch_series(version: str) -> str:
    parts = version.split("+", 1)[0].split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ConfigError(f"'{version}' is not a torch version", "pass --torch like 2.1.0")
    return f"{parts[0]}.{parts[1]}"


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(
            f"matrix file {path} is missing",
            "reinstall apexkit (pip install --force-reinstall apexkit)"
            if paths.INSTALLED
            else "restore it: git checkout -- matrix.toml",
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"matrix file {path} is not valid TOML: {exc}", "fix the file") from None


def load(path: Path | str = MATRIX_PATH) -> Matrix:
    data = _load(str(path))
    pythons = data.get("pythons")
    if not isinstance(pythons, dict) or not all(
        isinstance(pythons.get(k), list if k != "default" else str)
        for k in ("sessions", "supported", "default")
    ):
        raise ConfigError(
            f"matrix file {path} has no valid [pythons] table (sessions, supported: lists; default: a string)",
            "restore it (git checkout matrix.toml) or add the table",
        )
    return Matrix(data)
