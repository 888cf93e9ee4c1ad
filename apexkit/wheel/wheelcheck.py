"""The check_binary of apex: what a built wheel says it is (version label, Requires-Dist pins) and what its compiled
modules are (ELF machine, NEEDED, RPATH, undefined symbols, C++ string ABI, hardening, glibc symbol versions).

Read with pyelftools (a kept ELF library: the program headers, dynamic section, .dynsym and .gnu.version_r are all it
needs; parsing readelf's text would tie us to one binutils' output format). The one exception is demangling: the
__cxx11 check hands the mangled names to `c++filt` (binutils, present wherever g++ is), which is what PyTorch's own
check_binary does too. Every failure is one line naming the file and the check.

Pure in, data out: `Expect` says what the build asked for (from the plan, the patched setup.py and the build venv's
torch), `check_wheel` returns a report (per module: the facts, the failures). builder.py turns failures into a
BuildError; the manifest keeps the report.
"""

from __future__ import annotations

import ast
import base64
import csv
import email.message
import email.parser
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from apexkit.errors import EnvironmentSetupError

if TYPE_CHECKING:
    from apexkit.wheel import cudabin

try:
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection
    from elftools.elf.hash import ELFHashSection, GNUHashSection
    from elftools.elf.sections import SymbolTableSection

    HAVE_ELFTOOLS = True
except ImportError:  # a tool venv made before requirements/runtime.txt had it (an old builder image): one line, below
    HAVE_ELFTOOLS = False

# e_machine per target arch (the `machine` of interpreters.Interpreter)
MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}

# The system libraries a torch extension may link: glibc's and the GCC runtime's. Anything else must come from torch
# (its lib/ folder), torch_npu (its lib/), or be declared by the ref's setup.py (libraries=...).
SYSTEM_LIBS = frozenset(
    {
        "libc.so.6",
        "libm.so.6",
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libpthread.so.0",
        "libdl.so.2",
        "librt.so.1",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
    }
)

# What Ascend's npu.patch asks for in secure_compile_args / secure_link_args (read from Ascend apex master and 5.0.0
# patch/npu.patch on 2026-11-30): flag -> the hardening property the .so must then show.
HARDENING_FLAGS = {
    "-Wl,-z,relro": "relro",
    "-Wl,-z,now": "bind_now",
    "-Wl,-z,noexecstack": "nx_stack",
    "-s": "stripped",
    "-fstack-protector-all": "stack_protector",
    "-fstack-protector-strong": "stack_protector",
    "-fstack-protector": "stack_protector",
}
HARDENING_WHY = {
    "relro": "no PT_GNU_RELRO segment",
    "bind_now": "no BIND_NOW in DT_FLAGS/DT_FLAGS_1 (lazy binding)",
    "nx_stack": "PT_GNU_STACK is missing or executable",
    "stripped": "not stripped (.symtab present)",
    "stack_protector": "no __stack_chk_fail/__stack_chk_guard reference",
}

DF_BIND_NOW = 0x8
DF_1_NOW = 0x1
PF_X = 0x1

_OLD_STRING = re.compile(
    r"std::(?:string|wstring|basic_string<|list<)"
)  # the pre-C++11 ABI, as c++filt prints it


@dataclass(frozen=True)
class Expect:
    """What the build asked for, decided before looking at the binaries."""

    arch: str
    torch_lib: str | None = (
        None  # the build venv's torch/lib: the allowed libraries and where they are found
    )
    extra_lib_dirs: tuple[str, ...] = ()  # torch_npu/lib, CANN lib64 when present
    declared_libs: tuple[
        str, ...
    ] = ()  # library names the setup.py declares (libraries.append('X') -> libX.so)
    rpath: tuple[str, ...] | None = (
        None  # exact RPATH/RUNPATH entries; () = none; None = not checked
    )
    site_dir: str | None = (
        None  # what $ORIGIN means once installed (site-packages of the build venv)
    )
    cxx11_abi: int | None = None  # torch._C._GLIBCXX_USE_CXX11_ABI; None = not checked
    hardening: tuple[str, ...] = ()  # properties from HARDENING_FLAGS the setup.py asks for
    interpreter_files: tuple[
        str, ...
    ] = ()  # the Python executable (+ libpython): Py* symbols come from there
    system_dirs: tuple[str, ...] = ()  # () = the usual ones for `arch`
    # a CUDA build: the SASS/PTX architectures every CUDA module must embed, exactly (apexkit.wheel.cudabin); None:
    # not a CUDA build, nothing checked
    cuda: cudabin.Embedded | None = None
    # count symbols the NEEDED libraries' own NEEDED define (a note, not a failure): NVIDIA apex's fused_dense calls
    # cuBLAS without linking it; the loader finds cublasGemmEx in libtorch_cuda.so's libcublas.so.13
    through_needed: bool = False


