"""apexkit.fsedit in-process: links are resolved as the kernel does, each one named. The proxy writers through
`invoke proxy.*` are in tests/e2e/test_proxy*.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_links_are_resolved_as_the_kernel_does_and_each_one_is_named(tmp_path):
    from apexkit import fsedit

    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    (tmp_path / "a/up").symlink_to("b/..")  # '..' after a link: the link's target's parent
    (tmp_path / "a/b/abs").symlink_to(tmp_path / "c")  # absolute
    (tmp_path / "outer").symlink_to("a/b/abs")  # a link whose target goes through another link
    for relative in ("a/up/b/abs/file", "outer/new/file", "a/b/abs/../a/up/../c", "missing/../c/x"):
        path = tmp_path / relative
        resolved, links = fsedit.resolve_links(path)
        assert resolved == Path(os.path.realpath(path)), relative
    _, links = fsedit.resolve_links(tmp_path / "outer/file")
    assert [(link.name, target) for link, _, target in links] == [
        ("outer", tmp_path / "c"),
        ("abs", tmp_path / "c"),
    ]
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    with pytest.raises(fsedit.TargetError, match="too many symbolic links"):
        fsedit.resolve_links(loop / "x")
