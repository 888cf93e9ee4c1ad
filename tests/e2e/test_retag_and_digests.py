"""Issue 16: the wheel file carries the manylinux tag auditwheel computed (retagged with `wheel tags`, bytes
reproducible, RECORD consistent), and every install records the sha256 of the wheel file each distribution came from
(<venv>/apexkit-installed.json: pip's --report, uv's pylock resolution). Real venvs, real pip, uv and `wheel`."""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import fakes
import pytest

from apexkit.wheel import venvs, wheelcheck


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tool_venv(tmp_path_factory) -> venvs.Venv:
    """A venv with `wheel` and packaging, made and filled the way a build venv is (uv where it serves)."""
    base = tmp_path_factory.mktemp("tool-venv")
    venv = venvs.create(sys.executable, base / "venv", base / "log")
    venvs.pip_install(venv, ["wheel", "packaging"], venvs.IndexOptions(), base / "log")
    return venv


def test_retag_names_the_wheel_after_the_computed_tag_reproducibly(tool_venv, tmp_path):
    outs = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        platform = {"computed": True, "tag": "manylinux_2_24_x86_64"}
        new = wheelcheck.retag(
            fakes.make_wheel(folder), platform, "x86_64", tool_venv.python, 1597363200
        )
        assert new.name == "apex-0.1+ascend.torch2.13.0-cp311-cp311-manylinux_2_24_x86_64.whl"
        assert sorted(p.name for p in folder.iterdir()) == [new.name]  # the linux_ file is gone
        assert (
            platform["wheel_tag"] == "manylinux_2_24_x86_64"
            and platform["retagged_from"] == "linux_x86_64"
        )
        outs.append(new)
    assert sha(outs[0]) == sha(outs[1])  # same input, same bytes
    assert wheelcheck.wheel_problems(outs[0]) == []  # WHEEL Tag = the name, every RECORD row right
    with zipfile.ZipFile(outs[0]) as zf, zipfile.ZipFile(fakes.make_wheel(tmp_path)) as old:
        assert "Tag: cp311-cp311-manylinux_2_24_x86_64" in zf.read(f"{fakes.INFO}/WHEEL").decode()
        assert [(i.filename, i.date_time) for i in zf.infolist()] == [
            (i.filename, i.date_time) for i in old.infolist()
        ]


def test_retag_keeps_linux_when_no_tag_was_computed_and_refuses_another_arch(tool_venv, tmp_path):
    wheel = fakes.make_wheel(tmp_path)
    platform = {"computed": False, "why": "auditwheel is not installed"}
    assert wheelcheck.retag(wheel, platform, "x86_64", tool_venv.python, 0) == wheel
    assert (
        platform["wheel_tag"] == "linux_x86_64"
        and "auditwheel is not installed" in platform["kept_because"]
    )
    platform = {"computed": True, "tag": "linux_x86_64"}
    assert wheelcheck.retag(wheel, platform, "x86_64", tool_venv.python, 0) == wheel
    assert "no manylinux policy" in platform["kept_because"]
    with pytest.raises(wheelcheck.RetagError):
        wheelcheck.retag(
            wheel,
            {"computed": True, "tag": "manylinux_2_17_aarch64"},
            "x86_64",
            tool_venv.python,
            0,
        )


def _check_recorded(venv: venvs.Venv, name: str, source: str) -> dict:
    recorded = json.loads((venv.path / venvs.INSTALLED_FILE).read_text())
    assert recorded["format"] == "apexkit-installed/1"
    entry = recorded["packages"][name]
    assert (
        len(entry["sha256"]) == 64
        and entry["file"].endswith(".whl")
        and entry["from"].startswith(source)
    )
    if entry["url"].startswith(
        "file://"
    ):  # a local index or find-links: the file on disk is the one vouched for
        assert sha(Path(unquote(urlsplit(entry["url"]).path))) == entry["sha256"]
    assert venvs.installed_digests(venv.path)[name] == entry
    return entry


def test_uv_installs_record_the_wheel_digests(tool_venv):
    if venvs.uvtools.find() is None:
        pytest.skip("no uv here: the pip test covers the recording")
    entry = _check_recorded(tool_venv, "wheel", "uv ")
    assert "pip compile --format pylock.toml" in entry["from"]


def test_pip_installs_record_the_wheel_digests_from_pip_report(tmp_path, monkeypatch):
    monkeypatch.setenv("APEXKIT_INSTALLER", "pip")
    venv = venvs.create(sys.executable, tmp_path / "venv", tmp_path / "log")
    venvs.pip_install(venv, ["packaging"], venvs.IndexOptions(), tmp_path / "log")
    entry = _check_recorded(venv, "packaging", "pip ")
    assert entry["from"].endswith("install --report")