# the libraries that make a module a CUDA extension (linked by torch's CUDAExtension): it must carry GPU code
CUDA_LIBS = ("libcudart.so", "libc10_cuda.so", "libtorch_cuda.so")


@dataclass
class ModuleReport:
    file: str
    machine: str = ""
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    glibc: str | None = None
    glibcxx: str | None = None
    undefined: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cuda: str | None = None  # the architectures a CUDA module embeds, in words (a CUDA build only)


def system_dirs(arch: str) -> tuple[str, ...]:
    triplet = f"{arch}-linux-gnu"
    return (f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


def hardening_asked(setup_py: str) -> tuple[str, ...]:
    """The hardening properties setup.py's secure_compile_args/secure_link_args ask for (none when it has none):
    the string constants of those lists and of their .append(...) calls, read with ast (never executed)."""
    try:
        tree = ast.parse(setup_py)
    except SyntaxError:
        return ()
    names = {"secure_compile_args", "secure_link_args"}
    flags = [
        e.value
        for node in ast.walk(tree)
        for e in _added_to(node, names)
        if isinstance(e, ast.Constant) and isinstance(e.value, str)
    ]
    return tuple(sorted({HARDENING_FLAGS[f] for f in flags if f in HARDENING_FLAGS}))


def _added_to(node: ast.AST, names: set[str]) -> list[ast.expr]:
    """What `node` puts in one of the lists `names`: a list assigned to it, or its .append/.extend arguments."""
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id in names for t in node.targets
    ):
        return node.value.elts if isinstance(node.value, ast.List) else []
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("append", "extend")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in names
    ):
        return []
    return [e for a in node.args for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]


def declared_libs(setup_py: str) -> tuple[str, ...]:
    """Library names setup.py links on purpose: libraries.append('X') and libraries=[...] constants."""
    found = set(re.findall(r"libraries\.append\(\s*['\"]([\w.+-]+)['\"]\s*\)", setup_py))
    for group in re.findall(r"libraries\s*=\s*\[([^\]]*)\]", setup_py):
        found |= set(re.findall(r"['\"]([\w.+-]+)['\"]", group))
    return tuple(sorted(found))


def _dynamic(elf: ELFFile) -> DynamicSection | None:
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            return section
    return None


def defined_in(path: str, names: set[str]) -> set[str]:
    """Which of `names` the library at `path` defines: looked up in its .gnu.hash/.hash table (libtorch_cpu has
    ~75k dynamic symbols; reading them all takes seconds, a lookup per name does not), its .dynsym otherwise."""
    with open(os.path.realpath(path), "rb") as fh:
        elf = ELFFile(fh)
        table = next(
            (s for s in elf.iter_sections() if isinstance(s, (GNUHashSection, ELFHashSection))),
            None,
        )
        if table is None:
            dynsym = cast("SymbolTableSection | None", elf.get_section_by_name(".dynsym"))
            symbols = [
                s for s in (dynsym.iter_symbols() if dynsym is not None else ()) if s.name in names
            ]
        else:
            symbols = [s for s in map(table.get_symbol, names) if s is not None]
        return {s.name for s in symbols if s["st_shndx"] != "SHN_UNDEF"}


