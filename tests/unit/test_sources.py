"""apexkit.wheel.sources in-process: credentials are split from a source URL. The git mirrors are in
tests/e2e/test_sources.py."""

from __future__ import annotations

from apexkit.wheel import sources


def test_split_credentials():
    assert sources.split_credentials("https://u:p%40ss@git.example.com:8443/a/apex.git") == (
        "https://git.example.com:8443/a/apex.git",
        ("u", "p@ss"),
    )
    assert sources.split_credentials("https://tokenonly@host/x.git") == (
        "https://host/x.git",
        ("tokenonly", ""),
    )
    for plain in (
        "https://host/x.git",
        "file:///srv/x.git",
        "ssh://git@host/x.git",
        "git@host:x.git",
    ):
        assert sources.split_credentials(plain) == (plain, None)


def test_the_flags_of_an_apex_src_are_read_only_from_a_regular_npu_patch(tmp_path):
    """--apex-src of a ref matrix.toml does not know: its patch/npu.patch is read before anything else, so a named
    pipe (or a device) there is one line, exit 4 -- not a build that hangs forever on the read."""
    import os
    import threading

    import pytest

    from apexkit.errors import SourceError

    checkout = tmp_path / "apex"
    (checkout / "patch").mkdir(parents=True)
    (checkout / "patch" / "npu.patch").write_text('+    "--npu_float_status"\n')
    assert sources.flags_of(checkout) == ("--cpp_ext", "--npu_float_status")
    (checkout / "patch" / "npu.patch").unlink()
    with pytest.raises(SourceError, match="npu.patch") as missing:
        sources.flags_of(checkout)
    assert missing.value.exit_code == 4
    os.mkfifo(checkout / "patch" / "npu.patch")
    outcome: list = []

    def read():
        try:
            outcome.append(sources.flags_of(checkout))
        except SourceError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # blocked on the FIFO: give it an end of file, then fail
        os.close(os.open(checkout / "patch" / "npu.patch", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
        pytest.fail("flags_of blocked reading a named pipe at patch/npu.patch")
    assert isinstance(outcome[0], SourceError) and "not a regular file" in outcome[0].cause
    assert "\n" not in outcome[0].format()
