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


def venv_at(tmp_path: Path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    t = dataclasses.replace(
        parsed(), venv=str(tmp_path / "venv"), site_dirs=(str(site),), scripts=None
    )
    return t, site


def wheel_with(tmp_path: Path, *members: str) -> Path:
    wheel = tmp_path / "dep-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for member in members:
            zf.writestr(member, b"")
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
