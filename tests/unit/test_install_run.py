"""apexkit install's flow, in process: the probe, the index and pip replaced by recorders (tests/e2e runs them for
real). What is asserted is what reaches pip (nothing, on every fault) and the one line each fault gives."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import threading
from pathlib import Path

import pytest

from apexkit import locks
from apexkit.index import publish, remote
from apexkit.install import fit, run, target

from .test_install_fit import make_wheel
from .test_install_target import parsed


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A venv directory, a probe answering `world.probes` in turn, an index of `world.candidates`, pip recorded."""
    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(tmp_path / "cache"))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "bin" / "python").chmod(0o755)

    @dataclasses.dataclass
    class World:
        venv: Path
        wheel: Path
        pip: list[list[str]] = dataclasses.field(default_factory=list)
        probes: list[target.Target] = dataclasses.field(default_factory=lambda: [parsed()])
        candidates: list[remote.Candidate] = dataclasses.field(default_factory=list)
        near: list[str] = dataclasses.field(default_factory=list)
        fetch_error: Exception | None = None
        report: object = dataclasses.field(default_factory=lambda: report_of(("packaging", "25.0")))

    w = World(venv, make_wheel(tmp_path))

    def probe(python, named, environ=None, versions_only=False):
        return w.probes.pop(0) if len(w.probes) > 1 else w.probes[0]

    def fetch(client, candidate, work, trusted=None, fits=None):
        if w.fetch_error:
            raise w.fetch_error
        return remote.RemoteHit(w.wheel, {}, {}, candidate.shown), None

    monkeypatch.setattr(target, "probe", probe)
    monkeypatch.setattr(remote, "make_client", lambda indexes, env: object())
    monkeypatch.setattr(
        remote, "find_by_facts", lambda client, indexes, want: (w.candidates, w.near)
    )
    monkeypatch.setattr(remote, "fetch", fetch)

    def pip(t, args, environ, quiet=False, pip_env=False):
        w.pip.append(args)
        if "--constraint" in args:  # what pip is held to: read before the folder is removed
            w.held.append(Path(args[args.index("--constraint") + 1]).read_text())
            w.pip_env.append(pip_env)
        if "--requirement" in args:  # what pip is asked to install, by version and sha256
            w.reqs.append(Path(args[args.index("--requirement") + 1]).read_text())
        if args[0] == "download":  # the files pip would install, read before: none here
            Path(args[args.index("--dest") + 1]).mkdir()
        if "--report" in args:  # what pip says it would install
            Path(args[args.index("--report") + 1]).write_text(json.dumps(w.report))
        if "--find-links" in args:  # what pip would find there: the folder holds only the wheel
            folder = Path(args[args.index("--find-links") + 1])
            w.found.append(sorted(p.name for p in folder.iterdir()))

    w.found, w.held, w.pip_env, w.reqs = [], [], [], []
    monkeypatch.setattr(run, "_pip", pip)
    return w


def report_of(*dists: tuple[str, str], direct: bool = False) -> dict:
    """pip install --dry-run --report's JSON, as pip 22.2+ writes it (the fields apexkit reads)."""
    return {
        "version": "1",
        "install": [
            {
                "is_direct": direct,
                "requested": True,
                "metadata": {"name": n, "version": v},
                "download_info": {
                    "url": f"http://127.0.0.1:9/{n}-{v}-py3-none-any.whl",
                    "archive_info": {"hashes": {"sha256": hashlib.sha256(n.encode()).hexdigest()}},
                },
            }
            for n, v in dists
        ],
    }


def with_dists(t: target.Target, **dists: str) -> target.Target:
    return dataclasses.replace(t, dists={**t.dists, **dists})


def candidate(wheel) -> remote.Candidate:
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    entry = publish.Entry("apex", wheel.name, wheel, sha, "t1", "2.13.0", in_index=True)
    return remote.Candidate("http://u:***@127.0.0.1:9", entry, "x")


def install(w, *, build=None, **options):
    def no_build(*args):
        raise AssertionError("no build expected")

    return run.main(venv=str(w.venv), **options, build=build or no_build, environ={})


def installed_now(w) -> target.Target:
    facts = fit.read_wheel(w.wheel)
    apex = target.Apex(facts.version, True, facts.record, ())
    t = parsed()
    return dataclasses.replace(t, dists={**t.dists, "apex": facts.version}, apex=apex)


