"""What a container leaves in its workspace is untrusted (issue 13, items 1 and 2): the host never writes through it
and takes back only a plain, verified wheel. No Docker: each workspace is laid out as a malicious image would leave it,
and the host-side functions run on it for real."""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path

import fakes
import pytest

from apexkit import dockerclient
from apexkit.errors import ImageError
from apexkit.images import container
from apexkit.wheel import options

TARGET = "py3.11-torch2.13.0-x86_64-master"
WHEEL = "apex-0.1+ascend.torch2.13.0-cp311-cp311-linux_x86_64.whl"
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n"
IMAGE = "apexkit/builder:debian-bookworm-x86_64"


PLANNED = fakes.PLANNED
planned = fakes.planned


class Layout:
    """A host (secret file, victim file, dist/) and a container workspace under tmp_path."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.secret = tmp / "home" / ".ssh" / "id_rsa"
        self.secret.parent.mkdir(parents=True)
        self.secret.write_bytes(SECRET)
        os.chmod(self.secret, 0o600)
        self.victim = tmp / "etc" / "cron.d" / "victim"
        self.victim.parent.mkdir(parents=True)
        self.victim.write_text("# the host's own file\n")
        self.dist = tmp / "dist"
        self.workspace = tmp / "build" / "containers" / "builder-debian-bookworm-x86_64-py3.11"
        self.produced = self.workspace / "dist" / TARGET
        self.produced.mkdir(parents=True)
        self.spec = container.ContainerSpec(
            image=IMAGE,
            arch="x86_64",
            command=[],
            user="1000:1000",
            uid=1000,
            mounts=[container.Mount(self.workspace, container.WORKSPACE, False, "workspace")],
            environment={},
            network=None,
            workspace=self.workspace,
            cache=tmp / "cache",
        )

    def wheel(self, name: str = WHEEL) -> bytes:
        path = self.produced / name
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("apex/__init__.py", "")
        return path.read_bytes()

    def manifest(self, file: str, sha256: str, size: int = 1, **target) -> None:
        (self.produced / "manifest.json").write_text(
            json.dumps(
                {
                    "target": {**PLANNED[TARGET], **target},
                    "wheel": {"file": file, "sha256": sha256, "size": size},
                }
            )
        )

    def publish(self, force: bool = False) -> Path:
        return container._publish(
            self.produced,
            self.dist,
            self.spec,
            {"org.apexkit.base": "debian"},
            1.0,
            force,
            planned=planned,
        )

    def refused(self) -> ImageError:
        with pytest.raises(ImageError) as info:
            self.publish()
        error = info.value
        assert error.exit_code == 10 and "\n" not in error.format() and "refusing" in error.format()
        assert (
            self.secret.read_bytes() == SECRET
            and self.victim.read_text() == "# the host's own file\n"
        )
        assert not self.dist.exists() or targets(self.dist) == [], "nothing may reach dist/"
        return error


def targets(dist: Path) -> list[str]:
    """What dist/ holds besides distdir's lock folder (.locks: the lock files of dist/<target> swaps)."""
    return sorted(p.name for p in dist.iterdir() if p.name != ".locks")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def host(tmp_path) -> Layout:
    return Layout(tmp_path)


# --- item 2: the wheel taken back from the workspace ---------------------------------------------------------------


def test_a_plain_wheel_is_copied_and_its_manifest_rewritten_from_the_host_copy(host):
    data = host.wheel()
    host.manifest(WHEEL, sha(data), size=12345)  # the container's size is not taken over
    final = host.publish()
    assert final == host.dist / TARGET
    assert (final / WHEEL).read_bytes() == data and not (final / WHEEL).is_symlink()
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["wheel"] == {"file": WHEEL, "sha256": sha(data), "size": len(data)}
    assert (
        manifest["builder_image"]["image"] == IMAGE
        and manifest["builder_image"]["base"] == "debian"
    )
    assert targets(host.dist) == [TARGET]  # no temporary directory left


def test_absolute_wheel_path_is_refused(host):
    host.manifest(str(host.secret), sha(SECRET))
    assert "is not a plain *.whl file name" in host.refused().format()