def _find_lib(name: str, dirs: list[str]) -> str | None:
    """The first `dirs` entry's file `name`, as the loader searches."""
    return next((c for c in (os.path.join(d, name) for d in dirs) if os.path.isfile(c)), None)


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def demangle(names: list[str]) -> list[str]:
    """c++filt over the names (one process); the names themselves when c++filt is missing."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return list(names)
    proc = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = proc.stdout.splitlines()
    return out if proc.returncode == 0 and len(out) == len(names) else list(names)


def check_module(path: Path, expect: Expect, shown: str | None = None) -> ModuleReport:
    """Every check on one compiled module; failures are one line each, prefixed with the module's name."""
    shown = shown or path.name
    report = ModuleReport(shown)

    def fail(check: str, why: str) -> None:
        report.failures.append(f"{shown}: {check}: {why}")

    try:
        with open(path, "rb") as fh:
            _check_open(fh, report, expect, fail)
    except OSError as exc:
        fail("elf", f"cannot be read ({exc.strerror})")
    if expect.cuda is not None:
        _check_cuda(path, report, expect.cuda, fail)
    return report


def _check_cuda(path: Path, report: ModuleReport, asked: cudabin.Embedded, fail) -> None:
    """The GPU code of a CUDA build's module: a module linking the CUDA runtime (or embedding GPU code) embeds
    exactly the architectures asked; a C++-only module (apex_C) embeds none."""
    from apexkit.wheel import cudabin  # pyelftools, which the caller checked

    try:
        found = cudabin.embedded(path)
    except cudabin.FatbinError as exc:
        fail("gpu code", str(exc))
        return
    is_cuda = any(n.startswith(CUDA_LIBS) for n in report.needed)
    if found is None and not is_cuda:
        return
    report.cuda = found.describe() if found is not None else "no GPU code"
    for problem in cudabin.problems(found, asked, "embedded"):
        fail("gpu code", problem.split(": ", 1)[1])


def _check_open(fh, report: ModuleReport, expect: Expect, fail) -> None:
    try:
        elf = ELFFile(fh)
    except ELFError as exc:
        fail("elf", f"not an ELF file ({exc})")
        return
    report.machine = elf["e_machine"]
    wanted = MACHINES.get(expect.arch)
    if wanted and report.machine != wanted:
        fail("machine", f"ELF machine {report.machine}, the target is {expect.arch} ({wanted})")
        return  # the rest would read another architecture's conventions
    tags = _read_tags(elf, report)
    _check_needed(report, expect, fail)
    if expect.rpath is not None and tuple(report.rpath) != tuple(expect.rpath):
        fail(
            "rpath",
            f"RPATH {':'.join(report.rpath) or '(none)'}, expected "
            f"{':'.join(expect.rpath) or '(none)'}",
        )
    dynsym = cast(
        "SymbolTableSection | None", elf.get_section_by_name(".dynsym")
    )  # SHT_DYNSYM: a symbol table
    symbols = [s for s in (dynsym.iter_symbols() if dynsym is not None else ()) if s.name]
    missing = [s for s in symbols if s["st_shndx"] == "SHN_UNDEF"]
    undefined = [s.name for s in missing if s["st_info"]["bind"] != "STB_WEAK"]
    weak = {s.name for s in missing if s["st_info"]["bind"] == "STB_WEAK"}
    report.undefined = len(undefined)
    # the ABI first: a mismatch also leaves std::string symbols unresolved, and the ABI is the cause to name
    _check_abi(
        expect, [s.name for s in sorted(symbols, key=lambda s: s["st_shndx"] == "SHN_UNDEF")], fail
    )  # ours first
    _check_symbols(report, expect, undefined, fail)
    _check_hardening(elf, tags, undefined + sorted(weak), expect, fail)
    _symbol_versions(elf, report)


def _read_tags(elf: ELFFile, report: ModuleReport) -> list[Any]:
    """The dynamic section's tags, with the module's NEEDED and RPATH/RUNPATH noted in `report`."""
    dyn = _dynamic(elf)
    tags: list[Any] = (
        list(dyn.iter_tags()) if dyn is not None else []
    )  # .needed/.rpath/.runpath: by setattr
    report.needed = [t.needed for t in tags if t.entry.d_tag == "DT_NEEDED"]
    for t in tags:
        if t.entry.d_tag == "DT_RPATH":
            report.rpath += t.rpath.split(":")
        elif t.entry.d_tag == "DT_RUNPATH":
            report.rpath += t.runpath.split(":")
    return tags


