"""The plan of one wheel build, decided before anything is touched (pure): which torch, torch_npu, ref and flags,
the target id and the non-default inputs it names, and the cache key (the content address of the wheel)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from apexkit import cann, log, pipconfig
from apexkit.errors import ConfigError
from apexkit.plan import matrix, target
from apexkit.wheel import interpreters, nvidiaext, patches, sources
from apexkit.wheel.options import BuildOptions

# Bump when the way a wheel is produced changes, so old cache entries are not reused.
# 2: reproducible (SOURCE_DATE_EPOCH, path prefix maps); 3: version label + Requires-Dist; 4: retagged to manylinux
RECIPE_VERSION = "4"


@dataclass(frozen=True)
class Plan:
    """What will be built, decided before anything is touched."""

    python: str
    interpreter: str
    interpreter_version: str
    arch: str
    torch: str  # requested version, or the system torch's version
    torch_npu: str | None
    torch_build: str  # which torch build pip will install (CPU/CUDA, from where), in words
    apex_ref: str
    flags: tuple[str, ...]
    extensions: tuple[str, ...]
    needs_npu_headers: bool
    ref_known: bool
    target_id: str
    stack: str | None = None
    cann: str | None = (
        None  # the stack's CANN (runtime on the NPU nodes; the build itself needs none)
    )
    identity: dict = field(
        default_factory=dict
    )  # the non-default inputs (see `identity`); {} for a default build
    backend: str = "ascend"  # or "cuda": upstream NVIDIA apex (apex_ref is then an NVIDIA apex ref)
    cuda_arch: str = ""  # TORCH_CUDA_ARCH_LIST of a CUDA build
    torch_cuda: str | None = (
        None  # the CUDA release of the torch build ([cuda.torch_cuda]), until it is installed
    )

    @property
    def target(self) -> target.Target:
        """This build as the one target codec sees it (its label, version and pins: apexkit.plan.target)."""
        return target.Target.of(
            self.python,
            self.torch,
            self.arch,
            self.apex_ref,
            torch_npu=self.torch_npu,
            backend=self.backend,
            cuda=self.torch_cuda,
            identity=self.identity,
        )


def identity(opts: BuildOptions, torch_npu: str | None, ref_flags: tuple[str, ...] | None) -> dict:
    """The inputs beyond python/torch/arch/ref that change what a wheel is, when they differ from the default: the
    target id names them and the manifest records them (`check_overwrite` compares them)."""
    cuda = opts.backend == "cuda"
    flags = opts.setup_flags
    # (key, whether this build sets it, its value), in the order the target id names them
    inputs = (
        ("backend", cuda, "cuda"),
        ("cuda_arch", cuda, opts.cuda_arch),
        ("cuda_ext", cuda and tuple(opts.cuda_ext) not in ((), ("core",)), list(opts.cuda_ext)),
        ("torch_npu", bool(torch_npu), torch_npu),
        ("skip_patches", bool(opts.skip_patches), sorted(set(opts.skip_patches))),
        ("sanitize", bool(opts.sanitize), list(opts.sanitize)),
        ("nvidia_commit", bool(opts.nvidia_commit), opts.nvidia_commit),
        (
            "setup_flags",
            flags is not None and tuple(flags) != tuple(ref_flags or ()),
            list(flags or ()),
        ),
        ("apex_src", opts.apex_src is not None, str(opts.apex_src)),
        ("system_torch", opts.use_system_torch, True),
    )
    return {key: value for key, given, value in inputs if given}


def expected_targets(
    opts: BuildOptions, m: matrix.Matrix, arch: str, system_torch: str | None = None
) -> dict[str, dict]:
    """What a build of `opts` on `arch` in another process (a builder container, a Slurm job) may leave as
    dist/<target>/, from this host's own plan (make_plan on an interpreter of `arch`), never from what the other
    side says: {target id: the plan's python, torch, torch_npu, arch, target_id and identity}. Two ids when the
    other side may find a CANN toolkit and pair torch_npu itself (no --npu, and matrix.toml pairs one with this
    torch): the plan with --npu, and the same without its torch_npu. `system_torch`: the version a
    --use-system-torch build reports (the host has no way to know the other side's torch). ConfigError: no plan."""
    if opts.use_system_torch and system_torch is None:
        return {}
    interp = interpreters.Interpreter("", opts.python, opts.python, "", arch, "", "", "")
    plan = make_plan(opts, m, interp, system_torch, {})  # its errors are the build's
    if not (opts.npu or opts.use_system_torch):
        with contextlib.suppress(
            ConfigError
        ):  # no torch_npu for this torch: the other side pairs none
            plan = make_plan(dataclasses.replace(opts, npu=True), m, interp, system_torch, {})
    found = {}
    for torch_npu in dict.fromkeys([plan.torch_npu] if opts.npu else [None, plan.torch_npu]):
        inputs = {k: v for k, v in plan.identity.items() if torch_npu or k != "torch_npu"}
        tid = dataclasses.replace(plan, torch_npu=torch_npu, identity=inputs).target.id
        found[tid] = {
            "python": plan.python,
            "torch": plan.torch,
            "torch_npu": torch_npu,
            "arch": arch,
            "target_id": tid,
            "identity": inputs,
        }
    return found


def make_plan(
    opts: BuildOptions,
    m: matrix.Matrix,
    interp: interpreters.Interpreter,
    system_torch: str | None,
    env,
    detected_flags: tuple[str, ...] | None = None,
) -> Plan:
    """Pure decisions: torch, torch_npu, ref flags, target id. Refuses invalid combinations before any work.
    `detected_flags`: the flags read off an --apex-src checkout's npu.patch when its ref is not in matrix.toml."""
    if opts.backend == "cuda":
        return _cuda_plan(opts, m, interp, env)
    ref = opts.apex_ref or ("local" if opts.apex_src else m.default_ref)
    if opts.use_system_torch:
        torch = system_torch or ""
    else:
        torch = opts.torch or m.default_torch(opts.python)
        m.check_torch_python(torch, opts.python)
    torch_npu = None
    if not opts.use_system_torch:
        if opts.npu:
            torch_npu = opts.torch_npu or m.torch_npu_for(torch)
            m.check_torch_npu(torch, torch_npu)
        elif (
            cann.home(env) is not None
        ):  # a toolkit is installed: pair torch_npu when the table knows one
            try:
                torch_npu = m.torch_npu_for(torch)
            except ConfigError as exc:
                log.warn(f"CANN toolkit found but torch_npu is not installed: {exc.cause}")
    spec = m.ref(ref)
    if opts.setup_flags is not None:
        flags, extensions, needs_headers, known = (
            opts.setup_flags,
            _extensions_for(opts.setup_flags),
            "--npu_float_status" in opts.setup_flags,
            spec is not None,
        )
    elif spec is not None:
        flags, extensions, needs_headers, known = (
            spec.flags,
            spec.extensions,
            spec.needs_npu_headers,
            True,
        )
    elif opts.apex_src is not None:
        flags = detected_flags if detected_flags is not None else ()
        extensions, needs_headers, known = (
            _extensions_for(flags),
            "--npu_float_status" in flags,
            False,
        )
    else:
        raise ConfigError(
            f"unknown Ascend apex ref '{ref}': not in matrix.toml [[refs]] (known: {', '.join(m.known_refs())})",
            'add it to matrix.toml, or pass --setup-flags="--cpp_ext" to build it anyway',
        )
    stack = m.stack(opts.stack) if opts.stack else None
    inputs = identity(opts, torch_npu, spec.flags if spec is not None else None)
    return Plan(
        python=opts.python,
        interpreter=interp.path,
        interpreter_version=interp.full_version,
        arch=interp.machine,
        torch=torch,
        torch_npu=torch_npu,
        torch_build=torch_build(
            m, torch, interp.machine, opts, env, system=opts.use_system_torch, torch_npu=torch_npu
        ),
        apex_ref=ref,
        flags=tuple(flags),
        extensions=tuple(extensions),
        needs_npu_headers=needs_headers,
        ref_known=known,
        target_id=target.Target.of(
            opts.python, torch, interp.machine, ref, torch_npu=torch_npu, identity=inputs
        ).id,
        stack=stack.name if stack else None,
        cann=stack.cann if stack else None,
        identity=inputs,
    )


def _cuda_plan(opts: BuildOptions, m: matrix.Matrix, interp: interpreters.Interpreter, env) -> Plan:
    """The plan of an NVIDIA apex build on CUDA: the ref is NVIDIA's, the flags those of the extensions asked (checked
    against the ref's setup.py once the source is there: nvidiaext.flags), no torch_npu."""
    ref = opts.apex_ref or m.cuda_default_ref
    torch = opts.torch or m.cuda_default_torch(opts.python)
    m.check_torch_python(torch, opts.python)
    asked = tuple(opts.cuda_ext) or ("core",)
    flags = tuple(
        dict.fromkeys(
            flag
            for name in asked
            for flag in (
                tuple(f"--{c}" for c in nvidiaext.CORE) if name == "core" else (f"--{name}",)
            )
        )
    )
    inputs = identity(opts, None, None)
    return Plan(
        python=opts.python,
        interpreter=interp.path,
        interpreter_version=interp.full_version,
        arch=interp.machine,
        torch=torch,
        torch_npu=None,
        torch_build=torch_build(m, torch, interp.machine, opts, env),
        apex_ref=ref,
        flags=flags,
        extensions=(),  # the compiled modules the wheel holds, found in it (the smoke test imports each)
        needs_npu_headers=False,
        ref_known=True,
        target_id=target.Target.of(
            opts.python, torch, interp.machine, ref, backend="cuda", identity=inputs
        ).id,
        identity=inputs,
        backend="cuda",
        cuda_arch=opts.cuda_arch or m.cuda_default_arch_list,
        torch_cuda=m.torch_cuda(torch),
    )


def torch_build(
    m: matrix.Matrix,
    torch: str,
    arch: str,
    opts: BuildOptions,
    env,
    system: bool = False,
    torch_npu: str | None = None,
) -> str:
    """Which torch build pip will install, in words, with what it costs before anything is fetched: its download
    and installed size (a wheelhouse's wheel: measured from the file; the package index: matrix.toml
    [index.torch_builds], per arch and for a CPU torch index) and the cheaper build when there is one. Offline:
    whether the wheelhouses hold the torch (and torch_npu) for this Python and machine, and the download if not."""
    if system:
        return "the interpreter's own torch (nothing downloaded)"
    local = "+" in torch and torch.split("+", 1)[1]
    builds = m.data.get("index", {}).get("torch_builds", {})
    if opts.offline:
        return _offline_torch(torch, torch_npu, arch, opts, env)
    if opts.torch_index_url:
        cpu = "cpu" in opts.torch_index_url or local == "cpu"
        return f"{'CPU build' if cpu else 'build'} from {log.mask(opts.torch_index_url)}" + (
            _cost(builds.get("cpu")) if cpu else ""
        )
    for source, house in wheelhouses(opts, env):
        wheels = (
            sorted(house.glob(f"torch-{torch.split('+')[0]}*{arch}.whl")) if house.is_dir() else []
        )
        if wheels:
            return f"{wheels[0].name} from {source} {house}" + _cost(_measured(wheels[0]))
    if local:
        return (
            f"the {local} build torch {torch}, if the package index serves it (the default index serves none with a "
            "local label: use --torch-index-url or --wheelhouse)"
        )
    facts = m.torch_build(arch)
    return (
        f"{facts['kind']} from the package index{_cost(facts)}; {facts['hint']}"
        if facts
        else "from the package index"
    )


def wheelhouses(opts: BuildOptions, env) -> list[tuple[str, Path]]:
    """The local folders pip installs from, each with where it was named (--wheelhouse, or pip's PIP_FIND_LINKS)."""
    found = [
        ("PIP_FIND_LINKS", Path(p)) for p in env.get("PIP_FIND_LINKS", "").split() if "://" not in p
    ]
    return [("--wheelhouse", w) for w in opts.wheelhouses] + found


def _wheel_in(house: Path, name: str, version: str, arch: str, python: str) -> Path | None:
    """A wheel of `name`==`version` (its local label optional unless given) for CPython `python` and `arch`."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    tag = "cp" + python.replace(".", "")
    for wheel in sorted(house.glob("*.whl")) if house.is_dir() else []:
        try:
            wname, wversion, _, tags = parse_wheel_filename(wheel.name)
        except (InvalidWheelFilename, ValueError):
            continue
        same = str(wversion) == version or ("+" not in version and wversion.public == version)
        if (
            canonicalize_name(wname) == canonicalize_name(name)
            and same
            and any(
                t.interpreter in (tag, "py3") and (arch in t.platform or t.platform == "any")
                for t in tags
            )
        ):
            return wheel
    return None


def _offline_torch(torch: str, torch_npu: str | None, arch: str, opts: BuildOptions, env) -> str:
    """Offline: the wheelhouse's torch (and torch_npu) for this build, or that it is missing and its download."""
    houses = wheelhouses(opts, env)
    named = {h for _, h in houses}
    # pip's own find-links (pip.conf) are a wheelhouse too when offline
    houses += [
        ("pip's find-links", Path(p))
        for p in pipconfig.read(env).get_list("find-links")
        if "://" not in p and Path(p) not in named
    ]
    said, missing = [], []
    for name, version in (("torch", torch), ("torch_npu", torch_npu)):
        if not version:
            continue
        hits = [
            (s, h, w)
            for s, h in houses
            for w in [_wheel_in(h, name, version, arch, opts.python)]
            if w
        ]
        if hits:
            source, house, wheel = hits[0]
            said.append(f"{wheel.name} from {source} {house}" + _cost(_measured(wheel)))
        else:
            missing.append((name, version))
    if not missing:
        return "; ".join(said)
    where = ", ".join(f"{s} {h}" for s, h in houses) or "no wheelhouse"
    into = str(houses[0][1]) if houses else "DIR"
    what = " and ".join(f"{n} {v} cp{opts.python.replace('.', '')} {arch}" for n, v in missing)
    fetch = " ".join(f"{n}=={v}" for n, v in missing)
    return (
        f"{what} is not in {where}: this build will fail -- next: pip download {fetch} --python-version "
        f"{opts.python} --only-binary :all: -d {into} on a host with network"
    )


def _cost(facts: dict | None) -> str:
    """The sizes of a [index.torch_builds] row or a measured wheel: ' (~D to download, ~I installed)', or ''."""
    sizes = [f"~{facts[k]} {w}" for k, w in (("download", "to download"), ("install", "installed"))
             if facts and facts.get(k)]  # fmt: skip
    return f" ({', '.join(sizes)})" if sizes else ""


def _measured(wheel: Path) -> dict:
    """A wheelhouse torch's download (the file) and installed size (its members, uncompressed), in MiB."""
    import zipfile

    facts = {"download": f"{wheel.stat().st_size / 2**20:.0f} MiB"}
    with contextlib.suppress(OSError, zipfile.BadZipFile), zipfile.ZipFile(wheel) as zf:
        facts["install"] = f"{sum(i.file_size for i in zf.infolist()) / 2**20:.0f} MiB"
    return facts


def _extensions_for(flags) -> tuple[str, ...]:
    ext = ("apex_C", "change_data_ptr") if "--cpp_ext" in flags else ()
    return ext + (("npu_float_status",) if "--npu_float_status" in flags else ())


def cache_key(
    plan: Plan,
    opts: BuildOptions,
    ascend_commit: str,
    nvidia_sha: str,
    patch_list: list[patches.Patch],
    m: matrix.Matrix,
    extra: dict | None = None,
) -> str:
    """Content address of a wheel: every input that changes its bytes (`extra`: a CUDA build's toolkit)."""
    inputs = {
        "recipe": RECIPE_VERSION,
        "ascend": ascend_commit,
        "nvidia": nvidia_sha,
        "patches": sorted(p.sha256 for p in patch_list if p.id not in opts.skip_patches),
        "flags": list(plan.flags),
        "python": plan.interpreter_version.rsplit(".", 1)[0],
        "arch": plan.arch,
        "torch": plan.torch,
        "torch_npu": plan.torch_npu,
        # without user:password@ (sources.split_credentials): the key is published in a team index's index.json
        # beside facts that give away every other input, so a hashed password would be open to offline guessing;
        # and a credential changes no byte of the wheel, so two engineers with their own tokens share the key
        "torch_index": sources.split_credentials(opts.torch_index_url)[0]
        if opts.torch_index_url
        else None,
        "system_torch": opts.use_system_torch,
        "requires": m.build_requires,
    }
    if opts.sanitize:  # only then: a release build's key stays what it was
        inputs["sanitize"] = list(opts.sanitize)
    if plan.backend == "cuda":  # only then: an Ascend build's key stays what it was
        inputs.update(backend="cuda", cuda_arch=plan.cuda_arch, requires=m.cuda_requires)
    inputs.update(extra or {})
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