def test_absolute_whl_path_is_refused(host):
    whl = host.tmp / "home" / "stolen.whl"
    whl.write_bytes(SECRET)
    host.manifest(str(whl), sha(SECRET))
    assert "is not a plain *.whl file name" in host.refused().format()


@pytest.mark.parametrize(
    "name",
    [
        "../../../../../home/.ssh/id_rsa",
        "../x-1.0-py3-none-any.whl",
        "..",
        "",
        "sub/apex-0.1-py3-none-any.whl",
    ],
)
def test_names_that_leave_the_target_directory_are_refused(host, name):
    (host.workspace / "dist" / "x-1.0-py3-none-any.whl").write_bytes(SECRET)
    host.manifest(name, sha(SECRET))
    host.refused()


def test_a_symlinked_wheel_is_refused(host):
    (host.produced / WHEEL).symlink_to(host.secret)
    host.manifest(WHEEL, sha(SECRET))  # even with the secret's own digest
    assert "is a symbolic link" in host.refused().format()


def test_a_name_that_is_no_wheel_file_name_is_refused(host):
    (host.produced / "id_rsa.whl").write_bytes(host.wheel())
    host.manifest("id_rsa.whl", sha((host.produced / "id_rsa.whl").read_bytes()))
    assert "is not a valid wheel file name" in host.refused().format()


def test_a_digest_other_than_the_manifest_says_is_refused(host):
    host.wheel()
    host.manifest(WHEEL, "0" * 64)
    assert "its manifest says" in host.refused().format()


def test_a_wheel_that_is_not_a_zip_is_refused(host):
    (host.produced / WHEEL).write_bytes(SECRET)
    host.manifest(WHEEL, sha(SECRET))
    assert "is not a readable zip archive" in host.refused().format()


def test_a_fifo_named_like_a_wheel_is_refused_without_blocking(host):
    os.mkfifo(host.produced / WHEEL)
    host.manifest(WHEEL, sha(b""))
    assert "is not a regular file" in host.refused().format()


def test_a_symlinked_manifest_is_refused(host):
    data = host.wheel()
    elsewhere = host.tmp / "home" / "settings.json"
    elsewhere.write_text(
        json.dumps({"wheel": {"file": WHEEL, "sha256": sha(data)}, "token": "s3cret"})
    )
    (host.produced / "manifest.json").symlink_to(elsewhere)
    assert "is a symbolic link" in host.refused().format()


def test_a_manifest_without_wheel_fields_is_refused(host):
    host.wheel()
    (host.produced / "manifest.json").write_text(json.dumps({"wheel": {"file": ["x"]}}))
    assert "has no wheel.file" in host.refused().format()


def test_a_symlinked_target_directory_is_neither_listed_nor_copied(host):
    """dist/<target> -> a host directory holding a wheel-looking copy of the secret and a matching manifest."""
    loot = host.tmp / "home" / "loot"
    loot.mkdir()
    with zipfile.ZipFile(loot / WHEEL, "w") as zf:
        zf.writestr("id_rsa", SECRET)
    (loot / "manifest.json").write_text(
        json.dumps({"wheel": {"file": WHEEL, "sha256": sha((loot / WHEEL).read_bytes())}})
    )
    os.rmdir(host.produced)
    host.produced.symlink_to(loot)
    assert container.produced_targets(host.workspace) == []
    assert "is not a directory" in host.refused().format()


def test_a_symlinked_workspace_dist_is_neither_listed_nor_copied_nor_emptied(host):
    loot = host.tmp / "home" / "loot"
    (loot / TARGET).mkdir(parents=True)
    with zipfile.ZipFile(loot / TARGET / WHEEL, "w") as zf:
        zf.writestr("id_rsa", SECRET)
    data = (loot / TARGET / WHEEL).read_bytes()
    (loot / TARGET / "manifest.json").write_text(
        json.dumps({"wheel": {"file": WHEEL, "sha256": sha(data)}})
    )
    os.rmdir(host.produced)
    os.rmdir(host.workspace / "dist")
    (host.workspace / "dist").symlink_to(loot)
    assert container.produced_targets(host.workspace) == []
    assert "is not a directory" in host.refused().format()
    # the next run clears the workspace's dist/: the link goes, what it pointed at stays
    container._clear_workspace_dist(host.workspace)
    assert not (host.workspace / "dist").exists() and (loot / TARGET / WHEEL).read_bytes() == data


