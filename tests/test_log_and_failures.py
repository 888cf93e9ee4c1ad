from apexkit import known_failures, log
from apexkit.errors import BuildError


def test_mask_hides_passwords_only():
    assert log.mask("http://alice:s3cret@proxy:3128/x") == "http://alice:***@proxy:3128/x"
    assert log.mask("git fetch https://host/repo.git") == "git fetch https://host/repo.git"
    assert "s3cret" not in log.mask("a=https://u:s3cret@h b=http://v:p4ss@g")


def test_error_is_one_line_with_next_step():
    err = BuildError("setup.py failed:\n  something", "see the log")
    assert err.format() == "setup.py failed: something -- next: see the log"
    assert err.exit_code == 7


def test_known_failure_signatures():
    ids = lambda text: [f.id for f in known_failures.match(text)]  # noqa: E731
    assert ids("tree/csrc/x.cpp:2:10: fatal error: torch/extension.h: No such file or directory") == [
        "hardcoded-site-packages"]
    assert ids("/usr/bin/ld: cannot find -lc10: No such file or directory") == ["hardcoded-site-packages"]
    assert ids("packaging.version.InvalidVersion: Invalid version: '0.1-ascend'") == ["invalid-version"]
    assert ids("fatal error: acl/acl.h: No such file or directory") == ["acl-headers-missing"]
    assert ids("all good") == []
