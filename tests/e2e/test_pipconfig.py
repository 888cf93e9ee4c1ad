"""pip's configuration as apexkit reads it (apexkit/pipconfig.py): pip's own precedence, checked on `pip config list`
text and end to end with real config files read by the real pip."""

from __future__ import annotations

import sys

from apexkit import pipconfig


def test_real_pip_files_global_user_and_environment(tmp_path, monkeypatch):
    """The files as pip itself merges them: the user file over the global one per section.key, then [install] (even
    from the global file) over [global] (even from the user file), then PIP_*; an empty value in the user file hides
    the global one and is then ignored, as in pip."""
    system, user = tmp_path / "xdg-dirs", tmp_path / "xdg-home"
    (system / "pip").mkdir(parents=True)
    (user / "pip").mkdir(parents=True)
    (system / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = https://global-file.example/simple\ntimeout = 30\ntrusted-host = g.example\n"
        "[install]\nfind-links = /global-file/install-wheels\n"
    )
    (user / "pip" / "pip.conf").write_text(
        "[global]\nindex-url = https://user-file.example/simple\nfind-links = /user-file/wheels\ntimeout =\n"
        "[download]\nindex-url = https://download.example/simple\n"
    )
    env = {
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_DIRS": str(system),
        "XDG_CONFIG_HOME": str(user),
    }
    conf = pipconfig.read(env)
    assert conf["index-url"] == "https://user-file.example/simple"  # user file > global file
    assert (
        conf["find-links"] == "/global-file/install-wheels"
    )  # [install] > [global], whichever file
    assert conf["trusted-host"] == "g.example" and "timeout" not in conf
    conf = pipconfig.read(
        {**env, "PIP_INDEX_URL": "https://env.example/simple", "PIP_FIND_LINKS": ""}
    )
    assert conf["index-url"] == "https://env.example/simple"  # PIP_* > every file
    assert conf["find-links"] == "/global-file/install-wheels"  # an empty variable is ignored
    # this process's own PIP_* variables are not pip's configuration for `env`
    monkeypatch.setenv("PIP_INDEX_URL", "https://this-process.example/simple")
    assert pipconfig.read(env)["index-url"] == "https://user-file.example/simple"


def test_without_a_pip_the_variables_alone_are_read():
    env = {
        "PIP_INDEX_URL": "https://env.example/simple",
        "PIP_EXTRA_INDEX_URL": "https://a.example https://b.example",
        "PIP_TRUSTED_HOST": "",
        "PIP_VERSION": "1",
        "HOME": "/nonexistent",
        "https_proxy": "http://p:3128",
    }
    conf = pipconfig.read(env, python=sys.executable + "-no-such-python")
    assert dict(conf) == {
        "index-url": "https://env.example/simple",
        "extra-index-url": "https://a.example https://b.example",
    }
    assert pipconfig.from_environment(env) == conf