def _check_needed(report: ModuleReport, expect: Expect, fail) -> None:
    allowed = set(SYSTEM_LIBS) | {f"lib{n}.so" for n in expect.declared_libs}
    for folder in ([expect.torch_lib] if expect.torch_lib else []) + list(expect.extra_lib_dirs):
        if os.path.isdir(folder):
            allowed |= set(os.listdir(folder))
    extra = [n for n in report.needed if n not in allowed]
    if extra:
        fail(
            "needed",
            f"links {', '.join(extra)}, outside torch's libraries, the system's (libc, libm, "
            "libstdc++, libgcc_s) and what setup.py declares",
        )


def _search_dirs(report: ModuleReport, expect: Expect) -> list[str]:
    dirs = []
    for entry in report.rpath:
        if "$ORIGIN" in entry or "${ORIGIN}" in entry:
            if not expect.site_dir:
                continue
            entry = entry.replace("${ORIGIN}", expect.site_dir).replace("$ORIGIN", expect.site_dir)
        dirs.append(entry)
    dirs += ([expect.torch_lib] if expect.torch_lib else []) + list(expect.extra_lib_dirs)
    return dirs + list(expect.system_dirs or system_dirs(expect.arch))


def _check_symbols(report: ModuleReport, expect: Expect, undefined: list[str], fail) -> None:
    """Every strong undefined symbol defined by a library the module itself NEEDs, or by the interpreter (the Python
    C API): what `ld -z defs` would demand. Not counting what a library loaded earlier happens to provide is the
    point: master's bare --rpath lost NEEDED libstdc++, and its std:: symbols then resolve only because torch
    loaded libstdc++ first."""
    if not undefined:
        return
    dirs = _search_dirs(report, expect)
    left = set(undefined)
    missing = []
    libs = []
    for name in report.needed:
        lib = _find_lib(name, dirs)
        (missing.append(name) if lib is None else libs.append(lib))
    for path in [*libs, *(p for p in expect.interpreter_files if os.path.isfile(p))]:
        if left:
            left -= defined_in(path, left)
    if left and expect.through_needed:
        before = set(left)
        found_in = []
        for path in _needed_closure(libs, dirs):
            hit = defined_in(path, left)
            if hit:
                found_in.append(os.path.basename(path))
                left -= hit
        if before - left:
            report.notes.append(
                f"{len(before - left)} symbol(s) defined by what its NEEDED libraries need ({', '.join(found_in)}), "
                "not by a library it NEEDs itself: they resolve because torch's libraries load them"
            )
    unresolved = sorted(left)
    if missing:
        report.notes.append(
            f"not found to check statically: {', '.join(missing)} (the import in the clean venv "
            "checks them)"
        )
        return
    if unresolved:
        shown = demangle(unresolved[:3])
        fail(
            "symbols",
            f"{len(unresolved)} undefined symbol(s) no NEEDED library or the interpreter defines, e.g. "
            + "; ".join(shown),
        )


MAX_CLOSURE = 64  # libraries read for the NEEDED closure (torch 2.14.1's CUDA build: ~30)


def _needed_closure(libs: list[str], dirs: list[str], depth: int = 3) -> list[str]:
    """The libraries `libs` NEED, and theirs, `depth` levels down (breadth first, as the loader searches a
    dlopen()ed object's dependencies), found in `dirs`; `libs` themselves not included."""
    seen, out, level = set(libs), [], list(libs)
    for _ in range(depth):
        below = []
        for path in level:
            for name in _needed_of(path):
                lib = _find_lib(name, dirs)
                if lib is not None and lib not in seen and len(seen) < MAX_CLOSURE:
                    seen.add(lib)
                    out.append(lib)
                    below.append(lib)
        level = below
    return out


def _needed_of(path: str) -> list[str]:
    try:
        with open(path, "rb") as fh:
            dynamic = _dynamic(ELFFile(fh))
            if dynamic is None:
                return []
            return [
                str(getattr(tag, "needed", ""))
                for tag in dynamic.iter_tags()
                if tag.entry.d_tag == "DT_NEEDED"
            ][:256]
    except (OSError, ELFError):
        return []


