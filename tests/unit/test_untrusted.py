"""apexkit's one safe-open helper (untrusted.open_regular / read_regular): what it refuses, and that it never blocks,
follows a link it was not told to, or truncates."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from apexkit import untrusted


def refused(kind: str, call, *args, **kwargs) -> untrusted.Refused:
    with pytest.raises(untrusted.Refused) as info:
        call(*args, **kwargs)
    assert info.value.kind == kind, info.value
    return info.value


def test_a_regular_file_is_read_by_path_and_relative_to_a_directory(tmp_path):
    (tmp_path / "f").write_bytes(b"data")
    assert untrusted.read_regular(tmp_path / "f", None, 4) == b"data"
    fd = untrusted.open_dir(tmp_path)
    try:
        assert untrusted.read_regular("f", fd, 4) == b"data"
        assert (
            os.get_blocking(untrusted.open_regular("f", fd)) is True
        )  # usable as a normal file once checked
    finally:
        os.close(fd)


def test_a_link_is_refused_unless_followed(tmp_path):
    (tmp_path / "target").write_bytes(b"secret")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert str(refused("link", untrusted.read_regular, tmp_path / "link", None, 99)).endswith(
        "is a symbolic link"
    )
    refused("link", untrusted.open_regular, tmp_path / "dangling", write=True)
    assert not (tmp_path / "nowhere").exists()  # writing never created the link's target
    assert untrusted.read_regular(tmp_path / "link", None, 99, follow=True) == b"secret"


def test_fifos_devices_and_directories_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")  # an open for reading would wait for a writer
    assert refused("type", untrusted.read_regular, tmp_path / "fifo", None, 99).mode & stat.S_IFIFO
    refused("type", untrusted.open_regular, tmp_path / "fifo", write=True)
    refused("type", untrusted.read_regular, "/dev/zero", None, 99, follow=True)
    exc = refused("type", untrusted.read_regular, tmp_path, None, 99)
    assert stat.S_ISDIR(exc.mode) and untrusted.file_kind(exc.mode) == "a directory"
    assert untrusted.file_kind(stat.S_IFIFO) == "a named pipe"


def test_the_size_cap_and_a_missing_file(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * (2 << 20))
    exc = refused("size", untrusted.read_regular, tmp_path / "big", None, 1 << 20)
    assert str(exc).endswith("is larger than 1 MiB")
    assert untrusted.read_regular(tmp_path / "big", None, 2 << 20) == b"x" * (2 << 20)
    missing = refused("os", untrusted.read_regular, tmp_path / "missing", None, 99)
    assert missing.errno == errno.ENOENT and str(missing).endswith("is no such file or directory")
    below = refused(
        "os", untrusted.read_regular, tmp_path / "big" / "x", None, 99
    )  # a file where a folder belongs
    assert below.errno == errno.ENOTDIR


def test_write_creates_never_truncates_and_can_refuse_a_hard_link(tmp_path):
    fd = untrusted.open_regular(tmp_path / "new.log", write=True)
    os.close(fd)
    assert (tmp_path / "new.log").read_bytes() == b"" and stat.S_IMODE(
        (tmp_path / "new.log").stat().st_mode
    ) & 0o600
    (tmp_path / "old.log").write_bytes(b"kept")
    os.close(untrusted.open_regular(tmp_path / "old.log", write=True, one_link=True))
    assert (
        tmp_path / "old.log"
    ).read_bytes() == b"kept"  # the caller truncates once the checks passed
    os.link(tmp_path / "old.log", tmp_path / "other-name")
    refused("links", untrusted.open_regular, tmp_path / "old.log", write=True, one_link=True)
    os.close(untrusted.open_regular(tmp_path / "old.log"))  # only when asked


def test_the_callers_keep_their_own_one_line_messages(tmp_path):
    """fsedit reads through links (a dotfile may be one) and says "nothing was changed"; its state reader never
    follows one; both name the file the way their users know it."""
    from apexkit import fsedit
    from apexkit.errors import EnvironmentSetupError

    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "fifo")
    assert fsedit.read_regular(tmp_path / "link", "~/.bashrc") == b"x"
    assert fsedit.read_regular(tmp_path / "missing", "~/.bashrc") is None
    assert fsedit.read_regular(tmp_path / "real" / "below", "~/.bashrc") is None
    for path, says in (
        (tmp_path, "~/.bashrc is a directory, not a file; nothing was changed"),
        (tmp_path / "fifo", "~/.bashrc is a named pipe, not a regular file: apexkit reads only"),
    ):
        with pytest.raises(fsedit.TargetError) as info:
            fsedit.read_regular(path, "~/.bashrc")
        assert info.value.cause.startswith(says)
    assert fsedit.read_private(tmp_path / "missing", "the manifest") is None
    for path, says in (
        (tmp_path / "link", "is a symbolic link, not a file apexkit made; it was not followed"),
        (tmp_path / "fifo", "is not a regular file; it was not read"),
        (tmp_path / "real" / "below", f"{tmp_path / 'real'} is a file where a folder belongs"),
    ):
        with pytest.raises(EnvironmentSetupError) as info:
            fsedit.read_private(path, "the manifest")
        assert says in info.value.cause and "nothing was changed" in info.value.cause
