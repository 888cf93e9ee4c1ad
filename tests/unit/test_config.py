"""apexkit.config: flag > environment > project file > user file > default, each value's origin, and the files
taken as untrusted input (links, other users' files, size, types, unknown keys)."""

from __future__ import annotations

import json
import os

import pytest

from apexkit import config
from apexkit.errors import ConfigError

GIT = "ascend_apex_url"


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """A project directory (the current one) and a user config home, both empty."""
    project = tmp_path / "project"
    project.mkdir()
    xdg = tmp_path / "xdg"
    (xdg / "apexkit").mkdir(parents=True)
    monkeypatch.chdir(project)
    return project / "apexkit.toml", xdg / "apexkit" / "config.toml", {"XDG_CONFIG_HOME": str(xdg)}


def write(path, text: str, mode: int = 0o600) -> None:
    path.write_text(text)
    os.chmod(path, mode)


def test_each_of_the_five_layers_wins_in_its_turn(homes):
    project, user, env = homes
    cfg = lambda: config.load(env)  # noqa: E731
    value = cfg().get(GIT, env, default="https://gitcode.com/Ascend/apex.git")
    assert (value.layer, value.value) == ("default", "https://gitcode.com/Ascend/apex.git")
    write(user, f'{GIT} = "file:///user.git"\n')
    value = cfg().get(GIT, env)
    assert (value.layer, value.value, value.where) == ("user", "file:///user.git", str(user))
    write(project, f'{GIT} = "file:///project.git"\n')
    assert cfg().get(GIT, env).origin == f"project {project}"
    with_env = {**env, "APEXKIT_ASCEND_APEX_URL": "file:///env.git"}
    value = cfg().get(GIT, with_env)
    assert (value.origin, value.value) == ("env APEXKIT_ASCEND_APEX_URL", "file:///env.git")
    value = cfg().get(GIT, with_env, flag="file:///flag.git")
    assert (value.origin, value.value) == ("flag --ascend-apex-url", "file:///flag.git")


def test_an_empty_variable_counts_as_unset_as_before(homes):
    project, _, env = homes
    write(project, f'{GIT} = "file:///project.git"\n')
    assert config.load(env).get(GIT, {**env, "APEXKIT_ASCEND_APEX_URL": "  "}).layer == "project"