def _check_abi(expect: Expect, names: list[str], fail) -> None:
    if expect.cxx11_abi is None:
        return
    candidates = [n for n in names if n.startswith("_Z")]
    if expect.cxx11_abi:
        old = [d for d in demangle(candidates) if _OLD_STRING.search(d)]
        if old:
            fail(
                "cxx11-abi",
                f"{len(old)} symbol(s) use the pre-C++11 std::string ABI while torch is built with "
                f"_GLIBCXX_USE_CXX11_ABI=1, e.g. {old[0][:160]}",
            )
    else:
        new = [n for n in candidates if "__cxx11" in n]
        if new:
            fail(
                "cxx11-abi",
                f"{len(new)} symbol(s) use the C++11 std::__cxx11 ABI while torch is built with "
                f"_GLIBCXX_USE_CXX11_ABI=0, e.g. {demangle(new[:1])[0][:160]}",
            )


def _check_hardening(elf: ELFFile, tags, symbols: list[str], expect: Expect, fail) -> None:
    if not expect.hardening:
        return
    segments = [s for s in elf.iter_segments()]
    flags = {
        t.entry.d_tag: t.entry.d_val
        for t in tags
        if t.entry.d_tag in ("DT_FLAGS", "DT_FLAGS_1", "DT_BIND_NOW")
    }
    stack = [s for s in segments if s["p_type"] == "PT_GNU_STACK"]
    # each property of HARDENING_WHY: whether the module shows it
    have = {
        "relro": any(s["p_type"] == "PT_GNU_RELRO" for s in segments),
        "bind_now": bool(
            "DT_BIND_NOW" in flags
            or flags.get("DT_FLAGS", 0) & DF_BIND_NOW
            or flags.get("DT_FLAGS_1", 0) & DF_1_NOW
        ),
        "nx_stack": bool(stack) and not stack[0]["p_flags"] & PF_X,
        "stripped": elf.get_section_by_name(".symtab") is None,
        "stack_protector": bool({"__stack_chk_fail", "__stack_chk_guard"} & set(symbols)),
    }
    for prop in expect.hardening:
        if not have[prop]:
            fail(f"hardening {prop}", f"{HARDENING_WHY[prop]}, though setup.py asks for it")


def _symbol_versions(elf: ELFFile, report: ModuleReport) -> None:
    """The highest GLIBC_ and GLIBCXX_ versions the module needs (.gnu.version_r): what decides its manylinux tag."""
    best: dict[str, str] = {}
    for section in elf.iter_sections():
        if not isinstance(section, GNUVerNeedSection):
            continue
        for _verneed, auxes in section.iter_versions():
            for aux in auxes:
                name = aux.name
                for prefix in ("GLIBC_", "GLIBCXX_"):
                    if name.startswith(prefix) and re.fullmatch(r"[\d.]+", name[len(prefix) :]):
                        key = prefix.rstrip("_")
                        if key not in best or _version_key(name) > _version_key(best[key]):
                            best[key] = name
    report.glibc = best.get("GLIBC")
    report.glibcxx = best.get("GLIBCXX")


def platform_tag(wheel: Path, arch: str, ld_paths: tuple[str, ...] = ()) -> dict:
    """The manylinux tag the modules' own symbol versions allow, computed by auditwheel (`show --json`).

    auditwheel's search path gets only the system's library folders: torch's and torch_npu's libraries (libc10,
    libtorch*, libtorch_npu) and CANN's are then external libraries it does not descend into, which is what
    `repair --exclude libc10.so --exclude 'libtorch*' ...` would do, without rewriting the wheel. `tag` is auditwheel's
    sym_tag (from GLIBC_/GLIBCXX_/CXXABI_ versions alone: the NEEDED check above already vouches for the libraries);
    `overall_tag` stays linux_* because libc10 and friends are not in any manylinux policy's whitelist.
    `retag` then gives the wheel file `tag` (docs/wheels.md)."""
    from importlib import metadata

    try:
        version = metadata.version("auditwheel")
    except metadata.PackageNotFoundError:
        return {
            "computed": False,
            "why": "auditwheel is not installed (auditwheel >= 6.5 with `show --json` needs "
            "Python >= 3.10: pip install -r requirements/runtime.txt there)",
        }
    argv = [
        sys.executable,
        "-m",
        "auditwheel",
        "show",
        "--json",
        "--ldpaths",
        ":".join(ld_paths or system_dirs(arch)),
        str(wheel),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"computed": False, "why": f"auditwheel show failed: {tail[:200]}"}
    return {
        "computed": True,
        "tag": data.get("sym_tag"),
        "overall_tag": data.get("overall_tag"),
        "external_libs": sorted(data.get("external_libs") or {}),
        "tool": f"auditwheel {version}",
    }


