"""apexkit install: the target venv as its probe describes it (untrusted JSON), and what must hold before a lookup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apexkit.errors import ConfigError
from apexkit.install import run, target

TAGS = ["cp311-cp311-manylinux_2_28_x86_64", "cp311-cp311-manylinux_2_17_x86_64", "py3-none-any"]


def probe_output(**change) -> dict:
    data = {
        "python": "3.11",
        "implementation": "cpython",
        "python_tag": "cp311",
        "machine": "x86_64",
        "system": "Linux",
        "glibc": "2.36",
        "prefix": "/work/venv",
        "base_prefix": "/usr",
        "executable": "/work/venv/bin/python",
        "base_executable": "/usr/bin/python3.11",
        "is_venv": True,
        "conda": False,
        "pip": "24.0",
        "tags": TAGS,
        "markers": {
            "python_version": "3.11",
            "platform_machine": "x86_64",
            "sys_platform": "linux",
        },
        "torch": {"version": "2.13.0+cpu", "cxx11_abi": 1, "import_error": None},
        "torch_npu": None,
        "cann": None,
        "dists": {"torch": "2.13.0+cpu", "numpy": "2.1.0", "Typing_Extensions": "4.12.0"},
        "apex": None,
    }
    data.update(change)
    return data


def parsed(**change) -> target.Target:
    return target.parse(
        json.dumps(probe_output(**change)).encode(), "/work/venv/bin/python", "--venv V"
    )


def test_the_probe_line_becomes_the_target_and_its_wanted_facts():
    out = b"torch said something first\n" + json.dumps(probe_output()).encode() + b"\n"
    t = target.parse(out, "/work/venv/bin/python", "--venv V")
    assert t.torch == "2.13.0+cpu" and t.torch_public == "2.13.0" and t.torch_cxx11_abi == 1
    assert t.dists["typing-extensions"] == "4.12.0"  # names canonical
    assert t.want() == {
        "tags": t.tags,
        "python_tag": "cp311",
        "arch": "x86_64",
        "glibc": "2.36",
        "torch": "2.13.0",
        "torch_npu": None,
        "cxx11_abi": 1,
        "cuda": None,
    }
    assert "torch 2.13.0+cpu" in t.cell() and "cp311" in t.cell()
    target.check_usable(t, "--venv V")  # a venv with pip and torch: nothing to object to


@pytest.mark.parametrize(
    ("dists", "why"),
    [
        ({"x\n--index-url http://127.0.0.1:9/": "1.0"}, "a distribution named 'x\\n--index-url"),
        ({"-e": "1.0"}, "a distribution named '-e': not a PEP 508 name"),
        ({"trailing\n": "1.0"}, "not a PEP 508 name"),  # `$` would match before a last newline
        ({"ok": "1.0\n--pre"}, "holds ok at version '1.0\\n--pre': not a version"),
        ({"fine": "1.0\n"}, "not a version"),
        ({"long": "1.0+" + "a" * 300}, "not a version"),
        ({"n" * 101: "1.0"}, "not a PEP 508 name"),
    ],
)
def test_a_distribution_that_could_be_an_option_or_a_line_refuses_the_probe(dists, why):
    """Every distribution the venv sees is held in pip's constraints file, one per line: one that cannot be written
    there safely is never skipped (pip would then be free to change it), the probe is refused."""
    for key in ("dists", "visible"):
        with pytest.raises(target.ProbeError) as err:
            parsed(**{key: {"torch": "2.13.0+cpu", **dists}})
        assert why in err.value.cause and "remove or reinstall that distribution" in err.value.hint


def test_a_long_local_or_legacy_version_is_kept_and_held():
    long_local = "1.0+" + "a" * 70  # a PEP 440 local version longer than 64 characters
    t = parsed(dists={"torch": "2.13.0+cpu", "bar": long_local, "oldpkg": "1.0-legacy_x"})
    assert t.dists["bar"] == long_local and t.dists["oldpkg"] == "1.0-legacy_x"
    held = run._constraints(t).splitlines()
    assert f"bar==={long_local}" in held and "oldpkg===1.0-legacy_x" in held  # legacy: as it is


def test_the_base_of_a_system_site_packages_venv_is_seen_the_venvs_own_first():
    t = parsed(visible={"numpy": "1.26.0", "packaging": "24.1"})
    assert t.visible == {"packaging": "24.1"}  # numpy: the venv's own 2.1.0 shadows the base's
    assert t.seen["numpy"] == "2.1.0" and t.seen["packaging"] == "24.1"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"tags": ["cp311 cp311 any"]}, "tags are not wheel tags"),
        (
            {"torch": {"version": "2.13.0; rm -rf ~", "cxx11_abi": 1}},
            "torch.version is not a version",
        ),
        ({"torch": {"version": "2.13.0", "cxx11_abi": True}}, "cxx11_abi is not 0, 1 or null"),
        ({"is_venv": "yes"}, "is_venv is not true/false"),
        ({"python_tag": "cp311\x1b[31m"}, "python_tag is not a plain word"),
        ({"markers": {"python_version": 3.11}}, "markers are not strings"),
        ({"apex": "apex 0.9"}, "apex is not an object"),
    ],
)
def test_a_probe_answer_of_the_wrong_shape_is_one_line(change, why):
    with pytest.raises(target.ProbeError) as err:
        parsed(**change)
    assert (
        why in err.value.cause
        and "\n" not in err.value.format()
        and "\x1b" not in err.value.format()
    )


def test_more_than_the_cap_or_no_json_is_refused():
    with pytest.raises(target.ProbeError, match="more than"):
        target.parse(b"x" * (target.OUTPUT_LIMIT + 1), "p", "--venv V")
    with pytest.raises(target.ProbeError, match="no JSON object"):
        target.parse(b"[1, 2]\n", "p", "--venv V")
    with pytest.raises(target.ProbeError, match="no JSON object"):
        target.parse(b"", "p", "--venv V")


def test_odd_optional_facts_are_dropped_not_trusted():
    t = parsed(glibc="2.36; echo", base_executable="relative/python", cann="8.1.RC1")
    assert t.glibc is None and t.base_executable is None and t.cann == "8.1.RC1"
    assert parsed(cann="8.1 RC1 `x`").cann is None


@pytest.mark.parametrize(
    ("change", "cause", "fix"),
    [
        ({"is_venv": False, "prefix": "/usr"}, "is not in a venv", "python -m venv DIR"),
        ({"pip": None}, "has no pip", "-m ensurepip"),
        ({"torch": None}, "has no torch", "install the torch you train with first"),
        (
            {"apex": {"version": "0.9.10.dev0", "apexkit": False, "record": [], "tags": []}},
            "not an apexkit wheel",
            "-m pip uninstall apex",
        ),
    ],
)
def test_what_must_hold_before_a_lookup(change, cause, fix):
    with pytest.raises(ConfigError) as err:
        target.check_usable(parsed(**change), "--venv V")
    assert cause in err.value.cause and fix in err.value.hint


def test_a_conda_env_is_a_target_too():
    target.check_usable(parsed(is_venv=False, conda=True), "--venv V")


def test_the_target_is_named_by_venv_interpreter_or_the_active_venv(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("")
    python.chmod(0o755)
    assert target.interpreter_for(str(venv), None, {}) == (str(python), f"--venv {venv}")
    assert (
        target.interpreter_for(None, None, {"VIRTUAL_ENV": str(venv)})[1]
        == f"the active venv {venv}"
    )
    assert target.interpreter_for(None, "/x/python", {}) == ("/x/python", "--interpreter /x/python")
    with pytest.raises(ConfigError, match="no active venv"):
        target.interpreter_for(None, None, {})
    with pytest.raises(ConfigError, match="both given"):
        target.interpreter_for(str(venv), "/x/python", {})
    with pytest.raises(ConfigError, match="is not a directory"):
        target.interpreter_for(str(tmp_path / "missing"), None, {})
    with pytest.raises(ConfigError, match="no bin/python"):
        target.interpreter_for(str(tmp_path), None, {})


def test_the_probe_runs_on_a_plain_interpreter_and_parses(capsys, monkeypatch):
    """bench/probes/target_env.py, run in this process (standard library only): what it prints, parse() reads."""
    import runpy

    monkeypatch.setattr("sys.argv", [str(target.PROBE), "--versions-only"])
    runpy.run_path(str(target.PROBE), run_name="__main__")
    t = target.parse(capsys.readouterr().out.encode(), "python", "--interpreter python")
    import sys

    assert t.python == f"{sys.version_info[0]}.{sys.version_info[1]}" and t.tags
    assert t.is_venv == (sys.prefix != sys.base_prefix) and t.dists.get("packaging")
    assert not set(t.visible) & set(t.dists)  # the venv's own first


def test_the_torch_cuda_release_is_read_and_checked():
    t = parsed(torch={"version": "2.14.1", "cxx11_abi": 1, "import_error": None, "cuda": "13.0"})
    assert t.torch_cuda == "13.0" and t.want()["cuda"] == "13.0" and ", CUDA 13.0," in t.cell()
    for bad in ("13.0; rm -rf /", 13.0, "x" * 100):
        with pytest.raises(target.ProbeError, match="torch.cuda is not a CUDA release"):
            parsed(torch={"version": "2.14.1", "cxx11_abi": 1, "import_error": None, "cuda": bad})


def test_the_probe_reads_torchs_cuda_off_version_py_without_importing_it(tmp_path):
    import importlib.util

    from apexkit import paths

    spec = importlib.util.spec_from_file_location("target_env", paths.PROBES / "target_env.py")
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)

    class Dist:
        def locate_file(self, name):
            return tmp_path / name

    (tmp_path / "torch").mkdir()
    version = tmp_path / "torch" / "version.py"
    for text, cuda in [
        ("__version__ = '2.14.1'\ncuda: Optional[str] = '13.0'\n", "13.0"),
        ("cuda = '12.8'\n", "12.8"),
        ("cuda: Optional[str] = None\n", None),
        ("hip = '6.2'\n", None),
    ]:
        version.write_text(text)
        assert probe._torch_cuda(Dist()) == cuda, text
    version.unlink()
    assert probe._torch_cuda(Dist()) is None


@pytest.mark.parametrize(
    ("pattern", "good"),
    [
        ("apexkit.install.target:_NAME", "typing_extensions"),
        ("apexkit.install.target:_DIST_VERSION", "1.0-legacy_x"),
        ("apexkit.install.target:_TAG", "cp311-cp311-manylinux_2_28_x86_64"),
        ("apexkit.urls:_HOSTNAME", "mirror.example.internal"),
        ("apexkit.install.target:_SHORT", "2.13.0+cpu"),
        ("apexkit.install.target:_CUDA", "13.0"),
        ("apexkit.wheel.sources:SHA_RE", "a" * 40),
        ("apexkit.wheel.nvidiaext:_FLAG", "--cuda_ext"),
        ("apexkit.plan.cudaarch:_ARCH", "9.0"),
        ("apexkit.plan.matrix:_STACK_NAME", "qwen3"),
        ("tools.contracts:NAME_RE", "apex.amp"),
        ("apexkit.urls:_USERINFO", "user"),
    ],
)
def test_no_validator_passes_a_value_with_a_last_newline(pattern, good):
    """`re.match` with `$` matches before a final newline: every validator of untrusted words ends in \\Z."""
    import importlib

    module, name = pattern.split(":")
    regex = getattr(importlib.import_module(module), name)
    assert regex.match(good) and not regex.match(good + "\n")


def test_the_probe_reads_torch_off_a_system_site_packages_base_the_venvs_own_first(
    capsys, monkeypatch, tmp_path
):
    """A venv made --system-site-packages over a base holding torch: its torch is the base's (pip and import find
    it there); a torch of the venv's own would come first."""
    import runpy

    class Dist:
        def __init__(self, version: str) -> None:
            self.version = version

        def locate_file(self, path: str) -> Path:
            return tmp_path / path  # no torch/version.py: CUDA unknown

    probe = runpy.run_path(str(target.PROBE), run_name="probe")
    for own, expected in (({}, "2.5.1"), ({"torch": Dist("2.13.0+cpu")}, "2.13.0+cpu")):
        visible = {"torch": Dist("2.5.1"), "pip": Dist("24.0"), "numpy": Dist("1.26.0")}
        monkeypatch.setitem(probe["main"].__globals__, "_dists", lambda o=own, v=visible: (o, v))
        monkeypatch.setattr("sys.argv", [str(target.PROBE), "--versions-only"])
        probe["main"]()
        t = target.parse(capsys.readouterr().out.encode(), "python", "--venv V")
        assert t.torch == expected and t.pip == "24.0" and t.seen["numpy"] == "1.26.0"