def test_a_hit_is_installed_with_the_venvs_pip_no_deps_no_index(world, capsys):
    world.candidates = [candidate(world.wheel)]
    world.probes = [parsed(), installed_now(world)]
    assert install(world, index=["http://u:secret@127.0.0.1:9/"], as_json=True) == 0
    (args,) = world.pip
    assert args[:5] == ["install", "--no-deps", "--no-index", "--force-reinstall", "--find-links"]
    assert args[6:] == [
        "apex==0.1+ascend.torch2.13.0"
    ]  # by name: pip freeze says apex==V afterwards
    assert (
        world.found == [[world.wheel.name]] and not Path(args[5]).exists()
    )  # a private folder, removed
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "status": "installed",
        "wheel": world.wheel.name,
        "sha256": hashlib.sha256(world.wheel.read_bytes()).hexdigest(),
        "source": "http://u:***@127.0.0.1:9",
        "venv": "/work/venv",
        "target": "t1",
        "torch": "2.13.0+cpu",
        "torch_npu": None,
        "added": [],
    }


def _needs_packaging(world, tmp_path, *also: tuple[str, str]) -> None:
    (tmp_path / "cuda").mkdir()
    world.wheel = make_wheel(tmp_path / "cuda", requires=("torch==2.13.0", "packaging>20.6"))
    world.candidates = [candidate(world.wheel)]
    world.report = report_of(("packaging", "25.0"), *also)
    added = dict([("packaging", "25.0"), *also])
    world.probes = [
        parsed(),
        parsed(),
        with_dists(parsed(), **added),
        with_dists(installed_now(world), **added),
    ]  # the start, again before pip adds packaging, after it, the end


def test_a_dependency_the_venv_lacks_is_added_first_everything_installed_held(
    world, tmp_path, capsys
):
    """NVIDIA apex requires packaging>20.6: the venv's pip says what it would install (--dry-run --report), from its
    own index, wheels only, every installed distribution pinned by its exact version (=== : == would admit +cpu)
    and torch_npu / apex kept out; exactly that is installed, --no-deps; then apex alone, --no-deps --no-index."""
    _needs_packaging(world, tmp_path)
    assert install(world, index=["http://u:secret@127.0.0.1:9/"], as_json=True) == 0
    plan, fetch, add, apex = world.pip
    assert plan[:3] == ["install", "--dry-run", "--quiet"] and plan[-1] == "packaging>20.6"
    assert "--only-binary=:all:" in plan and "--only-binary=:all:" in add
    # the files are fetched first, read (files.check_wheel), then installed from that folder alone
    assert fetch[:3] == ["download", "--no-deps", "--require-hashes"]
    assert add[:3] == ["install", "--no-deps", "--require-hashes"] and "--no-index" in add
    sha = hashlib.sha256(b"packaging").hexdigest()
    assert world.reqs == [
        f"packaging===25.0 --hash=sha256:{sha}\n"
    ]  # the very file pip's dry run chose
    assert world.pip_env == [True, True]
    held = world.held[0].splitlines()
    assert "torch===2.13.0+cpu" in held and {"torch-npu<0", "apex<0"} <= set(held)
    assert len(held) == len(parsed().dists) + 2
    assert apex[:3] == ["install", "--no-deps", "--no-index"]
    assert json.loads(capsys.readouterr().out)["added"] == ["packaging==25.0"]


def test_what_an_added_package_requires_is_added_too_and_counted(world, tmp_path, capsys):
    _needs_packaging(world, tmp_path, ("pyparsing", "3.1.0"))
    assert install(world, index=["http://127.0.0.1:9/"], as_json=True) == 0
    assert [line.split()[0] for line in world.reqs[0].splitlines()] == [
        "packaging===25.0",
        "pyparsing===3.1.0",
    ]
    assert json.loads(capsys.readouterr().out)["added"] == ["packaging==25.0", "pyparsing==3.1.0"]