METADATA_MAX = (
    1 << 20
)  # bytes: a wheel's METADATA is a few KiB; more is read no further (a zip bomb never whole)


def read_metadata(zf: zipfile.ZipFile) -> email.message.Message:
    """The headers of the wheel's *.dist-info/METADATA, from its first METADATA_MAX bytes (none when it has none)."""
    name = dist_info(zf.namelist(), "METADATA")
    with zf.open(name) if name else io.BytesIO() as fh:
        text = fh.read(METADATA_MAX).decode("utf-8", "replace")
    return email.parser.Parser().parsestr(text, headersonly=True)


def compiled_modules(names: list[str]) -> list[str]:
    """The wheel's compiled modules (*.so, *.so.N), sorted."""
    return sorted(n for n in names if n.endswith(".so") or ".so." in n.rsplit("/", 1)[-1])


def check_wheel(
    wheel: Path, expect: Expect, version: str | None = None, requires: list[str] | None = None
) -> dict:
    """The report of one wheel: identity (version, Requires-Dist) and every compiled module."""
    if not HAVE_ELFTOOLS:
        raise EnvironmentSetupError(
            "the binary checks need pyelftools, which this Python lacks",
            "pip install -r requirements/runtime.txt (a builder image: rebuild it with invoke image.build)",
        )
    failures: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        meta = read_metadata(zf)
    found_version, found_requires = meta["Version"], meta.get_all("Requires-Dist") or []
    if version is not None and found_version != version:
        failures.append(
            f"{wheel.name}: identity: METADATA Version {found_version}, expected {version}"
        )
    if requires is not None and sorted(found_requires) != sorted(requires):
        failures.append(
            f"{wheel.name}: identity: Requires-Dist {', '.join(found_requires) or '(none)'}, expected "
            f"{', '.join(requires) or '(none)'}"
        )
    modules = _check_modules(wheel, expect)
    failures += [f for m in modules for f in m.failures]
    glibc = max((m.glibc for m in modules if m.glibc), key=_version_key, default=None)
    glibcxx = max((m.glibcxx for m in modules if m.glibcxx), key=_version_key, default=None)
    return {
        "version": found_version,
        "requires_dist": found_requires,
        "modules": [m.__dict__ for m in modules],
        "max_glibc": glibc,
        "max_glibcxx": glibcxx,
        "expect": {
            k: (list(v) if isinstance(v, tuple) else v.describe() if k == "cuda" and v else v)
            for k, v in expect.__dict__.items()
        },
        "failures": failures,
    }


def _check_modules(wheel: Path, expect: Expect) -> list[ModuleReport]:
    """Every compiled module of the wheel (*.so, *.so.N), checked from a temporary copy."""
    modules: list[ModuleReport] = []
    with tempfile.TemporaryDirectory(prefix="apexkit-wheelcheck-") as tmp, zipfile.ZipFile(
        wheel
    ) as zf:
        for name in compiled_modules(zf.namelist()):
            target = Path(tmp) / f"{len(modules)}-{os.path.basename(name)}"
            target.write_bytes(zf.read(name))
            modules.append(check_module(target, expect, shown=name))
    return modules


# --- the file's platform tag ------------------------------------------------------------------------------------------

_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(x86_64|aarch64)")


def file_tags(name: str) -> tuple[str, str, str]:
    """(python, abi, platform) tags of a wheel file name (compressed tag sets kept as they are)."""
    parts = name[: -len(".whl")].split("-")
    return parts[-3], parts[-2], parts[-1]