def test_a_refused_build_leaves_the_previous_target_in_place(host):
    previous = host.dist / TARGET
    previous.mkdir(parents=True)
    (previous / WHEEL).write_bytes(b"the good wheel")
    (previous / "manifest.json").write_text("{}")
    (host.produced / WHEEL).symlink_to(host.secret)
    host.manifest(WHEEL, sha(SECRET))
    with pytest.raises(ImageError):
        host.publish()
    assert targets(host.dist) == [TARGET]
    assert (previous / WHEEL).read_bytes() == b"the good wheel"


def test_only_real_target_directories_are_listed(host):
    host.manifest(WHEEL, sha(host.wheel()))
    (host.workspace / "dist" / "loose-file").write_text("")
    (host.workspace / "dist" / ".hidden").mkdir()
    (host.workspace / "dist" / ".hidden" / "manifest.json").write_text("{}")
    (host.workspace / "dist" / "linked").symlink_to(host.produced)
    assert container.produced_targets(host.workspace) == [host.produced]


# --- item 1: the container's output as the host writes it ----------------------------------------------------------


def test_the_host_log_lives_outside_every_mount_the_container_can_write(tmp_path):
    argv = ["--image", IMAGE, "--dist", str(tmp_path / "dist"), f"--build-dir={tmp_path / 'build'}"]
    opts = options.resolve("3.11", argv, env={"APEXKIT_CACHE_DIR": str(tmp_path / "cache")})
    spec = container.make_spec(opts, IMAGE, {}, "x86_64", environ={}, euid=4321)
    writable = [m.host for m in spec.mounts if not m.read_only]
    assert spec.workspace in writable
    for mount in writable:
        assert mount not in spec.log_path.parents, f"{spec.log_path} is inside the rw mount {mount}"
    assert (
        spec.log_path
        == tmp_path / "build" / "containers" / "builder-debian-bookworm-x86_64-py3.11.log"
    )


def test_a_container_log_symlink_left_in_the_workspace_is_not_written_through(host):
    (host.workspace / "container.log").symlink_to(host.victim)
    with dockerclient.open_log(host.spec.log_path, "container log") as fh:
        container.stream_output([b"* * * * * root sh -c 'id > /tmp/pwned'\n", b"tail"], fh)
    assert host.victim.read_text() == "# the host's own file\n"
    assert host.spec.log_path.read_text() == "* * * * * root sh -c 'id > /tmp/pwned'\ntail\n"


def test_the_host_log_is_never_opened_through_a_symlink(host):
    host.spec.log_path.symlink_to(host.victim)
    with pytest.raises(ImageError, match="is a symbolic link") as info:
        dockerclient.open_log(host.spec.log_path, "container log")
    assert info.value.exit_code == 10 and "-- next: remove" in info.value.format()
    assert host.victim.read_text() == "# the host's own file\n"


def test_the_host_log_is_never_a_fifo_or_a_hard_link(host):
    os.mkfifo(host.spec.log_path)
    with pytest.raises(ImageError, match="not a regular file"):
        dockerclient.open_log(
            host.spec.log_path, "container log"
        )  # O_NONBLOCK: refused, not blocked
    os.unlink(host.spec.log_path)
    os.link(host.victim, host.spec.log_path)
    with pytest.raises(ImageError, match="one link"):
        dockerclient.open_log(host.spec.log_path, "container log")
    assert host.victim.read_text() == "# the host's own file\n"


def test_the_host_log_is_truncated_and_rewritten(host):
    host.spec.log_path.write_text("an older run's output, longer than this one\n")
    with dockerclient.open_log(host.spec.log_path, "container log") as fh:
        container.stream_output([b"new\n"], fh)
    assert host.spec.log_path.read_text() == "new\n"


# --- review 2026-12-01 M8: a zip bomb is refused from its headers, before anything is decompressed -------------------


def test_a_zip_bomb_member_is_refused_in_one_line_and_nothing_reaches_dist(host):
    path = host.produced / WHEEL
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("apex/__init__.py", "")
        with zf.open("apex/_C.so", "w") as fh:
            for _ in range(65):
                fh.write(b"\0" * (1 << 20))
    host.manifest(WHEEL, sha(path.read_bytes()))
    error = host.refused()
    assert "zip bomb" in error.format() and "apex/_C.so" in error.format()