@pytest.mark.parametrize(
    ("report", "why"),
    [
        (
            report_of(*((f"d{i}", "1.0") for i in range(9))),
            "install 9 packages (at most 8 are added)",
        ),
        (
            report_of(("packaging", "25.0"), ("torch-npu", "2.13.0")),
            "install torch-npu 2.13.0, which apexkit",
        ),
        (report_of(("Apex", "0.9")), "install apex 0.9, which apexkit install never adds"),
        (report_of(("numpy", "3.0")), "replace numpy 2.1.0 with 3.0"),
        (report_of(("packaging", "25.0"), direct=True), "install packaging from a URL"),
        (report_of(("packaging", "25-custom")), "not a PEP 440 version"),
        (
            report_of(("x\n--index-url http://127.0.0.1:9/", "1.0")),
            "a package its report does not name",
        ),
        ({"install": "packaging"}, "write no readable report"),
        ([], "write no readable report"),
        (report_of(), "install nothing (the venv still lacks them)"),
        (
            {
                "install": [
                    {
                        **report_of(("packaging", "25.0"))["install"][0],
                        "download_info": {"url": "x"},
                    }
                ]
            },
            "install packaging 25.0 from a file whose sha256 its report does not give",
        ),
    ],
)
def test_what_pip_would_install_is_refused_unless_all_new_few_and_never_torch(
    world, tmp_path, report, why
):
    """The report is the index's word: a dependency of a dependency must not bring torch_npu, replace what the venv
    has, come from a URL, or be many. Refused after pip's dry run: nothing installed."""
    _needs_packaging(world, tmp_path)
    world.report = report
    with pytest.raises(run.InstallError) as err:
        install(world, index=["http://127.0.0.1:9/"])
    assert why in err.value.cause and err.value.cause.endswith("; nothing installed")
    assert [a[:2] for a in world.pip] == [["install", "--dry-run"]]


def test_a_pip_without_report_adds_nothing_and_says_what_to_run(world, tmp_path):
    _needs_packaging(world, tmp_path)
    world.probes = [parsed(pip="21.3.1")]
    with pytest.raises(run.InstallError) as err:
        install(world, index=["http://127.0.0.1:9/"])
    assert "its pip 21.3.1 cannot say what it would install (pip 22.2+)" in err.value.cause
    assert "-m pip install 'pip>=22.2'" in err.value.hint and world.pip == []


def test_anything_else_pip_added_is_taken_back(world, tmp_path):
    _needs_packaging(world, tmp_path)
    sneaked = with_dists(parsed(), packaging="25.0", evil="1.0")
    world.probes = [parsed(), parsed(), sneaked, sneaked]
    with pytest.raises(run.InstallError) as err:
        install(world, index=["http://127.0.0.1:9/"])
    assert "pip added evil==1.0, packaging==25.0, not packaging==25.0" in err.value.cause
    assert err.value.cause.endswith("evil, packaging uninstalled again, nothing installed")
    assert world.pip[-1] == ["uninstall", "--yes", "evil", "packaging"]
    assert not any(a[-1].startswith("apex==") for a in world.pip)


def apex_pip_fails(monkeypatch, why: str) -> None:
    """The recording pip of `world`, failing (with `why`) the install of apex itself."""
    record = run._pip

    def apex_fails(t, args, environ, quiet=False, pip_env=False):
        record(t, args, environ, quiet, pip_env)
        if args[-1].startswith("apex=="):
            raise run.InstallError(f"pip install failed in /work/venv: {why}", "x")

    monkeypatch.setattr(run, "_pip", apex_fails)


def test_apex_failing_after_its_dependencies_takes_them_back(world, tmp_path, monkeypatch):
    _needs_packaging(world, tmp_path)
    added = with_dists(parsed(), packaging="25.0")
    world.probes = [parsed(), parsed(), added, added]
    apex_pip_fails(monkeypatch, "disk full")
    with pytest.raises(run.InstallError) as err:
        install(world, index=["http://127.0.0.1:9/"])
    assert err.value.cause.endswith("disk full; packaging uninstalled again, nothing installed")
    assert world.pip[-1] == ["uninstall", "--yes", "packaging"]


