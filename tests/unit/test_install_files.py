"""apexkit.install.files on real files: what a wheel may write into a venv's site directory, and the orphans a
killed run left, removed only inside the venv."""

from __future__ import annotations

import dataclasses
import os
import zipfile
from pathlib import Path

import pytest

from apexkit.install import files, fit

from .test_install_target import parsed


def venv_at(tmp_path: Path, scripts: bool = False):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "venv" / "bin").mkdir()
    t = dataclasses.replace(
        parsed(),
        venv=str(tmp_path / "venv"),
        site_dirs=(str(site),),
        scripts=str(tmp_path / "venv" / "bin") if scripts else None,
    )
    return t, site


def wheel_with(tmp_path: Path, *members: str, name: str = "dep", **meta: bytes) -> Path:
    """A wheel `name` 1.0 holding `members` (empty) and in its .dist-info `meta` ({RECORD or entry_points: bytes})."""
    wheel = tmp_path / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for member in members:
            zf.writestr(member, b"")
        for member, content in meta.items():
            zf.writestr(
                f"{name}-1.0.dist-info/{member.replace('entry_points', 'entry_points.txt')}",
                content,
            )
    return wheel


@pytest.mark.parametrize(
    "member",
    [
        "sitecustomize/__init__.py",
        "sitecustomize.pyc",
        "usercustomize.cpython-311-x86_64-linux-gnu.so",
        "__pycache__/sitecustomize.cpython-311.pyc",
        "dep-1.0.data/platlib/usercustomize.abi3.so",
        "x.pth/y.py",
    ],
)
def test_startup_code_in_any_form_is_refused(tmp_path, member):
    """Review 3, F3: not only sitecustomize.py: its package, bytecode, extension module, the .data route."""
    t, _ = venv_at(tmp_path)
    with pytest.raises(fit.Misfit, match="which every start of the venv's python runs"):
        files.check_wheel(wheel_with(tmp_path, member, "dep/__init__.py"), t, {}, {})


def test_a_name_on_disk_that_no_distribution_lists_is_not_written_under(tmp_path):
    """Review 3, F4: a top-level module or namespace folder nobody's RECORD lists is not a free name."""
    t, site = venv_at(tmp_path)
    (site / "loose.py").write_text("")
    with pytest.raises(fit.Misfit, match="inside the package loose of no distribution"):
        files.check_wheel(wheel_with(tmp_path, "loose/__init__.py"), t, {}, files.names(t, {}))


def test_orphans_behind_a_linked_folder_are_not_removed(tmp_path):
    """Review 3: a journal path through a symbolic link in site-packages (to a folder outside the venv) is left
    alone; a plain orphan inside is removed."""
    t, site = venv_at(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.py").write_text("")
    os.symlink(outside, site / "linked")
    (site / "pkg").mkdir()
    (site / "pkg" / "orphan.py").write_text("")
    paths = [str(site / "linked" / "keep.py"), str(site / "pkg" / "orphan.py")]
    assert files.remove_orphans(paths, t, {}) == [os.path.join("pkg", "orphan.py")]
    assert (outside / "keep.py").exists() and not (site / "pkg").exists()


@pytest.mark.parametrize(
    "member",
    [
        "__pycache__/six.cpython-311.pyc",
        "__pycache__/six.cpython-311.opt-1.pyc",
        "dep-1.0.data/purelib/__pycache__/six.cpython-311.pyc",
        "six/__pycache__/extra.cpython-311.pyc",
    ],
)
def test_bytecode_for_another_distributions_module_is_refused(tmp_path, member):
    """Review 4, F2: an unchecked-hash .pyc under __pycache__ is what `import six` runs (six.py never compared): a
    wheel's bytecode belongs to the module it is named for, another's is refused; its own is written."""
    t, site = venv_at(tmp_path)
    (site / "six.py").write_text("")
    owned = {str(site / "six.py"): {"six"}}
    with pytest.raises(fit.Misfit, match="inside the package six of six"):
        files.check_wheel(wheel_with(tmp_path, member), t, owned, files.names(t, owned))
    own = wheel_with(tmp_path, "dep.py", "__pycache__/dep.cpython-311.opt-2.pyc")
    assert len(files.check_wheel(own, t, owned, files.names(t, owned))) == 2


def test_installed_bytecode_holds_its_modules_name(tmp_path):
    """Review 4, F2: a .pyc a distribution's RECORD lists under __pycache__ gives it that module's name."""
    t, site = venv_at(tmp_path)
    owned = {str(site / "__pycache__" / "six.cpython-311.pyc"): {"evil"}}
    assert files.names(t, owned) == {"six": {"evil"}}


@pytest.mark.parametrize(
    ("entry_points", "on_disk", "why"),
    [
        ("[console_scripts]\npython3 = dep_mod:main\n", "python3", "'bin/python3', which no"),
        ("[gui_scripts]\n  tool=dep_mod:main\n", "tool", "'bin/tool', which no"),
        ("[console_scripts]\npip = dep_mod:main\n", "pip3.11", "'bin/pip3.11', which no"),
        ("[console_scripts]\npip = dep_mod:main\n", "pip3", "'bin/pip3', which no"),
        ("[console_scripts]\n../x = dep_mod:main\n", "", "a path outside the venv"),
    ],
)
def test_a_console_script_over_a_file_of_bin_is_refused(tmp_path, entry_points, on_disk, why):
    """Review 4, F3: pip writes bin/<name> for each of the wheel's [console_scripts] and [gui_scripts] (pip3 and
    pip3.11 too for pip) over what is there: a name bin/ already holds (its python3, pip) is refused."""
    t, _ = venv_at(tmp_path, scripts=True)
    if on_disk:
        (tmp_path / "venv" / "bin" / on_disk).write_text("")
    wheel = wheel_with(tmp_path, "dep_mod/__init__.py", entry_points=entry_points.encode())
    with pytest.raises(fit.Misfit, match=why.replace(".", r"\.")):
        files.check_wheel(wheel, t, {}, {})


def test_a_console_script_two_wheels_declare_is_refused_a_new_one_is_written(tmp_path):
    """Review 4, F3: the second wheel of a run declaring a script the first one writes is refused."""
    t, _ = venv_at(tmp_path, scripts=True)
    taken: dict[str, set[str]] = {}
    ep = b"[console_scripts]\ntool = x:main\n"
    first = wheel_with(tmp_path, name="one", entry_points=ep)
    assert files.check_wheel(first, t, {}, taken) == [str(tmp_path / "venv" / "bin" / "tool")]
    second = wheel_with(tmp_path, name="two", entry_points=ep)
    with pytest.raises(fit.Misfit, match="'bin/tool', which one writes too"):
        files.check_wheel(second, t, {}, taken)


def test_a_record_too_large_or_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path, monkeypatch):
    """Review 4, F4: the RECORD's size is checked before it is read, and the wheel's zip before any member is."""
    t, _ = venv_at(tmp_path)
    bomb = wheel_with(tmp_path, RECORD=b"dep/__init__.py,,\n" * (4 << 20))
    with pytest.raises(fit.Misfit, match="member 'dep-1.0.dist-info/RECORD' expands .*a zip bomb"):
        files.check_wheel(bomb, t, {}, {})
    monkeypatch.setattr(files, "RECORD_LIMIT", 100)
    big = wheel_with(tmp_path, RECORD=b"dep/__init__.py,,\n" * 10)
    with pytest.raises(fit.Misfit, match="RECORD of 'dep-1.0-py3-none-any.whl' is larger than 100"):
        files.check_wheel(big, t, {}, {})