def test_a_wheel_expanding_past_the_total_cap_is_refused(tmp_path):
    from apexkit import untrusted

    path = tmp_path / WHEEL
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(3):
            zf.writestr(f"apex/m{i}.py", os.urandom(4096))
    untrusted.check_zip(path)  # a plain wheel under the default cap
    with pytest.raises(untrusted.Untrusted, match="expand to .* GiB, more than"):
        untrusted.check_zip(path, total_max=8192)


# --- review 2026-12-01 L3: logins reach the container through the 0600 options file, never its environment --------


def test_index_and_proxy_logins_stay_out_of_the_container_environment_and_argv(
    tmp_path, monkeypatch
):
    import dataclasses

    from apexkit.proxy import layers

    monkeypatch.setenv("APEXKIT_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["--dist", str(tmp_path / "dist"), "--build-dir", str(tmp_path / "build")]
    opts = options.resolve("3.11", argv, env={})
    environ = {
        "PIP_INDEX_URL": "https://bob:PipS3cret@pypi.example.com/simple/",
        "PIP_EXTRA_INDEX_URL": "https://mirror.example.com/simple/ https://tok3nXYZ@x.example.com/simple/",
        "APEXKIT_TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu",
        "PIP_DEFAULT_TIMEOUT": "30",
    }
    settings = layers.ProxySettings(
        http="http://p:ProxyPW@proxy.example.com:3128",
        https="http://p:ProxyPW@proxy.example.com:3128",
    )
    spec = container.make_spec(opts, IMAGE, {}, "x86_64", environ=environ, settings=settings)
    secrets = ("PipS3cret", "ProxyPW", "tok3nXYZ")
    shown = json.dumps(
        {
            k: v
            for k, v in dataclasses.asdict(spec).items()
            if k != "options"  # the options file's content: 0600, the container user's
        },
        default=str,
    )
    for secret in secrets:
        assert secret not in json.dumps(spec.environment) and secret not in " ".join(spec.command)
        assert secret not in shown, secret
    # any URL may carry a token (a path segment too): only what holds none stays visible in the environment
    assert "APEXKIT_TORCH_INDEX_URL" not in spec.environment
    assert spec.environment["PIP_DEFAULT_TIMEOUT"] == "30"
    # the options file holds them, 0600 ...
    spec.workspace.mkdir(parents=True)
    with container._options_file(spec) as path:
        assert (path.stat().st_mode & 0o777) == 0o600
        written = path.read_text()
        assert all(secret in written for secret in secrets)
        # ... and the container's side (apexkit build 3.11 --options-json FILE) sets them in its environment
        inside: dict[str, str] = {"PATH": "/usr/bin"}
        loaded = options.load_json(path, "3.11", environ=inside)
    assert not path.exists()  # removed when the container is done
    assert loaded.python == "3.11" and loaded.dist_dir == Path("/workspace/dist")
    assert inside["PIP_INDEX_URL"] == environ["PIP_INDEX_URL"]
    assert inside["PIP_EXTRA_INDEX_URL"] == environ["PIP_EXTRA_INDEX_URL"]
    assert (
        inside["https_proxy"] == inside["HTTP_PROXY"] == "http://p:ProxyPW@proxy.example.com:3128"
    )
    assert (
        inside["APEXKIT_TORCH_INDEX_URL"] == environ["APEXKIT_TORCH_INDEX_URL"]
    )  # a URL: the file too


def test_an_options_file_environment_sets_only_index_and_proxy_variables(tmp_path):
    from apexkit.errors import ConfigError

    good = options.to_json(options.resolve("3.11", ["--dry-run"], env={}))
    for bad in ({"LD_PRELOAD": "/tmp/x.so"}, {"PATH": "/tmp"}, ["PIP_INDEX_URL"], {"PIP_X": 1}):
        path = tmp_path / "options.json"
        path.write_text(json.dumps({**good, options.ENVIRONMENT: bad}))
        os.chmod(path, 0o600)
        environ: dict[str, str] = {}
        with pytest.raises(ConfigError, match="environment is not an object") as info:
            options.load_json(path, "3.11", environ=environ)
        assert "\n" not in info.value.format() and environ == {}


# --- review 2026-12-01 M7: the host, not the container, says which dist/<target> a build replaces ------------------


def test_a_container_cannot_choose_another_target_to_replace(host):
    """A py3.11 build whose container leaves dist/py3.10-…/ (its own wheel, a manifest to match) replaced the host's
    good py3.10 wheel; now only the target the host planned is taken."""
    other = "py3.10-torch2.13.0-x86_64-master"
    good = host.dist / other
    good.mkdir(parents=True)
    (good / "manifest.json").write_text(json.dumps({"target": {"identity": {}}}))
    (good / "good.whl").write_text("the host's py3.10 wheel")
    host.produced = host.workspace / "dist" / other
    host.produced.mkdir(parents=True)
    data = host.wheel()
    host.manifest(WHEEL, sha(data), python="3.10", target_id=other)
    with pytest.raises(ImageError) as info:
        host.publish(force=True)  # not even --force lets the container choose
    assert "not this build's target (py3.11-torch2.13.0-x86_64-master)" in info.value.format()
    assert "\n" not in info.value.format() and "nothing was copied" in info.value.format()
    assert (good / "good.whl").read_text() == "the host's py3.10 wheel"
    assert targets(host.dist) == [other]


@pytest.mark.parametrize(
    "lie, says",
    [
        ({"python": "3.10"}, "target.python is '3.10', this build's is 3.11"),
        ({"torch": "2.12.0"}, "target.torch is '2.12.0'"),
        ({"arch": "aarch64"}, "target.arch is 'aarch64'"),
        ({"torch_npu": "2.13.0"}, "target.torch_npu is '2.13.0'"),
        ({"target_id": "py3.10-torch2.13.0-x86_64-master"}, "target.target_id is"),
        ({"torch": "2.13.0; rm -rf /"}, "target.torch .* is not a version"),
    ],
)
def test_a_manifest_whose_target_is_not_the_hosts_plan_is_refused(host, lie, says):
    data = host.wheel()
    host.manifest(WHEEL, sha(data), **lie)
    error = host.refused()
    assert re.search(says, error.format()), error.format()


def test_the_hosts_identity_is_recorded_and_compared_not_the_containers(host):
    data = host.wheel()
    # a container that claims the inputs of the wheel already there, to pass check_overwrite
    host.manifest(WHEEL, sha(data), identity={"skip_patches": ["cxx11-abi"]})
    existing = host.dist / TARGET
    existing.mkdir(parents=True)
    (existing / "manifest.json").write_text(
        json.dumps({"target": {"identity": {"skip_patches": ["cxx11-abi"]}}})
    )
    with pytest.raises(Exception, match="built from other inputs"):
        host.publish()
    assert (existing / "manifest.json").read_text().count("cxx11-abi") == 1
    final = host.publish(force=True)
    assert json.loads((final / "manifest.json").read_text())["target"]["identity"] == {}


def test_the_host_plans_the_targets_from_its_own_options(tmp_path):
    from apexkit.plan import matrix
    from apexkit.wheel import buildplan

    argv = ["--image", IMAGE, "--torch", "2.1.0", "--dist", str(tmp_path / "dist")]
    plain = buildplan.expected_targets(
        options.resolve("3.11", argv, env={}), matrix.load(), "x86_64"
    )
    # no --npu: the image may hold CANN and pair torch_npu itself; both ids are the host's
    assert sorted(plain) == [
        "py3.11-torch2.1.0-x86_64-master",
        "py3.11-torch2.1.0-x86_64-master+npu2.1.0.post17",
    ]
    npu = buildplan.expected_targets(
        options.resolve("3.11", [*argv, "--npu", "--skip-patch", "cxx11-abi"], env={}),
        matrix.load(),
        "aarch64",
    )
    assert list(npu) == ["py3.11-torch2.1.0-aarch64-master+npu2.1.0.post17+skip-cxx11-abi"]
    assert npu[next(iter(npu))]["identity"] == {
        "torch_npu": "2.1.0.post17",
        "skip_patches": ["cxx11-abi"],
    }