def test_a_version_metadata_spells_otherwise_is_the_version_pip_named(world, tmp_path, capsys):
    """METADATA may say 1.0RC1 where pip's report (and pip) say 1.0rc1: the same version, not another package."""
    _needs_packaging(world, tmp_path)
    world.report = report_of(("packaging", "25.0rc1"))
    world.probes = [
        parsed(),
        parsed(),
        with_dists(parsed(), packaging="25.0RC1"),
        with_dists(installed_now(world), packaging="25.0RC1"),
    ]
    assert install(world, index=["http://127.0.0.1:9/"], as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["added"] == ["packaging==25.0rc1"]


def test_a_failed_apex_install_that_replaced_an_older_apex_says_it_is_gone(world, monkeypatch):
    """pip can install and then fail (pip 26 on a legacy version elsewhere in the venv): the new apex goes, and the
    older one it replaced is named, since it cannot be put back."""
    world.candidates = [candidate(world.wheel)]
    old = dataclasses.replace(
        parsed(), dists={**parsed().dists, "apex": "0.0.9"}, apex=target.Apex("0.0.9", True)
    )
    world.probes = [old, installed_now(world), dataclasses.replace(installed_now(world))]
    apex_pip_fails(monkeypatch, "InvalidVersion: '2004d'")
    with pytest.raises(run.InstallError) as err:
        install(world, index=["http://127.0.0.1:9/"])
    assert err.value.cause.endswith(
        "'2004d'; apex 0.1+ascend.torch2.13.0 uninstalled again; the venv's apex 0.0.9 is gone: install that "
        "again; nothing installed"
    )
    assert world.pip[-1] == ["uninstall", "--yes", "apex"]


def test_pips_first_error_line_is_the_cause_shown(monkeypatch):
    stderr = (
        "ERROR: Cannot install foo4==1.0 because these package versions have conflicting dependencies.\n"
        "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/x\n"
    )
    monkeypatch.setattr(
        run.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", stderr)
    )
    with pytest.raises(run.InstallError) as err:
        run._pip(parsed(), ["install", "foo4"], {})
    assert err.value.cause.endswith(
        "ERROR: Cannot install foo4==1.0 because these package versions have "
        "conflicting dependencies."
    )


def test_a_system_site_packages_base_counts_as_installed_and_is_held(world, tmp_path):
    """pip sees the base's packages too: its packaging meets packaging>20.6 (nothing to add), and what the base
    has is pinned like the venv's own (a venv copy would shadow it)."""
    _needs_packaging(world, tmp_path)
    base = dataclasses.replace(parsed(), visible={"packaging": "24.1", "oldpkg": "1.0-custom"})
    world.probes = [base, dataclasses.replace(installed_now(world), visible=base.visible)]
    assert install(world, index=["http://127.0.0.1:9/"]) == 0
    assert [a[:3] for a in world.pip] == [["install", "--no-deps", "--no-index"]]
    held = run._constraints(base).splitlines()
    assert {"packaging===24.1", "oldpkg===1.0-custom"} <= set(held)  # a legacy version as it is
    shadowed = dataclasses.replace(base, dists={**base.dists, "packaging": "25.0"})
    assert fit.moved(base, shadowed) == ["packaging 24.1 -> 25.0"]


def test_a_dependency_pip_cannot_add_is_one_line_with_a_command_to_paste(
    world, tmp_path, monkeypatch, capsys
):
    _needs_packaging(world, tmp_path)
    world.probes = [parsed(), parsed(), parsed()]  # pip added nothing

    def offline(t, args, environ, quiet=False, pip_env=False):
        world.pip.append(args)
        raise run.InstallError("pip install failed in /work/venv: No matching distribution", "x")

    monkeypatch.setattr(run, "_pip", offline)
    with pytest.raises(run.InstallError) as err:
        install(world, index=["http://127.0.0.1:9/"])
    line = str(err.value)
    assert "nothing installed" in line and len(world.pip) == 1  # apex itself never reached pip
    assert "-m pip install 'packaging>20.6' torch==2.13.0+cpu)" in line  # quoted, torch held


def test_a_dependency_install_takes_the_users_index_but_nothing_that_changes_the_install(
    monkeypatch,
):
    seen = {}

    argv_seen = []

    def fake_run(argv, **kwargs):
        argv_seen.append(argv)
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    user = {
        "PATH": "/usr/bin",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_UPGRADE": "1",
        "PIP_TARGET": "/tmp/elsewhere",
        "PIP_REQUIREMENT": "evil.txt",
        "PIP_NO_BINARY": ":all:",
    }
    user.update(
        PYTHONPATH="/usr/lib/python3/dist-packages", PYTHONHOME="/usr", PYTHONUSERBASE="/tmp/u"
    )
    run._pip(parsed(), ["install", "x"], user, pip_env=True)
    assert seen["PIP_INDEX_URL"] == "http://127.0.0.1:9/simple" and seen["PIP_UPGRADE"] == "0"
    assert not {"PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE"} & set(
        seen
    )  # pip sees what the probe saw
    assert argv_seen[-1][1:4] == ["-s", "-m", "pip"]
    assert not {"PIP_TARGET", "PIP_REQUIREMENT", "PIP_NO_BINARY"} & set(seen)
    seen.clear()
    run._pip(parsed(), ["install", "x"], user)  # apex itself: no PIP_* of the user at all
    assert not {k for k in seen if k.startswith("PIP_")} - {
        "PIP_DISABLE_PIP_VERSION_CHECK",
        "PIP_NO_INPUT",
    }


def test_the_same_wheel_installed_is_left_alone(world, capsys):
    world.candidates = [candidate(world.wheel)]
    world.probes = [installed_now(world)]
    assert install(world, index=[str(world.venv)]) == 0
    assert world.pip == [] and "already installed" in capsys.readouterr().out


def test_a_refused_wheel_installs_nothing(world):
    world.candidates = [candidate(world.wheel)]
    world.fetch_error = remote.Refused(
        "apex-...whl does not match the sha256 its index.json records"
    )
    with pytest.raises(run.InstallError) as err:
        install(world, index=[str(world.venv)], no_build=False)
    assert "refused" in err.value.cause and "nothing installed" in err.value.cause
    assert world.pip == []


def test_an_index_whose_wheel_lies_about_the_tuple_installs_nothing(world, tmp_path):
    (tmp_path / "lie").mkdir()
    world.wheel = make_wheel(tmp_path / "lie", requires=("torch==2.12.0",))
    world.candidates = [candidate(world.wheel)]
    with pytest.raises(run.InstallError) as err:
        install(world, index=[str(world.venv)])
    assert "does not fit" in err.value.cause and "torch==2.12.0" in err.value.cause
    assert world.pip == []


def test_a_miss_with_no_build_names_the_cell(world):
    world.near = [
        "apex-x.whl (i): tagged cp310-cp310-linux_x86_64, which the venv does not install"
    ]
    with pytest.raises(run.InstallError) as err:
        install(world, index=[str(world.venv)], no_build=True)
    assert (
        "no wheel fits" in err.value.cause
        and "cp311" in err.value.cause
        and "torch 2.13.0+cpu" in err.value.cause
    )
    assert "drop --no-build" in err.value.hint and world.pip == []


def test_an_unreachable_hit_falls_back_to_a_build_for_the_venvs_torch(world, tmp_path):
    world.candidates = [candidate(world.wheel)]
    world.fetch_error = remote.Unreachable("timed out")
    dist = tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master"
    dist.mkdir(parents=True)
    wheel = make_wheel(dist)
    manifest = {
        "wheel": {"file": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
    }
    (dist / "manifest.json").write_text(json.dumps(manifest))
    world.wheel = wheel
    base = tmp_path / "base-python3.11"
    base.write_text("")
    world.probes = [parsed(base_executable=str(base)), installed_now(world)]
    calls = []

    def build(python, argv, prog):
        calls.append((python, argv))
        return dist

    assert install(world, index=[str(world.venv)], build=build, as_json=False) == 0
    assert calls == [
        ("3.11", ["--torch", "2.13.0", "--interpreter", str(base)])
    ]  # the venv's base Python
    assert world.pip[0][-1] == "apex==0.1+ascend.torch2.13.0" and world.found == [[wheel.name]]


def test_a_built_wheel_that_does_not_match_its_manifest_is_not_installed(world, tmp_path):
    dist = tmp_path / "dist" / "t"
    dist.mkdir(parents=True)
    wheel = make_wheel(dist)
    (dist / "manifest.json").write_text(
        json.dumps({"wheel": {"file": wheel.name, "sha256": "0" * 64}})
    )
    with pytest.raises(run.InstallError, match="does not match its manifest"):
        install(world, build=lambda *a: dist)
    assert world.pip == []


def test_a_torch_with_no_pairing_in_the_matrix_is_named_before_a_build(world):
    world.probes = [parsed(torch={"version": "2.5.0", "cxx11_abi": 0}, dists={"torch": "2.5.0"})]
    with pytest.raises(run.InstallError) as err:
        install(world)
    assert "torch 2.5.0" in err.value.cause and "2.5.1/2.5.1.post1" in err.value.cause


def test_a_failed_check_after_the_install_uninstalls_again(world):
    world.candidates = [candidate(world.wheel)]
    changed = installed_now(world)
    world.probes = [
        parsed(),
        dataclasses.replace(changed, dists={**changed.dists, "torch": "2.14.1"}),
    ]
    with pytest.raises(run.InstallError) as err:
        install(world, index=[str(world.venv)])
    assert (
        "torch 2.13.0+cpu -> 2.14.1" in err.value.cause and "uninstalled again" in err.value.cause
    )
    assert world.pip[-1] == ["uninstall", "--yes", "apex"]


def test_dry_run_says_what_and_changes_nothing(world, capsys):
    world.candidates = [candidate(world.wheel)]
    assert install(world, index=[str(world.venv)], dry_run=True, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "would-install"
    world.candidates = []
    assert install(world, dry_run=True, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "would-build"
    assert world.pip == []


def _entry_pins(world, *pins: str) -> None:
    c = candidate(world.wheel)
    world.candidates = [
        dataclasses.replace(
            c, entry=dataclasses.replace(c.entry, facts={"requires_dist": list(pins)})
        )
    ]


def test_a_dry_run_lists_what_it_would_add_by_the_index_entry(world, capsys):
    _entry_pins(world, "torch==2.13.0", "packaging>20.6")
    assert install(world, index=["http://127.0.0.1:9/"], dry_run=True, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["status"], out["added"]) == ("would-install", ["packaging>20.6"])
    assert install(world, index=["http://127.0.0.1:9/"], dry_run=True) == 0
    assert "; would add packaging>20.6" in capsys.readouterr().out
    assert world.pip == []


@pytest.mark.parametrize("pins", ["torch==2.13.0", {"torch==2.13.0": 1}, [1]])
def test_pins_that_are_not_a_list_of_strings_never_reach_a_dry_run(world, pins, capsys):
    """An index entry is read once (publish.read_entry): one whose requires_dist is not a list of plain pins is left
    out with one line, so neither a dry run nor a real one takes it."""
    raw = {
        "filename": world.wheel.name,
        "project": "apex",
        "sha256": "a" * 64,
        "facts": {"requires_dist": pins},
    }
    assert remote._entry(raw, 0, "team index i") is None
    assert "an entry is left out (files[0].facts.requires_dist" in capsys.readouterr().err


def test_a_dry_run_stops_where_the_real_run_would_on_a_pin_the_venv_cannot_meet(world):
    _entry_pins(world, "torch==2.13.0", "packaging @ file:///etc/passwd")
    with pytest.raises(run.InstallError) as err:
        install(world, index=["http://127.0.0.1:9/"], dry_run=True)
    assert "(by its index entry); nothing would be installed" in err.value.cause
    assert "packaging" in err.value.cause and world.pip == []


def test_a_second_install_into_the_same_venv_is_refused_at_once(world):
    held, release = threading.Event(), threading.Event()

    def other_install():  # another thread waits (or is refused) like another process
        with locks.hold(run._lock_path(str(world.venv / "bin" / "python")), "another"):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=other_install)
    holder.start()
    held.wait(10)
    try:
        with pytest.raises(run.InstallError) as err:
            install(world)
    finally:
        release.set()
        holder.join()
    assert err.value.cause.startswith(
        f"another apexkit install into --venv {world.venv} is running"
    )
    assert world.pip == []


def test_an_index_that_is_neither_url_nor_directory_is_one_line(world):
    with pytest.raises(run.ConfigError, match="neither a URL nor a directory"):
        install(world, index=["not-here"])
    with pytest.raises(run.ConfigError, match="ftp://"):
        install(world, index=["ftp://u:pw@host/x"])


def test_a_failure_with_json_is_one_object_on_stdout(world, capsys):
    """Review F4: `--json` prints one object on stdout when the install fails too: status, error, hint."""
    with pytest.raises(run.InstallError) as err:
        install(world, no_build=True, as_json=True)
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "failed" and out["error"] == err.value.cause
    assert out["hint"] == err.value.hint and out["exit_code"] == 1
    assert out["venv"] == str(world.venv)


@pytest.mark.parametrize(
    ("manifest", "source"),
    [
        ({}, "built"),
        ({"cache_hit": False}, "built"),
        ({"cache_hit": True}, "wheel cache"),
        (
            {"cache_hit": True, "cache_source": "https://u:pw@team.example/simple/"},
            "team index https://u:***@team.example/simple/",
        ),
    ],
)
def test_a_built_wheel_says_whether_the_cache_the_team_index_or_a_compile_gave_it(
    world, tmp_path, capsys, manifest, source
):
    """Issue 41: install said source "build" for a wheel-cache hit as for a compile; the manifest tells which."""
    dist = tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master"
    dist.mkdir(parents=True)
    wheel = make_wheel(dist)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (dist / "manifest.json").write_text(
        json.dumps({"wheel": {"file": wheel.name, "sha256": sha}, **manifest})
    )
    world.wheel = wheel
    world.probes = [parsed(), installed_now(world)]
    assert install(world, build=lambda *a: dist, as_json=True) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["status"], result["source"]) == ("built-and-installed", source)