def test_list_settings_take_a_string_or_a_list_and_env_splits_as_before(homes):
    project, _, env = homes
    write(
        project, 'team_indexes = ["http://a/", "/srv/idx"]\nextra_index_urls = "https://x/simple"\n'
    )
    cfg = config.load(env)
    assert cfg.get("team_indexes", env).value == ("http://a/", "/srv/idx")
    assert cfg.get("extra_index_urls", env).value == ("https://x/simple/",)
    value = cfg.get("team_indexes", {**env, "APEXKIT_INDEX": "http://b/,http://c/ http://d/"})
    assert value.value == ("http://b/", "http://c/", "http://d/")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            'ascend_apex_ur = "x"\n',
            "unknown key 'ascend_apex_ur' -- next: did you mean ascend_apex_url?",
        ),
        ("ascend_apex_url = 3\n", "ascend_apex_url is a int, not a string"),
        ('team_indexes = [1, "a"]\n', "team_indexes is a list, not a string or a list of strings"),
        ("ascend_apex_url = \n", "is not valid TOML"),
        ('index_url = "ftp://mirror/simple"\n', "scheme"),
        ('quay_registry = "https://quay.corp"\n', "is not a registry prefix"),
        ('[sources]\nascend_apex_url = "x"\n', "unknown key 'sources'"),
        ('ascend_apex_url = "--upload-pack=/tmp/evil"\n', "starts with '-'"),
        ('index_url = "https://mirror/simple\\nextra"\n', "the URL holds a line break"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file(homes, text, says):
    project, _, env = homes
    write(project, text)
    with pytest.raises(ConfigError) as err:
        config.load(env)
    line = err.value.format()
    assert says in line and str(project) in line and "\n" not in line


def test_a_link_another_users_file_and_a_huge_file_are_refused(homes, tmp_path):
    _, user, env = homes
    real = tmp_path / "real.toml"
    write(real, f'{GIT} = "file:///x.git"\n')
    user.symlink_to(real)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        config.load(env)
    user.unlink()
    write(user, f'{GIT} = "file:///x.git"\n', 0o646)
    with pytest.raises(ConfigError, match="world-writable: another user could change"):
        config.load(env)
    write(user, "# " + "x" * config.MAX_BYTES + "\n")
    with pytest.raises(ConfigError, match="is larger than 65536 bytes"):
        config.load(env)


def test_credentials_are_masked_whenever_shown(homes, capsys):
    project, _, env = homes
    write(project, 'index_url = "https://alice:s3cret@mirror.corp/simple"\n')
    value = config.load(env).get("index_url", env)
    assert value.value == "https://alice:s3cret@mirror.corp/simple/"  # what pip gets
    assert "s3cret" not in value.shown() and "alice:***@" in value.shown()
    os.environ.update(env)  # show() reads the process environment, as the command does
    try:
        assert config.show({GIT: "https://gitcode.com/Ascend/apex.git"}, as_json=True) == 0
    finally:
        del os.environ["XDG_CONFIG_HOME"]
    out = capsys.readouterr().out
    assert "s3cret" not in out
    rows = {r["key"]: r for r in json.loads(out)["settings"]}
    assert rows["index_url"]["origin"] == f"project {project}"
    assert rows[GIT]["origin"] == "default" and rows["quay_registry"]["value"] == "quay.io"


def test_base_images_go_through_the_registry_prefixes(homes):
    project, _, env = homes
    assert (
        config.mirrored_base("quay.io/pypa/manylinux2014_x86_64", env)[0]
        == "quay.io/pypa/manylinux2014_x86_64"
    )
    write(project, 'quay_registry = "reg.corp:5000/quay/"\ndocker_registry = "reg.corp:5000/hub"\n')
    cfg = config.load(env)
    base, how = config.mirrored_base("quay.io/pypa/manylinux2014_aarch64", env, cfg)
    assert base == "reg.corp:5000/quay/pypa/manylinux2014_aarch64" and how is not None
    assert (
        config.mirrored_base("ubuntu:22.04", env, cfg)[0]
        == "reg.corp:5000/hub/library/ubuntu:22.04"
    )
    assert (
        config.mirrored_base("openeuler/openeuler:22.03", env, cfg)[0]
        == "reg.corp:5000/hub/openeuler/openeuler:22.03"
    )
    assert (
        config.mirrored_base("registry.local/team/base:1", env, cfg)[0]
        == "registry.local/team/base:1"
    )


def test_the_build_options_take_the_project_file_and_say_where_from(homes):
    from apexkit.wheel import options

    project, user, env = homes
    write(user, f'{GIT} = "file:///user.git"\nnvidia_apex_url = "file:///nvidia-user.git"\n')
    write(project, f'{GIT} = "file:///project.git"\ntorch_index_url = "https://mirror.corp/cpu"\n')
    opts = options.resolve("3.11", ["--dry-run"], env=env)
    assert opts.ascend_apex_url == "file:///project.git"
    assert opts.nvidia_apex_url == "file:///nvidia-user.git"
    assert opts.torch_index_url == "https://mirror.corp/cpu/"
    origins = dict(item.split("\t") for item in opts.origins)
    assert origins == {
        GIT: f"project {project}",
        "nvidia_apex_url": f"user {user}",
        "torch_index_url": f"project {project}",
    }
    opts = options.resolve("3.11", ["--ascend-apex-url", "file:///flag.git"], env=env)
    assert opts.ascend_apex_url == "file:///flag.git"


def test_pip_reads_its_own_variables_as_before(homes):
    from apexkit.wheel import options

    _, _, env = homes
    opts = options.resolve("3.11", [], env={**env, "PIP_INDEX_URL": "https://env.corp/simple/"})
    assert opts.index_url is None  # pip takes PIP_INDEX_URL itself; --index-url is not added


def test_the_user_file_is_updated_and_checked_first(homes):
    _, user, _ = homes
    write(user, f'{GIT} = "file:///keep.git"\n')
    after = config.updated_file(user, {"index_url": "https://m.corp/simple"})
    assert b"keep.git" in after and b'index_url = "https://m.corp/simple/"' in after
    write(user, 'index_ur = "x"\n')
    with pytest.raises(ConfigError, match="did you mean index_url"):
        config.updated_file(user, {"index_url": "https://m.corp/simple"})


def test_install_and_the_run_venvs_read_the_config_files_too(homes, tmp_path):
    """The team index reaches `apexkit install` / `up`, the torch index reaches validate/bench's run venv, from a
    config file alone (no flag, no variable), as they reach the build."""
    from apexkit import venvrun
    from apexkit.install import run as install_run
    from apexkit.wheel import venvs

    _project, user, env = homes
    index_dir = tmp_path / "team-index"
    index_dir.mkdir()
    write(
        user,
        f'team_indexes = ["{index_dir}"]\ntorch_index_url = "http://127.0.0.1:9/torch/simple"\n',
    )
    assert install_run.indexes_from(None, env) == [str(index_dir)]
    assert install_run.indexes_from(["file:///given/"], env) == ["file:///given/"]  # the flag wins
    none = venvs.IndexOptions()
    merged, _notes = venvrun.merge_sources(none, none, env, lambda: {})
    assert merged.torch_index_url == "http://127.0.0.1:9/torch/simple/"
    with_env = {**env, "APEXKIT_TORCH_INDEX_URL": "http://127.0.0.1:8/env/simple"}
    merged, _notes = venvrun.merge_sources(none, none, with_env, lambda: {})
    assert merged.torch_index_url == "http://127.0.0.1:8/env/simple/"  # the variable beats the file


def test_each_flag_of_a_setting_is_the_build_option_resolved_by_it():
    """config.SETTINGS' flag column (config.show, README's firewall table) is the declared build option whose
    config key is that setting: both ways."""
    from apexkit import declare
    from apexkit.wheel import options

    declared = {o.config: o.flag for o in declare.options_of(options.BuildOptions) if o.config}
    assert declared == {s.key: s.flag for s in config.SETTINGS if s.flag}