def retag(
    wheel: Path, platform: dict, arch: str, python: Path, epoch: int, env: dict | None = None
) -> Path:
    """Give the wheel file the manylinux tag auditwheel computed (platform["tag"]), in its name and in its WHEEL's
    Tag lines and RECORD; returns the new path (the old file is gone) or `wheel` itself when the tag stays. Records
    in `platform` what the file carries (`wheel_tag`) and, when it stays linux_<arch>, why (`kept_because`).

    The tool is wheel's own `wheel tags --platform-tag <tag> --remove`, run by the build venv's Python (the `wheel`
    that setup.py's bdist_wheel used): it copies every member with its ZipInfo (timestamps, order, modes), rewrites
    WHEEL and RECORD, and dates the new RECORD from SOURCE_DATE_EPOCH, so the same wheel gives the same bytes
    (--verify-reproducible). The result is read back: its name, its Tag lines and every RECORD row must agree
    (wheel_problems), else RetagError (one line; the build turns it into a BuildError)."""
    current = file_tags(wheel.name)[2]
    platform["wheel_tag"] = current
    tag = platform.get("tag") if platform.get("computed") else None
    if not tag:
        platform["kept_because"] = f"no manylinux tag computed ({platform.get('why', 'unknown')})"
        return wheel
    match = _MANYLINUX.fullmatch(str(tag))
    if not match:  # auditwheel says linux_<arch>: the symbols fit no manylinux policy
        platform["kept_because"] = f"auditwheel's symbol tag is {tag}, no manylinux policy"
        return wheel
    if match.group(3) != arch:
        raise RetagError(f"{wheel.name}: auditwheel computed {tag} for a {arch} wheel")
    if current == tag:
        return wheel
    argv = [str(python), "-m", "wheel", "tags", "--remove", "--platform-tag", tag, wheel.name]
    proc = subprocess.run(
        argv,
        cwd=wheel.parent,
        capture_output=True,
        text=True,
        env={**(os.environ if env is None else env), "SOURCE_DATE_EPOCH": str(epoch)},
    )
    new = wheel.parent / (wheel.name[: -len(current) - len(".whl")] + tag + ".whl")
    if proc.returncode != 0 or not new.is_file():
        why = (
            proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"]
        )[-1][:200]
        if (
            "invalid choice" in why or "No module named wheel" in why
        ):  # a `wheel` older than 0.40 (no `tags`)
            platform["kept_because"] = f"the build venv's `wheel` cannot retag ({why})"
            return wheel
        raise RetagError(f"wheel tags --platform-tag {tag} failed on {wheel.name}: {why}")
    problems = wheel_problems(new)
    if problems:
        raise RetagError(f"{new.name} after retagging: {problems[0]}")
    platform["wheel_tag"] = tag
    platform["retagged_from"] = current
    return new


class RetagError(Exception):
    """The retagged wheel is not what it should be (one line)."""


def wheel_problems(wheel: Path) -> list[str]:
    """What makes `wheel` disagree with itself: its file name's tags vs its WHEEL's Tag lines, and any member whose
    sha256/size differs from its RECORD row (RECORD itself aside; or is missing from RECORD). [] for a consistent
    wheel."""
    py, abi, plat = file_tags(wheel.name)
    expected = {
        f"{a}-{b}-{c}" for a in py.split(".") for b in abi.split(".") for c in plat.split(".")
    }
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            info, record = (dist_info(names, leaf) for leaf in ("WHEEL", "RECORD"))
            if info is None or record is None:
                return ["no .dist-info/WHEEL or RECORD"]
            tags = {
                line.split(":", 1)[1].strip()
                for line in zf.read(info).decode("utf-8").splitlines()
                if line.startswith("Tag:")
            }
            problems = []
            if tags != expected:
                problems.append(
                    f"WHEEL says Tag {', '.join(sorted(tags)) or '(none)'}, the file name "
                    f"{', '.join(sorted(expected))}"
                )
            rows = {
                row[0]: (row[1], row[2])
                for row in csv.reader(zf.read(record).decode("utf-8").splitlines())
                if len(row) == 3
            }
            for name in (n for n in names if not n.endswith("/") and n != record):
                data = zf.read(name)
                digest = (
                    base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                )
                if rows.get(name) != (f"sha256={digest}", str(len(data))):
                    why = "not in RECORD" if name not in rows else "differs from its RECORD row"
                    problems.append(f"{name}: {why}")
            return problems
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError, ValueError) as exc:
        return [f"not a readable wheel ({exc})"]


def dist_info(names: list[str], leaf: str) -> str | None:
    """The wheel's top-level X.dist-info/`leaf`, if it has one."""
    return next((n for n in names if n.count("/") == 1 and n.endswith(f".dist-info/{leaf}")), None)
