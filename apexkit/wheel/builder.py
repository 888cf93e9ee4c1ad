"""Build one Apex for Ascend wheel: plan (pure), then do (sources, venv, tree, patches, compile, smoke test, dist).

dist/<target-id>/ holds the wheel and manifest.json; it is replaced atomically, so a failed build never leaves a
half-written dist/. The full log stays in build/<target-id>/build.log.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from packaging.version import InvalidVersion

import apexkit
from apexkit import cachetrust, cann, fsedit, locks, log, paths, untrusted, vocab
from apexkit.errors import ApexkitError, BuildError, ConfigError, SmokeTestError, SourceError
from apexkit.plan import matrix
from apexkit.proc import appending, keep_log, run_logged
from apexkit.wheel import (
    buildplan,
    cachedirs,
    ccachestats,
    cudabin,
    cudabuild,
    cudatool,
    interpreters,
    known_failures,
    nvidiaext,
    patches,
    sanitize,
    sbom,
    sources,
    venvs,
    wheelcheck,
)
from apexkit.wheel.cache import CachedWheel, RemoteLookup, WheelCache
from apexkit.wheel.distdir import check_overwrite, replace_dir, with_documents
from apexkit.wheel.options import BuildOptions

ZIP_EPOCH = 315532800  # 1980-01-01, the earliest zip timestamp: SOURCE_DATE_EPOCH when the source has no commit time

# Run in the build and smoke venvs (bench/probes): the torch facts (torch_facts.py build: for the binary checks;
# system: --use-system-torch) and the smoke test, which prints SMOKE_MARK + JSON.
TORCH_FACTS = paths.PROBES / "torch_facts.py"
SMOKE_SCRIPT = paths.PROBES / "smoke.py"
SMOKE_MARK = "APEXKIT-SMOKE "


# --- doing -------------------------------------------------------------------------------------------------------


@dataclass
class BuildState:
    """What one build learns as its steps run, declared in one place: filled in step order, read by the manifest."""

    started: float = field(default_factory=time.monotonic)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step, under stable keys
    log_path: Path | None = None  # build/<target-id>/build.log, once the build directory is held
    source_epoch: int = (
        ZIP_EPOCH  # SOURCE_DATE_EPOCH: the Ascend commit's time once the sources are known
    )
    cache_key: str | None = None  # the wheel's content address, once the sources are known
    use_cache: bool = (
        False  # whether the wheel cache may be read and written (ours, and a clean --apex-src)
    )
    ccache: dict | None = None  # ccache's hits and misses for the compile


@dataclass(frozen=True)
class Sources:
    """What a backend hands the shared finish step (Builder._finish): the patched tree, the build directory, the patch
    results, the cache key, and the sources the manifest names (Ascend's, None for CUDA; NVIDIA apex's commit)."""

    tree: Path
    work: Path
    results: list[patches.PatchResult]
    key: str
    ascend: sources.AscendSource | None
    nvidia_sha: str


class Builder:
    def __init__(self, opts: BuildOptions, env=None, remote: RemoteLookup | None = None) -> None:
        if (
            not opts.dry_run
        ):  # the cache, or a private one when others can write it (apexkit.cachetrust)
            cachetrust.tighten_umask()
            opts = replace(opts, cache_dir=cachetrust.trusted(opts.cache_dir))
        self.opts = opts
        self.remote = (
            remote  # the team index, asked after a local cache miss (the command edge makes it)
        )
        self.env = dict(os.environ if env is None else env)
        # torch >= 2.5 imports every installed device backend at `import torch`; torch_npu then needs the CANN
        # runtime (libhccl.so), which build hosts, CI runners and image builds do not have. Building needs no CANN,
        # so every torch this build runs (setup.py, probes, the smoke test) leaves torch_npu alone.
        self.env[cann.NO_AUTOLOAD] = "0"
        self.m = matrix.load()
        self.state = BuildState()
        self.kit: cudabuild.Toolkit | None = (
            None  # a CUDA build's toolkit, found before the plan is shown
        )
        self.cache = WheelCache(opts.cache_dir / "wheels")
        self.index = venvs.IndexOptions(
            opts.index_url,
            opts.extra_index_urls,
            opts.torch_index_url,
            opts.wheelhouses,
            opts.offline,
        )

    @property
    def log_path(self) -> Path:
        """build/<target-id>/build.log: there once the build directory is held (BuildState.log_path)."""
        if self.state.log_path is None:
            raise RuntimeError("the build log is used before the build directory is held")
        return self.state.log_path

    # The whole build. Returns the path of dist/<target-id>/.
    def run(self) -> Path:
        opts = self.opts
        self.state = BuildState()  # each run starts afresh
        with log.step(f"find python{opts.python}", self.state.timings, key="find_python") as s:
            interp = interpreters.find(opts.python, self.env, opts.python_path)
            s.note(f"{interp.path} ({interp.full_version}, {interp.machine})")
        system_torch = self._system_torch(interp) if opts.use_system_torch else None
        detected = None
        if (
            opts.apex_src is not None
            and opts.setup_flags is None
            and self.m.ref(opts.apex_ref or "local") is None
        ):
            detected = sources.flags_of(
                opts.apex_src
            )  # a ref matrix.toml does not know: its npu.patch says
        plan = buildplan.make_plan(
            opts,
            self.m,
            interp,
            system_torch["version"] if system_torch else None,
            self.env,
            detected,
        )
        if detected is not None:
            log.info(f"  flags detected from npu.patch: {' '.join(detected)}")
        if (
            plan.backend == "cuda"
        ):  # before anything is fetched or installed: the toolkit fits torch and the arches
            self.kit = cudabuild.toolkit(
                self.env, plan.torch_cuda, plan.torch, cudabin.parse_arch_list(plan.cuda_arch)
            )
            if self.kit.wheels and opts.offline:
                cudabuild.check_offline(self.kit, opts.wheelhouses)
        self._summary(plan)
        stack = self.m.stack(plan.stack) if plan.stack else None
        if stack is not None and stack.arch != plan.arch:
            log.warn(
                f"stack {stack.name} trains on {stack.arch}; this wheel is for {plan.arch} (this machine). For "
                f"{stack.arch}: {vocab.command('image.build', f'--arch {stack.arch}')}, then "
                f"{vocab.build(stack.python, f'--stack {stack.name} --image IMAGE')} (under QEMU), or build on an "
                f"{stack.arch} host"
            )
        patch_list = patches.load_all()
        patches.check_skips(patch_list, opts.skip_patches)
        make = (
            not opts.dry_run
        )  # dist/ and build/ (with the <target> folders in them) only ours, or refused
        # dist/ is only judged here (made when the wheel lands: distdir.replace_dir): a failed build leaves none
        cachetrust.trusted_output(opts.dist_dir, paths.DIST_SETTING, make=False)
        cachetrust.trusted_output(opts.build_dir, paths.BUILD_SETTING, make=make)
        check_overwrite(
            opts.dist_dir, plan.target_id, plan.identity, opts.force
        )  # before hours of compiling
        if opts.dry_run:
            log.result("dry run: nothing fetched, built or written")
            return opts.dist_dir / plan.target_id

        work = opts.build_dir / plan.target_id
        # Locks (apexkit.locks): build/<target> for the whole build, then the wheel-cache entry from lookup to store
        # (a second build of the same inputs waits, then takes the first one's wheel as a cache hit), the build venv
        # and each git mirror inside; dist/<target> while it is swapped (distdir.replace_dir). Always in this order.
        with locks.hold(work, f"build directory {work}"), contextlib.ExitStack() as held:
            return self._run_in(work, plan, interp, patch_list, held)

    def _run_in(
        self,
        work: Path,
        plan: buildplan.Plan,
        interp: interpreters.Interpreter,
        patch_list: list[patches.Patch],
        held: contextlib.ExitStack,
    ) -> Path:
        opts = self.opts
        cachetrust.trusted_output(work, paths.BUILD_SETTING)
        self.state.log_path = work / "build.log"
        held.enter_context(keep_log(self.log_path))  # opened once: every append goes there
        with appending(self.log_path) as fh:
            fh.write(f"apexkit {apexkit.__version__} build of {plan.target_id}\n")
        if plan.backend == "cuda":
            return self._run_cuda(work, plan, interp, held)

        with tempfile.TemporaryDirectory(prefix="ascend-", dir=work) as tmp:
            ascend, nvidia, nvidia_sha = self._sources(plan, Path(tmp) / "ascend")
            key = self.state.cache_key = buildplan.cache_key(
                plan, opts, ascend.commit, nvidia_sha, patch_list, self.m
            )
            # a dirty checkout is never cached
            done = self._cached(key, plan, interp, work, held, usable=not ascend.dirty)
            if done is not None:
                return done
            if plan.needs_npu_headers:
                self._check_npu_headers(plan)
            venv = self._build_venv(plan, interp)
            tree = work / "tree"
            with log.step(
                "generate tree (NVIDIA apex + npu.patch + src/ + tests/)",
                self.state.timings,
                key="tree",
            ) as s:
                sources.generate_tree(ascend, nvidia, nvidia_sha, tree)
                s.note(f"{tree} (NVIDIA apex {nvidia_sha[:12]}, Ascend {ascend.commit[:19]})")
        results = self._apply_patches("apply our patches", tree, opts.skip_patches, patch_list)
        return self._finish(
            plan, interp, venv, Sources(tree, work, results, key, ascend, nvidia_sha)
        )

    def _apply_patches(
        self, title: str, tree: Path, skip: Sequence[str], patch_list: list[patches.Patch]
    ) -> list[patches.PatchResult]:
        with log.step(title, self.state.timings, key="patches") as s:
            results = patches.apply_all(tree, skip, patch_list)
            for r in results:
                log.info(f"  {r.id:<18} {r.status}")
            s.note(", ".join(f"{r.id}: {r.status}" for r in results))
        return results

    def _finish(
        self,
        plan: buildplan.Plan,
        interp: interpreters.Interpreter,
        venv: venvs.Venv,
        src: Sources,
    ) -> Path:
        """The steps both backends share once the tree is patched: compile, binary checks, retag, smoke test, then
        the manifest, the wheel cache and dist/. What differs between them travels in `src`."""
        # the SBOM's warm-up overlaps the compile
        threading.Thread(target=sbom.warm_up, name="sbom-warm-up", daemon=True).start()
        wheel = self._compile(plan, venv, src.tree, src.work)
        checks = self._binary_checks(plan, venv, src.tree, wheel, src.results)
        wheel = self._retag(plan, venv, wheel, checks)
        smoke = (
            self._smoke_test(plan, interp, wheel, src.work)
            if self.opts.smoke_test
            else {"skipped": "--no-smoke-test"}
        )
        manifest = self._manifest(
            plan, src.ascend, src.nvidia_sha, src.results, wheel, venv, src.key, smoke, checks
        )
        if self.state.use_cache:
            self.cache.store(src.key, wheel, manifest)
        return self._publish(plan, wheel, manifest)

    def _cached(
        self,
        key: str,
        plan: buildplan.Plan,
        interp: interpreters.Interpreter,
        work: Path,
        held: contextlib.ExitStack,
        usable: bool = True,
    ) -> Path | None:
        """dist/<target> from the local wheel cache or the team index when either has `key` (None: compile). Holds
        the cache entry's lock in `held` from here to the store (`usable`: False keeps this build out of the cache)."""
        opts = self.opts
        self.state.use_cache = self.cache.usable() and usable
        if self.state.use_cache:
            held.enter_context(locks.hold(self.cache.entry(key), f"wheel cache entry {key[:12]}"))
        cached = self.cache.lookup(key, work) if (self.state.use_cache and opts.use_cache) else None
        if cached is not None:
            return self._publish_cached(plan, cached, interp, work)
        if self.remote is not None and self.state.use_cache and opts.use_cache:
            hit = self._team_index_hit(key, plan, interp, work)
            if hit is not None:
                return self._publish_cached(plan, hit[0], interp, work, source=hit[1])
        return None

    def _run_cuda(
        self,
        work: Path,
        plan: buildplan.Plan,
        interp: interpreters.Interpreter,
        held: contextlib.ExitStack,
    ) -> Path:
        """NVIDIA apex on CUDA: upstream's tree at the ref (no npu.patch), our patches/cuda edits, a build tree kept
        in build/<target>/tree and synced by content (ninja resumes a killed build and recompiles only what
        changed), then the shared steps: binary checks (with the GPU code embedded), smoke test, cache, dist."""
        opts, kit = self.opts, self.kit
        assert kit is not None
        cuda_patches = patches.load_all(paths.PATCHES / cudabuild.PATCHES)
        retry = sources.RetryPolicy.from_env(self.env)
        tree = work / "tree"
        with tempfile.TemporaryDirectory(prefix="nvidia-", dir=work) as tmp:
            export = Path(tmp) / "nvidia"
            with log.step("sources", self.state.timings, key="sources") as s:
                mirror = sources.Mirror(opts.nvidia_apex_url, opts.cache_dir, retry)
                sha = (
                    mirror.ensure_commit(opts.nvidia_commit, opts.offline)
                    if opts.nvidia_commit
                    else mirror.resolve(plan.apex_ref, opts.offline)
                )
                mirror.export(sha, export)
                self.state.source_epoch = mirror.commit_time(sha) or ZIP_EPOCH
                setup_py = export / "setup.py"
                if setup_py.is_symlink() or not setup_py.is_file():
                    raise ConfigError(
                        f"NVIDIA apex {plan.apex_ref} ({sha[:12]}) has no setup.py: not an apex tree",
                        "check --nvidia-apex-url and --apex-ref",
                    )
                with open(setup_py, "rb") as fh:
                    head = fh.read(nvidiaext.MAX_SETUP + 1)
                if len(head) > nvidiaext.MAX_SETUP:
                    raise ConfigError(
                        f"NVIDIA apex {plan.apex_ref} ({sha[:12]}): setup.py is over "
                        f"{nvidiaext.MAX_SETUP // 1024} KiB, not upstream's (~40 KB)",
                        "check --nvidia-apex-url and --apex-ref",
                    )
                flags = nvidiaext.flags(
                    tuple(opts.cuda_ext) or ("core",), head.decode(errors="replace"), plan.apex_ref
                )
                s.note(f"NVIDIA apex {plan.apex_ref} {sha[:12]} (verified); {' '.join(flags)}")
            plan = replace(plan, flags=flags)
            objects = {  # what changes the objects besides the sources and the command lines ninja sees
                "nvcc": kit.version,
                **{k: self.env[k] for k in cudabuild.NVCC_ENV if self.env.get(k)},
            }
            key = self.state.cache_key = buildplan.cache_key(
                plan, opts, "", sha, cuda_patches, self.m, extra=objects
            )
            done = self._cached(key, plan, interp, work, held)
            if done is not None:
                return done
            venv = self._build_venv(plan, interp)
            torch_cuda = self._torch_cuda(venv)
            if kit.nvcc is None:  # the index's toolchain, now in the build venv
                with log.step(
                    "CUDA toolchain from the index", self.state.timings, key="toolchain"
                ) as s:
                    kit = self.kit = cudabuild.from_venv(
                        kit,
                        Path(self._torch_facts(venv)["site"]),
                        work / "cuda-home",
                        torch_cuda,
                        plan.torch,
                        cudabin.parse_arch_list(plan.cuda_arch),
                    )
                    s.note(f"nvcc {kit.version} ({kit.chosen})")
                objects["nvcc"] = kit.version
            cudatool.check_matches_torch(kit.found()[0], torch_cuda, plan.torch)
            plan = replace(plan, torch_cuda=torch_cuda)
            results = self._apply_patches(
                "apply our patches (patches/cuda)", export, (), cuda_patches
            )
            with log.step("build tree (synced by content)", self.state.timings, key="tree") as s:
                try:
                    counts = cudabuild.sync_tree(export, tree)
                    kept = cudabuild.objects_for(
                        tree, {**objects, "torch": plan.torch, "python": plan.interpreter_version}
                    )
                except OSError as exc:
                    raise BuildError(
                        f"cannot sync the build tree {tree}: {exc.strerror or exc}",
                        f"remove {tree} and build again",
                    ) from None
                s.note(
                    f"{tree}: {counts['written']} written, {counts['kept']} unchanged, "
                    f"{counts['removed']} removed; "
                    + (
                        f"objects in {tree / 'build'} kept"
                        if kept
                        else "no objects kept (none yet, or another nvcc made them)"
                    )
                )
        return self._finish(plan, interp, venv, Sources(tree, work, results, key, None, sha))

    def _torch_cuda(self, venv: venvs.Venv) -> str | None:
        """torch.version.cuda of the build venv's torch (None: a CPU build), read with its other facts."""
        found = self._torch_facts(venv)["cuda"]
        if found is not None and not (isinstance(found, str) and len(found) <= 16):
            raise BuildError(
                "the build venv's torch reports no readable torch.version.cuda",
                f"see {self.log_path}",
            )
        return found

    # --- steps -------------------------------------------------------------------------------------------------
    def _summary(self, plan: buildplan.Plan) -> None:
        o = self.opts
        rows = [
            ("target", plan.target_id),
            ("interpreter", f"{plan.interpreter} ({plan.interpreter_version})"),
            *(
                [
                    (
                        "stack",
                        f"{plan.stack}"
                        + (f" (CANN {plan.cann} on the NPU nodes)" if plan.cann else ""),
                    )
                ]
                if plan.stack
                else []
            ),
            (
                "torch",
                f"{plan.torch}"
                + (" (system)" if o.use_system_torch else "")
                + (f" + torch_npu {plan.torch_npu}" if plan.torch_npu else ""),
            ),
            ("torch build", plan.torch_build),
            *(self._cuda_rows(plan) if plan.backend == "cuda" else self._ascend_rows(plan)),
            *self._where_rows(),
            ("dist", str(o.dist_dir / plan.target_id)),
            *(  # where each source you set came from (apexkit.config): flag, env NAME, project/user FILE
                ("  " + key, f"from {origin}")
                for key, _, origin in (item.partition("\t") for item in o.origins)
            ),
        ]
        show = (
            log.result if o.dry_run else log.info
        )  # the plan is a dry run's result: shown under -q too
        for name, value in rows:
            show(f"  {name:<15} {value}")

    def _where_rows(self) -> list[tuple[str, str]]:
        """Where the build's packages, cached wheels and compiler cache come from."""
        o = self.opts
        team = self.remote is not None and o.use_cache and o.team_indexes
        return [
            (
                "index",
                "offline"
                if o.offline
                else (log.mask(o.index_url or "") or "pip config")
                + (f", torch from {log.mask(o.torch_index_url)}" if o.torch_index_url else ""),
            ),
            (
                "cache",
                f"{o.cache_dir}"
                + ("" if o.use_cache else " (--no-cache)")
                + (
                    f", then the team index {', '.join(log.mask(i) for i in o.team_indexes)}"
                    if team
                    else ""
                ),
            ),
            (
                "ccache",
                "CC/CXX from the environment, used as they are"
                if "CC" in self.env or "CXX" in self.env
                else ccachestats.describe_setup(
                    ccachestats.find(self.env), self.env, o.compile_cache
                ),
            ),
        ]

    def _ascend_rows(self, plan: buildplan.Plan) -> list[tuple[str, str]]:
        o = self.opts
        return [
            (
                "Ascend apex",
                f"{o.apex_src} (copy)"
                if o.apex_src
                else f"{log.mask(o.ascend_apex_url)} @ {plan.apex_ref}",
            ),
            ("NVIDIA apex", log.mask(o.nvidia_apex_url)),
            ("setup.py flags", " ".join(plan.flags) or "(detected from npu.patch)"),
            ("jobs", str(o.jobs)),
        ]

    def _cuda_rows(self, plan: buildplan.Plan) -> list[tuple[str, str]]:
        """What a CUDA build's plan adds: the toolkit and why, the arch list, the extensions, the jobs."""
        o, kit = self.opts, self.kit
        assert kit is not None
        arches = cudabin.parse_arch_list(plan.cuda_arch)
        torch_cuda = (
            f"matches torch {plan.torch}'s CUDA {plan.torch_cuda}"
            if plan.torch_cuda
            else f"torch {plan.torch}'s CUDA is checked once it is installed"
        )
        return [
            ("backend", "cuda: upstream NVIDIA apex for CUDA GPUs"),
            ("NVIDIA apex", f"{log.mask(o.nvidia_apex_url)} @ {o.nvidia_commit or plan.apex_ref}"),
            (
                "CUDA toolkit",
                (
                    f"nvcc {kit.nvcc.version} ({kit.nvcc.path}; {kit.chosen}), {torch_cuda}"
                    if kit.nvcc is not None
                    else f"{kit.chosen}; its nvcc is checked against torch's CUDA and the arch list once installed"
                ),
            ),
            (
                "arch list",
                f"TORCH_CUDA_ARCH_LIST={plan.cuda_arch} -> {cudabin.wanted(arches).describe()}",
            ),
            (
                "extensions",
                f"{','.join(o.cuda_ext or ('core',))} (setup.py {' '.join(plan.flags)}; checked against the ref's "
                + (
                    "setup.py once fetched: a dry run fetches nothing)"
                    if o.dry_run
                    else "setup.py)"
                ),
            ),
            (
                "jobs",
                f"MAX_JOBS={o.jobs}, nvcc --threads {o.nvcc_threads} ({os.cpu_count()} cores, "
                f"{cudatool.free_gib():.0f} GiB available, {cudatool.GIB_PER_JOB:g} GiB per nvcc job; --jobs N "
                "to choose)",
            ),
        ]

    def _system_torch(self, interp: interpreters.Interpreter) -> dict:
        proc = subprocess.run(
            [interp.path, str(TORCH_FACTS), "system"], capture_output=True, text=True, env=self.env
        )
        if proc.returncode != 0:
            raise ConfigError(
                f"--use-system-torch: {interp.path} cannot import torch "
                f"({(proc.stderr.strip().splitlines() or ['?'])[-1]})",
                "install torch for that interpreter, or drop --use-system-torch to install one in the venv",
            )
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def _sources(self, plan: buildplan.Plan, dest: Path):
        opts = self.opts
        retry = sources.RetryPolicy.from_env(self.env)
        with log.step("sources", self.state.timings, key="sources") as s:
            if opts.apex_src:
                ascend = sources.copy_ascend(opts.apex_src, dest)
                if ascend.dirty:
                    log.warn(
                        f"{opts.apex_src} has uncommitted changes: the wheel cache is bypassed"
                    )
            else:
                mirror = sources.Mirror(opts.ascend_apex_url, opts.cache_dir, retry)
                sha = mirror.resolve(plan.apex_ref, opts.offline)
                ascend = sources.checkout_ascend(mirror, sha, dest)
            self.state.source_epoch = ascend.commit_time or ZIP_EPOCH
            pinned = ascend.pinned_nvidia_commit()
            nvidia_sha = opts.nvidia_commit or pinned or self.m.nvidia_apex_commit
            if pinned and not opts.nvidia_commit and pinned != self.m.nvidia_apex_commit:
                log.warn(
                    f"scripts/build.sh pins NVIDIA apex {pinned[:12]}, matrix.toml says "
                    f"{self.m.nvidia_apex_commit[:12]}: using build.sh's"
                )
            nvidia = sources.Mirror(opts.nvidia_apex_url, opts.cache_dir, retry)
            nvidia.ensure_commit(nvidia_sha, opts.offline)
            s.note(f"Ascend {ascend.commit[:19]}, NVIDIA {nvidia_sha[:12]} (verified)")
        return ascend, nvidia, nvidia_sha

    def _check_npu_headers(self, plan: buildplan.Plan) -> None:
        home = cann.home(self.env)
        if home and any(
            (Path(home) / sub / "acl" / "acl.h").is_file() for sub in ("include", "runtime/include")
        ):
            return
        raise ConfigError(
            f"ref {plan.apex_ref} builds npu_float_status ({' '.join(plan.flags)}), which needs the ACL headers of "
            "the CANN toolkit, and none was found (ASCEND_HOME_PATH unset, no /usr/local/Ascend/ascend-toolkit)",
            "install CANN and source its set_env.sh (and build with --npu), or use --apex-ref master",
        )

    def _venv_dir(self, plan: buildplan.Plan, interp: interpreters.Interpreter) -> Path:
        inputs = {
            "interp": interp.path,
            "version": interp.full_version,
            "torch": plan.torch,
            "torch_npu": plan.torch_npu,
            "system": self.opts.use_system_torch,
            "requires": self._requires(plan),
            "index": self.index.key(),
        }
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
        return self.opts.cache_dir / "venvs" / f"build-py{plan.python}-{digest}"

    def _requires(self, plan: buildplan.Plan) -> list[str]:
        if plan.backend == "cuda":  # + the index's toolchain where no toolkit of torch's CUDA is
            return [*self.m.cuda_requires, *(self.kit.wheels if self.kit is not None else ())]
        return self.m.build_requires

    def _build_venv(self, plan: buildplan.Plan, interp: interpreters.Interpreter) -> venvs.Venv:
        o = self.opts
        # a miss: this build compiles, and its build venv needs torch and the build deps from a local folder
        if o.offline and not buildplan.wheelhouses(o, self.env) and not o.use_system_torch:
            raise ConfigError(
                "--offline needs --wheelhouse DIR (or PIP_FIND_LINKS) holding torch and the build deps: "
                + (
                    f"the wheel cache has no wheel for these inputs (cache key {self.state.cache_key[:12]})"
                    if o.use_cache and self.state.use_cache and self.state.cache_key
                    else "the wheel cache is not used (--no-cache, --verify-reproducible or a dirty checkout)"
                )
                + ", so the build has to compile",
                "add --wheelhouse DIR (or wheelhouses in the config file), or drop --offline",
            )
        path = self._venv_dir(plan, interp)
        marker = path / "apexkit-ready.json"
        # Two timed steps: "venv" (waiting for its lock, creating it, or finding it ready) and "torch_install"
        # (torch, torch_npu and the build requirements into it; absent from the timings when the venv was reused).
        with contextlib.ExitStack() as held:
            with log.step("build venv", self.state.timings, key="venv") as s:
                held.enter_context(venvs.lock(path))
                if (
                    marker.is_file() and not self.opts.recreate_venv
                ):  # checked under the lock: another build may
                    # have made it while this one waited
                    refused = cachetrust.venv_problem(path)
                    if refused is None:
                        s.note(f"reused {path}")
                        return venvs.Venv(path)
                    log.warn(
                        f"build venv {path} not reused: {refused} (whoever can write it could run code as this "
                        "build); making it again"
                    )
                venv = venvs.create(
                    interp.path,
                    path,
                    self.log_path,
                    system_site_packages=self.opts.use_system_torch,
                    index=self.index,
                )
                s.note(f"{path}")
            what = (
                "the system torch"
                if self.opts.use_system_torch
                else f"torch {plan.torch}"
                + (f" + torch_npu {plan.torch_npu}" if plan.torch_npu else "")
            )
            with log.step(
                f"install {what} and the build requirements",
                self.state.timings,
                key="torch_install",
            ) as s:
                self._install_torch(venv, plan)
                venvs.pip_install(
                    venv,
                    self._requires(plan),
                    self.index,
                    self.log_path,
                    verbose=self.opts.verbose,
                )
                if self.opts.use_system_torch:
                    self._ensure_system_torch_visible(venv, interp)
                packages = venvs.freeze(venv)
                fsedit.atomic_write(
                    marker,
                    json.dumps({"packages": packages, "created": time.time()}, indent=1).encode(),
                    0o644,
                )
                s.note(
                    ", ".join(
                        f"{n} {packages[n]}"
                        for n in ("torch", "torch-npu", "torch_npu", "setuptools")
                        if isinstance(packages, dict) and packages.get(n)
                    )
                )
            return venv

    def _install_torch(self, venv: venvs.Venv, plan: buildplan.Plan, record: bool = True) -> None:
        """torch (+ torch_npu); `record`: note the wheels' digests for the SBOM (the build venv, not the smoke one)."""
        if self.opts.use_system_torch:
            return
        venvs.pip_install(
            venv,
            [f"torch=={plan.torch}"],
            self.index,
            self.log_path,
            for_torch=True,
            verbose=self.opts.verbose,
            record=record,
        )
        if plan.torch_npu:
            venvs.install_torch_npu(
                venv,
                plan.torch_npu,
                self.m.npu_requires,
                self.index,
                self.log_path,
                self.env,
                verbose=self.opts.verbose,
                record=record,
            )

    def _ensure_system_torch_visible(
        self, venv: venvs.Venv, interp: interpreters.Interpreter
    ) -> None:
        """A venv made from a venv does not see the parent's packages: point a .pth at the system torch's dir."""
        probe = subprocess.run(
            [str(venv.python), "-c", "import torch"], capture_output=True, env=self.env
        )
        if probe.returncode == 0:
            return
        torch_dir = self._system_torch(interp)["dir"]
        site = venv.run_json(
            "import json, sysconfig; print(json.dumps(sysconfig.get_paths()['purelib']))"
        )
        Path(site, "apexkit-system-torch.pth").write_text(torch_dir + "\n")

    def _compile(self, plan: buildplan.Plan, venv: venvs.Venv, tree: Path, work: Path) -> Path:
        out = work / "wheel"
        shutil.rmtree(out, ignore_errors=True)
        env = dict(self.env)
        env["MAX_JOBS"] = str(self.opts.jobs)
        env["PYTHONUNBUFFERED"] = (
            "1"  # setup.py's and ninja's lines reach the log and the progress as they come
        )
        linked = _linked_venv(venv, tree)
        env.update(
            reproducible_env(self.state.source_epoch, tree, venv.path, linked.path, self.env)
        )
        env.update(identity_env(plan))
        wrapper, setup = self._compiler(env)
        self.state.ccache = None
        argv = self._setup_py(plan, venv, linked, out, env, wrapper)
        with log.step(
            f"compile ({' '.join(plan.flags)}, -j{self.opts.jobs}{', ccache' if wrapper else ''})",
            self.state.timings,
            key="compile",
        ) as s:
            before = ccachestats.snapshot(wrapper, env) if wrapper else None
            code, tail = run_logged(
                argv,
                self.log_path,
                cwd=tree,
                env=env,
                verbose=self.opts.verbose,
                progress=_compile_progress,
            )
            if wrapper and before is not None:
                after = ccachestats.snapshot(wrapper, env)
                self.state.ccache = {
                    **(setup or {}),
                    **ccachestats.diff(before, after, remote=bool(setup and setup["remote"])),
                }
                self._remote_trouble(self.state.ccache)
            if code != 0:
                hint = self._explain_failure(tail)
                raise BuildError(
                    f"setup.py failed for {plan.target_id}: {_first_error(tail)}",
                    f"full log: {self.log_path}" + (f"; {hint}" if hint else ""),
                )
            wheels = sorted(out.glob("*.whl"))
            if len(wheels) != 1:
                raise BuildError(
                    f"setup.py produced {len(wheels)} wheels in {out}", f"see {self.log_path}"
                )
            s.note(
                wheels[0].name + (f"; {ccachestats.describe(self.state.ccache)}" if wrapper else "")
            )
        return wheels[0]

    @staticmethod
    def _remote_trouble(stats: dict) -> None:
        """A remote storage that failed (down, slow, full, answering garbage) is one line: the build went on."""
        if stats.get("remote_errors"):
            log.warn(
                f"ccache's remote storage {stats['remote']} failed {stats['remote_errors']} time(s) (down, slow, "
                "full or answering garbage): this build used its local cache -- next: check the server, or "
                "unset compile_cache"
            )

    def _compiler(self, env: dict[str, str]) -> tuple[str | None, dict | None]:
        """--sanitize's flags and ccache into `env`: (the ccache that wraps the compiler, whether apexkit put it in
        front of the compilers -- ccachestats.wrap's record -- or the user did through CC/CXX; None: none). Its hits and
        misses for this compile alone go into the manifest (its counters before and after; the user's stats stay)."""
        if (
            self.opts.sanitize
        ):  # a +asan diagnosis build: instrumented objects, the runtime linked in
            wanted = sanitize.flags(self.opts.sanitize)
            for var in ("CFLAGS", "CXXFLAGS", "LDFLAGS"):
                env[var] = f"{env.get(var, '')} {wanted}".strip()
        if "CC" in env or "CXX" in env:  # the user's compilers, used as they are
            words = [v.split()[0] for v in (env.get("CXX"), env.get("CC")) if v and v.split()]
            return next(
                (shutil.which(w) or w for w in words if Path(w).name == "ccache"), None
            ), None
        ccache = ccachestats.find(env)
        setup = ccache and ccachestats.wrap(
            ccache, self.opts.cache_dir, env, self.opts.compile_cache
        )
        return (ccache, setup) if setup else (None, None)

    def _setup_py(
        self,
        plan: buildplan.Plan,
        venv: venvs.Venv,
        linked: venvs.Venv,
        out: Path,
        env: dict[str, str],
        ccache: str | None = None,
    ) -> list[str]:
        """setup.py's command line, run by the build venv's python through its `linked` path; for CUDA upstream's
        own (ninja compiles MAX_JOBS objects at once), with nvcc's environment added to `env`."""
        if plan.backend != "cuda":
            jobs = str(self.opts.jobs)
            return [
                str(linked.python),
                "setup.py",
                *plan.flags,
                "build_ext",
                "-j",
                jobs,
                "bdist_wheel",
                "-d",
                str(out),
            ]
        assert self.kit is not None
        site = Path(self._torch_facts(venv)["site"])
        with contextlib.suppress(ValueError):  # under the venv: the same folder through the link
            site = linked.path / site.relative_to(venv.path)
        env.update(
            cudabuild.compile_env(
                self.kit, plan.cuda_arch, self.opts.jobs, self.opts.nvcc_threads, env, site, ccache
            )
        )
        return [str(linked.python), "setup.py", *plan.flags, "bdist_wheel", "-d", str(out)]

    def expectations(
        self, plan: buildplan.Plan, venv: venvs.Venv, tree: Path, results: list[patches.PatchResult]
    ) -> wheelcheck.Expect:
        """What the binaries must show, from this build's own inputs: the target arch, the build venv's torch (its
        lib/ folder, its C++ ABI), the patched setup.py (hardening flags, declared libraries) and whether our
        rpath patch applied."""
        torch = self._torch_facts(venv)
        setup_py = (tree / "setup.py").read_text(errors="replace")
        rpath_status = next((r.status for r in results if r.id == "rpath-link-flag"), None)
        extra = [
            d
            for d in (
                torch.get("npu_lib"),
                *(f"{c}/lib64" for c in [cann.home(self.env)] if c),
            )
            if d
        ]
        cuda = None
        if (
            plan.backend == "cuda"
        ):  # libcudart.so.13 and friends: the venv's nvidia-* wheels, as torch loads them
            extra = list(cudatool.runtime_lib_dirs(Path(torch["site"])))
            cuda = cudabin.wanted(cudabin.parse_arch_list(plan.cuda_arch))
        return wheelcheck.Expect(
            arch=plan.arch,
            torch_lib=torch["lib"],
            extra_lib_dirs=tuple(extra),
            declared_libs=wheelcheck.declared_libs(setup_py),
            rpath=("$ORIGIN/torch/lib",)
            if rpath_status in (patches.APPLIED, patches.ALREADY)
            else (),
            site_dir=torch["site"],
            cxx11_abi=torch["cxx11_abi"],
            hardening=wheelcheck.hardening_asked(setup_py),
            interpreter_files=tuple(torch["interpreter"]),
            cuda=cuda,
            through_needed=cuda is not None,
        )

    def _torch_facts(self, venv: venvs.Venv) -> dict:
        """The build venv's torch (lib/ and site folders, C++ ABI, torch_npu's lib/, the interpreter's files, its CUDA
        release): probed by importing torch (seconds), once per venv -- kept beside its ready marker, which a recreated
        venv loses."""
        kept = venv.path / "apexkit-torch-facts.json"
        with contextlib.suppress(OSError, ValueError):
            facts = json.loads(kept.read_text())
            if isinstance(facts, dict) and {
                "lib",
                "site",
                "cxx11_abi",
                "npu_lib",
                "interpreter",
                "cuda",
            } <= set(facts):
                return facts
        proc = subprocess.run(
            [str(venv.python), str(TORCH_FACTS), "build"],
            capture_output=True,
            text=True,
            env=self.env,
        )
        if proc.returncode != 0:
            raise BuildError(
                f"the build venv's torch cannot be imported: "
                f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}",
                f"see {self.log_path}",
            )
        facts = None  # the last JSON line: torch may print after it (at exit)
        for line in reversed(proc.stdout.splitlines()):
            with contextlib.suppress(ValueError):
                facts = json.loads(line)
                break
        if not isinstance(facts, dict):
            raise BuildError(
                "the build venv's torch cannot be imported: no JSON answer from its probe",
                f"see {self.log_path}",
            )
        with contextlib.suppress(OSError, ApexkitError):  # not kept: the next build probes again
            fsedit.atomic_write(kept, json.dumps(facts).encode(), 0o644)
        return facts

    def _binary_checks(
        self,
        plan: buildplan.Plan,
        venv: venvs.Venv,
        tree: Path,
        wheel: Path,
        results: list[patches.PatchResult],
    ) -> dict:
        """The wheel's identity and its modules' ELF facts (apexkit.wheel.wheelcheck). A failure stops the build before
        anything is published, one line naming the file and the check; a diagnosis build (--skip-patch) keeps its
        wheel, with the failures printed and recorded in its manifest."""
        with log.step(
            "binary checks (identity, ELF machine, NEEDED, RPATH, symbols, C++ ABI, hardening"
            + (", GPU code)" if plan.backend == "cuda" else ")"),
            self.state.timings,
            key="binary_checks",
        ) as s:
            expect = self.expectations(plan, venv, tree, results)
            env = identity_env(plan)
            report = wheelcheck.check_wheel(
                wheel,
                expect,
                version=plan.target.version,
                # NVIDIA apex declares its own requirements (packaging>20.6): ours must be among them
                requires=None if plan.backend == "cuda" else env["APEXKIT_REQUIRES"].split(),
            )
            if plan.backend == "cuda":
                pins = env["APEXKIT_REQUIRES"].split()
                missing = [r for r in pins if r not in report["requires_dist"]]
                if missing:
                    report["failures"].insert(
                        0,
                        f"{wheel.name}: identity: Requires-Dist {', '.join(report['requires_dist']) or '(none)'} "
                        f"lacks {', '.join(missing)}",
                    )
            _log_modules(report["modules"])
            report["platform"] = wheelcheck.platform_tag(wheel, plan.arch)
            self._checks_verdict(report)
            s.note(_checks_note(report))
            if not report["platform"].get("computed"):
                log.info(f"  manylinux tag not computed: {report['platform']['why']}")
            return report

    def _checks_verdict(self, report: dict) -> None:
        """The report into the build log; BuildError on the first failure, except in a diagnosis build (--skip-patch,
        --sanitize), which keeps its wheel and warns."""
        failures = report["failures"]
        with appending(self.log_path) as fh:
            fh.write(
                "binary checks:\n"
                + "".join(f"  FAIL {f}\n" for f in failures)
                + json.dumps(report, indent=1)
                + "\n"
            )
        if failures and not (self.opts.skip_patches or self.opts.sanitize):
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise BuildError(
                f"binary check failed: {failures[0]}{more}; nothing was published",
                f"every failure is in {self.log_path}; compare with the ref's setup.py flags",
            )
        for failure in failures:
            log.warn(
                f"binary check (diagnosis build, {'--sanitize' if self.opts.sanitize else '--skip-patch'}): {failure}"
            )

    def _retag(self, plan: buildplan.Plan, venv: venvs.Venv, wheel: Path, checks: dict) -> Path:
        """The wheel file named with the manylinux tag the binary checks computed (apexkit.wheel.wheelcheck.retag: `wheel
        tags` in the build venv, bytes reproducible), before the smoke test, the cache and dist/ see it; it keeps
        linux_<arch> when no tag was computed (auditwheel needs Python >= 3.10 on the host), and checks["platform"]
        says which and why (wheel_tag, retagged_from / kept_because). A diagnosis build is retagged too: the tag is
        the symbols' evidence, and it keeps sharing its file name with the good build of the same inputs (publish
        refuses two wheels under one name)."""
        platform_report = checks["platform"]
        with log.step("platform tag (wheel tags)", self.state.timings, key="platform_tag") as s:
            try:
                new = wheelcheck.retag(
                    wheel,
                    platform_report,
                    plan.arch,
                    venv.python,
                    self.state.source_epoch,
                    self.env,
                )
            except wheelcheck.RetagError as exc:
                raise BuildError(
                    f"cannot retag the wheel: {exc}; nothing was published",
                    f"see {self.log_path}; report it (apexkit/wheel/wheelcheck.py retag)",
                ) from None
            with appending(self.log_path) as fh:
                fh.write(f"platform tag: {json.dumps(platform_report)}\n")
            s.note(
                f"{wheel.name} -> {new.name}"
                if new != wheel
                else f"{new.name} keeps {platform_report['wheel_tag']}: {platform_report.get('kept_because', 'already')}"
            )
        return new

    def _explain_failure(self, tail: list[str]) -> str | None:
        log.notice("  last lines of the build log:")
        for line in tail[-15:]:
            log.foreign(line, "    ")
        return known_failures.announce(self.log_path.read_text(errors="replace"))

    def _smoke_test(
        self, plan: buildplan.Plan, interp: interpreters.Interpreter, wheel: Path, work: Path
    ) -> dict:
        with log.step(
            "smoke test (fresh venv: install the wheel, import its compiled modules)",
            self.state.timings,
            key="smoke_test",
        ) as s:
            venv_path = work / "smoke-venv"
            try:
                result = self._smoke_run(plan, interp, wheel, venv_path)
            finally:
                shutil.rmtree(venv_path, ignore_errors=True)
            self._smoke_verdict(result)
            for r in result["cpu_tier"].get("results", []):
                log.info(f"  cpu tier {r['status']:<4} {r['name']}: {r['detail']}")
            s.note(
                f"{', '.join(result['modules'])} import; apex: {result['apex']}"
                + (f"; {result['op']}" if result.get("op") else "")
            )
            log.info(f"  checked: {'; '.join(result['checked'])}")
            if result.get("torch_npu"):
                log.info(f"  torch_npu: {result['torch_npu']}")
            if result["needs_cann"]:
                log.info(
                    f"  needs the CANN runtime (not checked here): {'; '.join(result['needs_cann'])}"
                )
            return result

    def _smoke_run(
        self, plan: buildplan.Plan, interp: interpreters.Interpreter, wheel: Path, venv_path: Path
    ) -> dict:
        """The wheel installed with --no-deps beside torch in a fresh venv, its compiled modules imported (a CUDA
        wheel: every one it holds, without a GPU: loading needs no driver), then (Ascend) the CPU tier."""
        cuda = plan.backend == "cuda"
        modules = (
            cudabuild.compiled_modules(wheel)
            if cuda
            else [e for e in plan.extensions if e != "npu_float_status" or plan.torch_npu]
        )
        sanitizer_env = (
            sanitize.runtime_env(self.opts.sanitize, self.env) if self.opts.sanitize else {}
        )
        venv = venvs.create(
            plan.interpreter,
            venv_path,
            self.log_path,
            system_site_packages=self.opts.use_system_torch,
            index=self.index,
        )
        if self.opts.use_system_torch:
            self._ensure_system_torch_visible(venv, interp)
        else:
            self._install_torch(venv, plan, record=False)
        venvs.pip_install(
            venv, [str(wheel)], self.index, self.log_path, extra=["--no-deps"], record=False
        )
        with tempfile.TemporaryDirectory() as cwd:  # not the tree: import what the wheel installed
            # LD_BIND_NOW: every undefined symbol resolved at import, not at first call; then the CPU tier
            # (bench/cpu_tier.py) in the same interpreter
            proc = subprocess.run(
                [
                    str(venv.python),
                    str(SMOKE_SCRIPT),
                    ",".join(modules),
                    # the CPU tier checks Ascend apex's own extensions (change_data_ptr, ...)
                    *([] if cuda else [str(paths.BENCH / "cpu_tier.py")]),
                ],
                cwd=cwd,
                capture_output=True,
                text=True,
                env=dict(self.env, LD_BIND_NOW="1", **sanitizer_env),
            )
        if self.opts.sanitize:
            found = sanitize.finding(proc.stderr)
            with appending(self.log_path) as fh:
                fh.write(f"sanitizer run ({sanitizer_env['LD_PRELOAD']}):\n{proc.stderr}\n")
            if found:
                raise SmokeTestError(
                    f"sanitizer finding in the smoke test / CPU tier: {found}",
                    f"the whole report is in {self.log_path}",
                )
        marked = [line for line in proc.stdout.splitlines() if line.startswith(SMOKE_MARK)]
        if not marked:
            raise SmokeTestError(
                f"smoke test crashed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}",
                f"see {self.log_path}",
            )
        result = json.loads(marked[0][len(SMOKE_MARK) :])
        result["cpu_tier"] = (
            {"skipped": "the CPU tier checks Ascend apex's extensions"}
            if cuda
            else self._cpu_tier(proc)
        )
        return result

    def _smoke_verdict(self, result: dict) -> None:
        """SmokeTestError for the first module that does not import, else for the CPU tier's first failure."""
        failed = {k: v["error"] for k, v in result["modules"].items() if not v["ok"]}
        if failed:
            name, err = next(iter(failed.items()))
            hint = (
                known_failures.announce(err)
                or "check the link flags (readelf -d) and the torch version"
            )
            raise SmokeTestError(
                f"the wheel installs but {name} does not import in a fresh venv: {err}",
                f"see {self.log_path}; {hint}",
            )
        tier = result["cpu_tier"]
        failed_tier = [r for r in tier.get("results", []) if r["status"] == "fail"]
        if failed_tier or tier.get("error"):
            what = (
                f"{failed_tier[0]['name']}: {failed_tier[0]['detail']}"
                if failed_tier
                else tier["error"]
            )
            raise SmokeTestError(
                f"the CPU test tier failed in the clean venv: {what}", f"see {self.log_path}"
            )

    def _cpu_tier(self, proc: subprocess.CompletedProcess) -> dict:
        """bench/cpu_tier.py's report, run after the smoke script in its interpreter (the smoke venv: the wheel,
        torch, nothing else): change_data_ptr round trip, flatten/unflatten against torch, byte-compiling apex, the
        Python side as far as it imports without CANN. Its output goes to the build log."""
        lines = [
            line for line in proc.stdout.strip().splitlines() if not line.startswith(SMOKE_MARK)
        ]
        with appending(self.log_path) as fh:
            fh.write(f"cpu tier (exit {proc.returncode}):\n{proc.stderr}{chr(10).join(lines)}\n")
        try:
            return json.loads(lines[-1])
        except (ValueError, IndexError):
            return {
                "error": f"bench/cpu_tier.py crashed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}"
            }

    def _manifest(
        self,
        plan: buildplan.Plan,
        ascend: sources.AscendSource | None,
        nvidia_sha: str,
        results: list[patches.PatchResult],
        wheel: Path,
        venv: venvs.Venv,
        key: str,
        smoke: dict,
        checks: dict,
    ) -> dict:
        """manifest.json of a fresh build, whole: what was built from what, how, and what its checks found (a cache
        hit republishes its entry's manifest; `_publish` adds the publish step's time to durations_s)."""
        opts = self.opts
        packages = venvs.freeze(venv)
        return {
            "apexkit": apexkit.__version__,
            "target": asdict(plan),
            "sources": {
                **(
                    {
                        "ascend_apex": {
                            "origin": log.mask(ascend.origin),
                            "ref": plan.apex_ref,
                            "commit": ascend.commit,
                        }
                    }
                    if ascend is not None
                    else {}
                ),
                "nvidia_apex": {
                    "url": log.mask(opts.nvidia_apex_url),
                    "commit": nvidia_sha,
                    **({"ref": plan.apex_ref} if ascend is None else {}),
                },
            },
            # the index options, wheelhouses and offline flag (passwords masked): validate/bench make the run venv
            # from the same sources (apexkit.venvrun)
            "package_sources": self.index.recorded(),
            "patches": [asdict(r) for r in results],
            "setup_flags": list(plan.flags),
            "tools": {
                "python": plan.interpreter_version,
                "gcc": _first_line([os.environ.get("CXX", "g++").split()[-1], "--version"]),
                "pip": packages.get("pip"),
                "setuptools": packages.get("setuptools"),
                "wheel": packages.get("wheel"),
                "torch": packages.get("torch") or plan.torch,
                "torch_npu": packages.get("torch-npu") or packages.get("torch_npu"),
                "host": f"{platform.system()} {platform.machine()} python {platform.python_version()}",
                # for the provenance (apexkit.wheel.sbom): the binaries that built it, by sha256 (the interpreter through
                # the venv's link to the real binary: plan.interpreter may be a pyenv shim)
                "compiler": sbom.compiler(self.env.get("CXX")),
                "interpreter": sbom.interpreter(str(venv.python)),
                **({"nvcc": self._nvcc_record(plan)} if plan.backend == "cuda" else {}),
            },
            # the build venv's packages for the SBOM and the provenance (apexkit.wheel.sbom), kept with a cached wheel
            "build_venv": sbom.inventory(venv.python, opts.wheelhouses, self.env),
            "wheel": {
                "file": wheel.name,
                "sha256": untrusted.sha256_file(wheel),
                "size": wheel.stat().st_size,
            },
            "cache_key": key,
            "cache_hit": False,
            "source_date_epoch": self.state.source_epoch,
            "smoke_test": smoke,
            # seconds per step that ran, under stable keys (docs/build-bench.md), and ccache's hits for the compile
            "durations_s": self._durations(),
            "ccache": self.state.ccache,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "binary_checks": checks,
            "identity": {
                "version": checks["version"],
                "requires_dist": checks["requires_dist"],
                "max_glibc": checks["max_glibc"],
                "max_glibcxx": checks["max_glibcxx"],
                "manylinux_tag": checks["platform"].get("tag"),
            },
        }

    def _nvcc_record(self, plan: buildplan.Plan) -> dict:
        """The CUDA toolkit of a CUDA build, for the manifest, SBOM and provenance."""
        assert self.kit is not None
        found, home = self.kit.found()
        nvcc = str(found.path)
        return {
            "path": nvcc,
            "version": found.version,
            "cuda_home": str(home),
            **({"wheels": list(self.kit.wheels)} if self.kit.wheels else {}),
            "sha256": sbom.interpreter(nvcc)["sha256"],
            "torch_cuda": plan.torch_cuda,
            "arch_list": plan.cuda_arch,
        }

    def _durations(self, **more: float) -> dict[str, float]:
        """Seconds per step that ran (and `more`), and the total since the build started: the steps' sum <= total."""
        return dict(
            self.state.timings, **more, total=round(time.monotonic() - self.state.started, 3)
        )

    def _team_index_hit(
        self,
        key: str,
        plan: buildplan.Plan,
        interp: interpreters.Interpreter,
        work: Path,
    ) -> tuple[CachedWheel, str] | None:
        """After a local miss: the team index's wheel for `key` (downloaded and verified by the lookup), kept in the
        local cache and read back from it like a local hit, with where it came from (password masked); None when no
        index has it, or after one warning line when it could not be had or does not fit (then it compiles)."""
        assert self.remote is not None
        landing = work / "team-index"
        shutil.rmtree(landing, ignore_errors=True)
        landing.mkdir(parents=True)
        try:
            with log.step("ask the team index", self.state.timings, key="team_index") as s:
                try:
                    hit = self.remote(key, landing)
                except (
                    SourceError
                ) as exc:  # TLS or credentials refused: the user's to fix, unless told to go on
                    if not self.opts.team_index_fallback:
                        raise
                    log.warn(f"{exc.format()} (--team-index-fallback: compiling)")
                    s.note("failed")
                    return None
                # the lookup says its own causes in one line; anything else it raises must not stop the build
                except Exception as exc:
                    log.warn(
                        f"team index lookup failed ({type(exc).__name__}: "
                        f"{log.sanitise(log.mask(str(exc)))[:200]}): compiling"
                    )
                    s.note("failed")
                    return None
                if hit is None:
                    s.note(f"no wheel for cache key {key[:12]}")
                    return None
                source = log.sanitise(log.mask(hit.source))
                why = _unfit(hit.wheel.name, plan, interp)
                if why:
                    log.warn(
                        f"team index {source}: {untrusted.shown(hit.wheel.name)} {why}: compiling"
                    )
                    s.note("refused")
                    return None
                cached = self.cache.adopt(key, hit, work)
                s.note(f"{hit.wheel.name} from {source}" if cached else "refused")
            return (cached, source) if cached is not None else None
        finally:
            shutil.rmtree(landing, ignore_errors=True)

    def _publish_cached(
        self,
        plan: buildplan.Plan,
        cached: CachedWheel,
        interp: interpreters.Interpreter,
        work: Path,
        source: str | None = None,
    ) -> Path:
        """dist/<target> from a cache hit: the local cache's entry, or (`source`: the team index it came from,
        password masked) a wheel the team index had, now kept in the local cache too."""
        wheel, old, documents = cached
        manifest = dict(old)
        manifest["cache_hit"] = True
        manifest.pop("cache_source", None)
        if source:
            manifest["cache_source"] = source
        manifest["built"] = old.get("created")
        manifest["target"] = asdict(plan)  # this build's plan (same inputs, by the cache key)
        # this run's index options, not the cached build's: the run venv is made from what this node can reach
        manifest["package_sources"] = self.index.recorded()
        log.info(
            f"✓ wheel cache hit{f' from {source}' if source else ''}: {wheel.name} sha256 "
            f"{old['wheel']['sha256'][:12]} (built {old.get('created')}); "
            + (
                "sha256, provenance and SBOM verified, kept in the local cache, re-hashed and zip-checked"
                if source
                else "re-hashed and zip-checked"
            )
            + ", no compile (--no-cache forces a build)"
        )
        if self.opts.test_cached and self.opts.smoke_test:
            manifest["smoke_test"] = self._smoke_test(plan, interp, wheel, work)
            manifest["smoke_test"]["on_cache_hit"] = True
        # durations_s: the steps this run ran (no venv, no compile); the build's own, and its ccache figures, kept
        manifest["built_durations_s"], manifest["built_ccache"] = (
            old.get("durations_s"),
            old.get("ccache"),
        )
        manifest["ccache"] = None
        manifest["durations_s"] = self._durations()
        manifest["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            return self._publish(plan, wheel, manifest, documents)
        finally:
            shutil.rmtree(wheel.parent, ignore_errors=True)

    def _publish(
        self,
        plan: buildplan.Plan,
        wheel: Path,
        manifest: dict,
        documents: dict[str, bytes] | None = None,
    ) -> Path:
        """dist/<target>: the wheel, manifest, SBOM and provenance -- `documents` when a cache hit brings the build's
        own (manifest["attestations"] records them), else written now and kept in the cache entry for the next hit."""
        with log.step(
            f"publish (dist/{plan.target_id}: wheel, manifest, SBOM, provenance)",
            self.state.timings,
            key="publish",
        ) as s:
            begun = time.monotonic()
            files: dict[str, Path | bytes] = (
                {wheel.name: wheel, **documents}
                if documents
                else with_documents({wheel.name: wheel}, manifest)
            )
            # publish: the SBOM and provenance up to writing the manifest (the copy and the rename after it take
            # milliseconds); total: since the build started, so the steps' sum stays <= total
            manifest["durations_s"] = self._durations(publish=round(time.monotonic() - begun, 3))
            final = replace_dir(
                self.opts.dist_dir, plan.target_id, files, manifest, self.opts.force
            )
            s.note(
                str(final) + (" (SBOM and provenance from the cache entry)" if documents else "")
            )
        if (
            not documents
            and not manifest.get("cache_hit")
            and self.state.use_cache
            and self.state.cache_key
        ):
            self.cache.attach(
                self.state.cache_key,
                {k: v for k, v in files.items() if isinstance(v, bytes)},
                manifest,
            )
        log.result(f"✓ {final / wheel.name}")
        log.info(
            f"  sha256 {manifest['wheel']['sha256']}  ({manifest['wheel']['size'] / 1024:.0f} KiB, "
            f"total {log.format_seconds(manifest['durations_s']['total'])})"
        )
        log.info(
            "  steps: "
            + ", ".join(
                f"{k} {log.format_seconds(v)}"
                for k, v in manifest["durations_s"].items()
                if k != "total"
            )
            + (f"; {ccachestats.describe(manifest['ccache'])}" if manifest.get("ccache") else "")
        )
        log.info(f"  manifest: {final / 'manifest.json'}")
        written = [
            a["file"]
            for a in (manifest["attestations"].get(k) for k in ("sbom", "provenance"))
            if a
        ]
        log.info(f"  sbom/provenance: {', '.join(str(final / f) for f in written)} (unsigned)")
        if manifest["attestations"].get("sbom_missing"):
            if self.env.get(
                sbom.BY_HOST
            ):  # in a builder container: the host writes them from this manifest
                log.info(
                    "  the host writes the SBOM and the provenance (with the builder image's id)"
                )
            else:
                log.warn(f"no SBOM written: {manifest['attestations']['sbom_missing']}")
        log.info(f"  install:  {install_venv_command(self.opts.team_indexes)}")
        log.info(f"            or {install_command(plan, final / wheel.name)}")
        grown = cachedirs.grown_past(self.opts.cache_dir, self.env)
        if grown:
            log.warn(grown)
        return final


def install_venv_command(team_indexes: Sequence[str]) -> str:
    """How a training venv gets this wheel: apexkit install (it finds the wheel just built in the cache, checks the
    venv's torch, glibc and ABI and installs without touching torch), from the team index when one is configured."""
    where = "".join(f" --index {shlex.quote(log.mask(i))}" for i in team_indexes)
    return f"{vocab.command('install', '--venv VENV' + where)}   (the training venv: torch stays as it is)"


def install_command(plan: buildplan.Plan, wheel: Path) -> str:
    """The pip command that installs this wheel where it belongs: next to the torch (+ torch_npu) it was built
    against (the wheel's METADATA pins them too, so pip refuses another)."""
    if plan.torch_build.startswith("the interpreter's own torch"):
        return f"pip install {shlex.quote(str(wheel))}   (into the interpreter that has torch {plan.torch})"
    pins = [f"torch=={plan.torch.split('+')[0]}"] + (
        [f"torch_npu=={plan.torch_npu}"] if plan.torch_npu else []
    )
    return f"pip install {' '.join(pins)} {shlex.quote(str(wheel))}"


def identity_env(plan: buildplan.Plan) -> dict[str, str]:
    """What the version patches read: the local label and the Requires-Dist pins of this build (plan/target.py)."""
    t = plan.target
    return {
        "APEXKIT_VERSION_LABEL": t.label,
        "APEXKIT_REQUIRES": " ".join(t.requires(plan.needs_npu_headers)),
    }


LINKED_VENV = ".apexkit-build-venv"


def _linked_venv(venv: venvs.Venv, tree: Path) -> venvs.Venv:
    """The build venv as <tree>/.apexkit-build-venv, a link to it that setup.py runs through: Python keeps the link
    in sys.prefix, so torch's headers have the same path inside the tree in every build directory, cache directory
    and home (the venv itself lives in the apexkit cache). In the tree, which this build made, not beside it: the
    build folder holds no link (cachetrust.trusted_output); setuptools finds no package under a dotted name."""
    link = tree / LINKED_VENV
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.exists():
        shutil.rmtree(link)
    link.symlink_to(venv.path, target_is_directory=True)
    return venvs.Venv(link)


def reproducible_env(epoch: int, tree: Path, venv: Path, linked: Path, env) -> dict[str, str]:
    """Same inputs, same bytes, and one ccache entry whichever build directory, cache directory or host a build
    runs in.

    The tree and the build venv differ per build directory/cache; their paths reach the objects through __FILE__
    (torch's headers use it in checks) and debug info, so both are mapped to fixed names -- for the host compiler
    (CFLAGS/CXXFLAGS) and for the host side of nvcc's compiles (NVCC_APPEND_FLAGS, which nvcc reads itself).
    setup.py runs through `linked` (<tree>/.apexkit-build-venv: `_linked_venv`), so every include path is in the
    tree: ccache hashes those paths relative to the compile's folder (CCACHE_BASEDIR, the tree: it hands the
    compiler those relative paths too, so a ccache build's bytes differ from an APEXKIT_CCACHE=0 one's, and each is
    reproducible) and leaves that folder out of the hash (CCACHE_NOHASHDIR: the maps above keep it out of the
    objects): a second build directory, a second host (another home, another APEXKIT_CACHE_DIR) or a
    --verify-reproducible run hits the first one's objects. A CCACHE_BASEDIR set by the user
    stays."""
    maps = [
        f"-ffile-prefix-map={tree}=/apex",
        f"-ffile-prefix-map={linked}=/venv",
        f"-ffile-prefix-map={venv}=/venv",
    ]
    out = {
        "SOURCE_DATE_EPOCH": str(epoch),
        "CCACHE_BASEDIR": env.get("CCACHE_BASEDIR") or str(tree),
        "CCACHE_NOHASHDIR": env.get("CCACHE_NOHASHDIR", "1"),
        "NVCC_APPEND_FLAGS": " ".join(
            [env.get("NVCC_APPEND_FLAGS", ""), *(f"-Xcompiler={m}" for m in maps)]
        ).strip(),
    }
    for var in ("CFLAGS", "CXXFLAGS"):
        out[var] = " ".join([env.get(var, ""), *maps]).strip()
    return out


def _unfit(filename: str, plan: buildplan.Plan, interp: interpreters.Interpreter) -> str | None:
    """Why a wheel from the team index does not install on the interpreter this build is for (None when it does).
    The cache key names the wheel's inputs, not the machine that compiled them: a wheel built on a newer glibc has
    the same key, and a manylinux tag above this host's glibc would not load here."""
    from packaging import tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        wheel_tags = parse_wheel_filename(filename)[3]
    except (InvalidWheelFilename, InvalidVersion):
        return "is not a wheel filename"
    major, minor = (int(p) for p in plan.interpreter_version.split(".")[:2])
    here = set(tags.cpython_tags((major, minor), platforms=list(tags.platform_tags())))
    if any(t in here and t.platform.endswith(plan.arch) for t in wheel_tags):
        return None
    shown = ", ".join(sorted(str(t) for t in wheel_tags))[:200]
    return (
        f"is tagged {shown}, which python{plan.python} ({plan.arch}) on this host cannot install "
        "(built for another Python, arch or a newer glibc)"
    )


def _first_line(argv) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return out.stdout.splitlines()[0] if out.stdout else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _first_error(tail: list[str]) -> str:
    for line in tail:
        if "error" in line.lower() and ("error:" in line or "Error" in line):
            return line.strip()[:200]
    return (tail[-1] if tail else "no output").strip()[:200]


_COMPILE_RE = re.compile(r"\s-c\s+(\S+\.(?:cpp|cxx|cc|cu|c))(?:\s|$)")


def _compile_progress(line: str) -> str | None:
    m = _COMPILE_RE.search(line)
    if m:
        return f"compiling {Path(m.group(1)).name}"
    if line.startswith(("creating '", "adding '")):
        return "packing the wheel"
    return None


def build(opts: BuildOptions, remote: RemoteLookup | None = None) -> Path:
    """Build the wheel `opts` describe on this machine and return dist/<target-id>/. `--image` never reaches here:
    the command edge (apexkit.commands.build_wheel) hands those options to apexkit.images.container instead.
    `remote`: the team index as the cache after the local one (the edge makes it from opts.team_indexes)."""
    if opts.image:
        raise ConfigError(
            "a build for an image reached the host build",
            "report this: the command edge dispatches --image",
        )
    if opts.verify_reproducible and not opts.dry_run:
        return verify_reproducible(opts)
    return Builder(opts, remote=remote).run()


def _log_modules(modules: list[dict]) -> None:
    """Each checked module's ELF facts, one line, then its notes and its GPU code."""
    for module in modules:
        log.info(
            f"  {module['file']}: {module['machine']}, NEEDED {', '.join(module['needed'])}; RPATH "
            f"{':'.join(module['rpath']) or '(none)'}; {module['glibc']}, {module['glibcxx']}"
        )
        for note in module["notes"]:
            log.info(f"    {note}")
        if module.get("cuda"):
            log.info(f"    GPU code: {module['cuda']}")


def _checks_note(report: dict) -> str:
    """The binary checks' step note: the identity, then the failures kept or what passed and the tag."""
    platform_tag = report["platform"]
    passed = (
        f"{len(report['modules'])} module(s) pass; max {report['max_glibc']}, {report['max_glibcxx']}"
        + (f" -> {platform_tag['tag']}" if platform_tag.get("computed") else "")
    )
    return f"{report['version']}; requires {', '.join(report['requires_dist']) or 'nothing'}; " + (
        f"{len(report['failures'])} failure(s) kept for diagnosis" if report["failures"] else passed
    )


def verify_reproducible(opts: BuildOptions) -> Path:
    """Build twice from the same inputs in two build directories, without the wheel cache; publish only when both
    wheels are byte-identical (manifest: reproducible.verified)."""
    import dataclasses
    import zipfile

    runs = []
    with tempfile.TemporaryDirectory(
        prefix=".reproducible-", dir=cachetrust.trusted_output(opts.build_dir, paths.BUILD_SETTING)
    ) as tmp:
        for name in ("a", "b"):
            log.info(
                f"▸ reproducibility build {name}/2 in {opts.build_dir / f'reproducible-{name}'}"
            )
            one = dataclasses.replace(
                opts,
                use_cache=False,
                verify_reproducible=False,
                dist_dir=Path(tmp) / name,
                build_dir=opts.build_dir / f"reproducible-{name}",
                smoke_test=opts.smoke_test and name == "a",
            )
            runs.append(Builder(one).run())
        (a_dir, b_dir) = runs
        manifest = json.loads((a_dir / "manifest.json").read_text())
        a_wheel, b_wheel = a_dir / manifest["wheel"]["file"], next(b_dir.glob("*.whl"))
        a_sha, b_sha = untrusted.sha256_file(a_wheel), untrusted.sha256_file(b_wheel)
        if a_sha != b_sha:
            with zipfile.ZipFile(a_wheel) as za, zipfile.ZipFile(b_wheel) as zb:
                a_info, b_info = (
                    {i.filename: i for i in za.infolist()},
                    {i.filename: i for i in zb.infolist()},
                )
                differ = sorted(
                    n
                    for n in set(a_info) | set(b_info)
                    if n not in a_info
                    or n not in b_info
                    or za.read(n) != zb.read(n)
                    or a_info[n].date_time != b_info[n].date_time
                )
            raise BuildError(
                f"not reproducible: {a_wheel.name} sha256 {a_sha[:12]} vs {b_sha[:12]}; differing members: "
                f"{', '.join(differ[:6]) or 'zip metadata only'}",
                f"compare {opts.build_dir / 'reproducible-a'} and {opts.build_dir / 'reproducible-b'}",
            )
        manifest["reproducible"] = {"verified": True, "builds": 2, "sha256": a_sha}
        final = replace_dir(
            opts.dist_dir, a_dir.name, {a_wheel.name: a_wheel}, manifest, opts.force
        )
    log.result(f"✓ reproducible: two builds, one sha256 {a_sha}")
    log.result(f"✓ {final / a_wheel.name}")
    return final
