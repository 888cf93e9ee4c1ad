"""Builder images and container builds, in-process: binfmt states, arch names, the image plan and its build args,
the container spec's mounts, option files, the image per Python, builder.json. The builds against a real Docker
engine are in tests/e2e/test_images.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from apexkit import dockerclient, netenv
from apexkit.errors import ConfigError, InterpreterNotFoundError
from apexkit.fleet import matrixrun
from apexkit.images import builder, container
from apexkit.plan import matrix
from apexkit.proxy import layers
from apexkit.wheel import options

HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
# where this machine keeps the torch 2.13.0 CPU wheel (pip finds it through PIP_FIND_LINKS / pip.conf find-links)
WHEELHOUSE = Path((os.environ.get("PIP_FIND_LINKS") or "/opt/wheels").split()[0])
X86_TAG = "apexkit/builder:debian-bookworm-x86_64"


# --- pure parts ------------------------------------------------------------------------------------------------------


def write_binfmt(directory: Path, entry: str | None, status: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if status:
        (directory / "status").write_text("enabled\n")
    if entry is not None:
        (directory / "qemu-aarch64").write_text(entry)
    return directory


QEMU_ENTRY = (
    "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: {flags}\noffset 0\n"
    "magic 7f454c460201010000000000000000000200b700\nmask ffffffffffffff00fffffffffffffffffeffffff\n"
)


@pytest.mark.parametrize(
    ("entry", "status", "usable", "says", "hint"),
    [
        (None, False, False, "binfmt_misc is not mounted", "mount -t binfmt_misc"),
        (
            None,
            True,
            False,
            "no QEMU handler for aarch64 is registered",
            "apt-get install qemu-user-static",
        ),
        (
            QEMU_ENTRY.format(flags="PF").replace("enabled", "disabled", 1),
            True,
            False,
            "registered but disabled",
            "update-binfmts --enable qemu-aarch64",
        ),
        (QEMU_ENTRY.format(flags="P"), True, False, "without the F (fix-binary) flag", "flags F"),
        (
            QEMU_ENTRY.format(flags="PF"),
            True,
            True,
            "QEMU /usr/libexec/qemu-binfmt/aarch64-binfmt-P (flags PF)",
            "",
        ),
    ],
)
def test_emulation_states(tmp_path, entry, status, usable, says, hint):
    state = builder.emulation(
        "aarch64", write_binfmt(tmp_path / "binfmt", entry, status), host="x86_64"
    )
    assert state.usable is usable and not state.native
    assert says in state.detail
    assert hint in state.hint
    assert builder.emulation("x86_64", tmp_path / "nothing", host="x86_64").native


def test_arch_names():
    assert [dockerclient.normalize_arch(a) for a in ("amd64", "x86_64", "ARM64", "aarch64")] == [
        "x86_64",
        "x86_64",
        "aarch64",
        "aarch64",
    ]
    with pytest.raises(Exception, match="unknown architecture 's390x'"):
        dockerclient.normalize_arch("s390x")


def test_image_plan_proxies_only_as_predefined_build_args(tmp_path):
    environ = {
        "http_proxy": "http://u:pw@127.0.0.1:3128",
        "PIP_INDEX_URL": "https://mirror.example.com/simple/",
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    plan = builder.plan_image(
        builder.ImageOptions("arm64", "debootstrap:bookworm", ca_cert=HOST_CA),
        environ=environ,
        binfmt_dir=write_binfmt(tmp_path / "binfmt", QEMU_ENTRY.format(flags="PF")),
    )
    assert plan.arch == "aarch64" and plan.tag == "apexkit/builder:debian-bookworm-aarch64"
    assert plan.base_ref == "apexkit/base:debian-bookworm-aarch64"
    proxies = {k for k in plan.build_args if "proxy" in k.lower()}
    assert proxies == {
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "no_proxy",
        "NO_PROXY",
    }
    assert proxies <= set(netenv.DOCKER_PROXY_ARGS)
    assert plan.network == "host"  # the proxy listens on loopback
    assert plan.build_args["APEXKIT_PIP_INDEX_URL"] == "https://mirror.example.com/simple/"
    assert "pw" not in " ".join(v for _, v in plan.describe())  # masked
    assert plan.labels["org.apexkit.recipe"] == builder.recipe_digest()
    # the Dockerfile never declares a proxy ARG (a declared one would land in `docker history`)
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert not [
        line
        for line in dockerfile.splitlines()
        if line.startswith("ARG") and "PROXY" in line.upper()
    ]
    with pytest.raises(Exception, match="holds a password"):
        builder.plan_image(
            builder.ImageOptions("x86_64", "debian"),
            environ={"PIP_INDEX_URL": "https://u:pw@m.example.com/simple/", "HOME": str(tmp_path)},
        )


def test_tool_requirements_come_from_the_runtime_pins():
    text = builder.tool_requirements()
    pins = dict(
        line.split("==")
        for line in (ROOT / "requirements" / "runtime.in").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for name in builder.TOOL_REQUIREMENTS:
        assert f"{name}=={pins[name]}" in text
    assert "pytest" not in text and "docker==" not in text


def test_container_spec_mounts_only_workspace_cache_and_named_inputs(tmp_path):
    src = tmp_path / "ascend"
    src.mkdir()
    argv = [
        "--image",
        X86_TAG,
        "--wheelhouse",
        str(WHEELHOUSE),
        "--dist",
        str(tmp_path / "dist"),
        f"--build-dir={tmp_path / 'build'}",
        "--jobs",
        "2",
        "--network=host",
    ]
    opts = options.resolve(
        "3.11",
        argv,
        env={
            "APEXKIT_ASCEND_APEX_URL": f"file://{src}",
            "APEXKIT_CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    labels = {"org.apexkit.uid": "1000", "org.apexkit.gid": "1001"}
    environ = {
        "PIP_INDEX_URL": "https://mirror.example.com/simple/",
        "PIP_FIND_LINKS": "/opt/wheels",
        "APEXKIT_FETCH_RETRIES": "5",
        "SECRET_TOKEN": "x",
    }
    settings = layers.ProxySettings(
        http="http://u:pw@proxy.example.com:3128", https="http://u:pw@proxy.example.com:3128"
    )
    spec = container.make_spec(
        opts, X86_TAG, labels, "x86_64", environ=environ, settings=settings, euid=0
    )
    assert spec.user == "1000:1001"  # root invoking: the image's build user, never root
    volumes = spec.volumes()
    assert volumes == {
        str(ROOT): {"bind": "/apexkit", "mode": "ro"},
        str(tmp_path / "build" / "containers" / "builder-debian-bookworm-x86_64-py3.11"): {
            "bind": "/workspace",
            "mode": "rw",
        },
        str(tmp_path / "cache" / "containers" / "builder-debian-bookworm-x86_64"): {
            "bind": "/cache",
            "mode": "rw",
        },
        str(WHEELHOUSE): {"bind": "/mnt/apexkit/wheelhouse-0", "mode": "ro"},
        str(src): {"bind": "/mnt/apexkit/ascend-apex", "mode": "ro"},
    }
    # the parsed options travel as JSON (no argv parsed again in the container), every host path replaced
    assert spec.command == [
        "/opt/apexkit/venv/bin/python",
        "-m",
        "apexkit",
        "build",
        "3.11",
        "--options-json",
        "/workspace/options.json",
    ]
    inside = spec.options
    assert (inside["dist_dir"], inside["build_dir"], inside["cache_dir"]) == (
        "/workspace/dist",
        "/workspace/build",
        "/cache",
    )
    assert inside["wheelhouses"] == ["/mnt/apexkit/wheelhouse-0"] and inside["jobs"] == 2
    assert inside["ascend_apex_url"] == "file:///mnt/apexkit/ascend-apex"
    assert (
        inside["image"] is inside["network"] is inside["ca_bundle"] is inside["python_path"] is None
    )
    assert str(tmp_path) not in json.dumps(inside)  # no host path reaches the container's options
    # the proxy's login travels in the options file's environment (review 2026-12-01, L3), set by load_json
    assert inside[options.ENVIRONMENT]["https_proxy"] == "http://u:pw@proxy.example.com:3128"
    (tmp_path / "options.json").write_text(
        json.dumps({k: v for k, v in inside.items() if k != options.ENVIRONMENT})
    )
    again = options.resolve("3.11", ["--options-json", str(tmp_path / "options.json")])
    assert again == options.from_json(inside, "3.11") and again.jobs == 2 and again.image is None
    env = spec.environment
    # source URLs (they may carry a token) travel in the options file only, never in the container's environment
    assert "APEXKIT_ASCEND_APEX_URL" not in env and "APEXKIT_NVIDIA_APEX_URL" not in env
    assert inside["nvidia_apex_url"].startswith("https://")
    # any index URL too (a token may be a path segment): the options file's environment sets it inside
    assert "PIP_INDEX_URL" not in env and env["APEXKIT_FETCH_RETRIES"] == "5"
    assert inside[options.ENVIRONMENT]["PIP_INDEX_URL"] == "https://mirror.example.com/simple/"
    assert (
        "PIP_FIND_LINKS" not in env and "SECRET_TOKEN" not in env
    )  # host paths and unrelated variables stay out
    assert "https_proxy" not in env and "HTTPS_PROXY" not in env and "u:pw" not in json.dumps(env)
    assert spec.network == "host"
    # a non-root user builds as itself, so what it writes is its own
    spec2 = container.make_spec(opts, X86_TAG, labels, "x86_64", environ={}, euid=4321)
    assert spec2.user.startswith("4321:")


def test_an_options_file_is_refused_when_mixed_or_foreign(tmp_path):
    bad = tmp_path / "options.json"
    bad.write_text(json.dumps({"python": "3.11", "rm_rf": True}))
    with pytest.raises(ConfigError, match="unknown fields rm_rf"):
        options.resolve("3.11", ["--options-json", str(bad)])
    good = options.to_json(options.resolve("3.11", ["--dry-run"]))
    for field, value, says in (
        ("jobs", "4", "jobs is not a int"),
        ("use_cache", "no", "use_cache is not a bool"),
        ("skip_patches", "abc", "skip_patches is not a tuple"),
        ("dist_dir", 5, "dist_dir is not"),
        ("wheelhouses", None, "wheelhouses is not"),
        ("image", "x", "image cannot be set"),
        ("python_path", "/usr/bin/python3", "python_path cannot be set"),
        ("jobs", -3, "jobs -3 is not at least 1"),
    ):
        with pytest.raises(ConfigError, match=says):
            options.from_json({**good, field: value}, "3.11")
    with pytest.raises(ConfigError, match="pass it alone"):
        options.resolve("3.11", ["--options-json", str(bad), "--torch", "2.1.0"])
    with pytest.raises(ConfigError, match="is a host path"):
        options.resolve("3.11", ["--image", X86_TAG, "--interpreter", sys.executable])


def test_build_options_for_containers_need_image():
    with pytest.raises(Exception, match="apply to container builds only"):
        options.resolve("3.11", ["--network", "host"], env={})


def test_image_choice_per_python_follows_matrix_toml():
    data = matrix.load().data
    chosen = {
        py: builder.choose_image(data, py, "aarch64")
        for py in ("3.8", "3.9", "3.10", "3.11", "3.13")
    }
    assert {py: c.image for py, c in chosen.items()} == {
        "3.8": "apexkit/builder:manylinux2014_aarch64-aarch64",
        "3.9": "apexkit/builder:debian-bullseye-aarch64",
        "3.10": "apexkit/builder:manylinux2014_aarch64-aarch64",
        "3.11": "apexkit/builder:debian-bookworm-aarch64",
        "3.13": "apexkit/builder:debian-trixie-aarch64",
    }
    assert (
        chosen["3.9"].build_command
        == "apexkit image.build --arch aarch64 --base debootstrap:bullseye"
    )
    # the image `image.build --base <that base>` makes is the one chosen (no --tag needed)
    for c in chosen.values():
        suite = builder.debootstrap_suite(c.base)
        assert builder.default_tag(f"debian:{suite}" if suite else c.base, "aarch64") == c.image
    assert (
        chosen["3.8"].base == "quay.io/pypa/manylinux2014_aarch64"
        and "no Debian suite" in chosen["3.8"].note
    )
    # a Python without a row: [matrix] image
    assert (
        builder.choose_image({"matrix": {"image": "x/y:{arch}"}}, "3.12", "x86_64").image
        == "x/y:x86_64"
    )


def test_missing_image_hint_names_its_arch_and_base():
    data = matrix.load().data
    assert (
        builder.build_hint("apexkit/builder:debian-bookworm-aarch64")
        == "apexkit image.build --arch aarch64 --base debootstrap:bookworm"
    )
    assert (
        builder.build_hint("apexkit/builder:manylinux2014_aarch64-aarch64", data=data)
        == "apexkit image.build --arch aarch64 --base quay.io/pypa/manylinux2014_aarch64"
    )
    assert (
        builder.build_hint("registry.example.com/mine:1", arch="aarch64")
        == "apexkit image.build --arch aarch64 --base <base image> --tag registry.example.com/mine:1"
    )


BOOKWORM_JSON = {
    "arch": "aarch64",
    "pythons": [{"version": "3.11.2", "path": "/usr/bin/python3.11", "source": "distro"}],
}


def test_python_check_against_builder_json():
    data = matrix.load().data
    image = "apexkit/builder:debian-bookworm-aarch64"
    builder.require_python(BOOKWORM_JSON, image, "3.11", "aarch64", data)  # fits: no error
    builder.require_python(
        None, image, "3.8", "aarch64", data
    )  # no builder.json (older recipe): the build will say
    with pytest.raises(InterpreterNotFoundError) as exc:
        builder.require_python(
            BOOKWORM_JSON, image, "3.8", "aarch64", data, what="py3.8-torch2.1.0-aarch64"
        )
    assert exc.value.format() == (
        "py3.8-torch2.1.0-aarch64: apexkit/builder:debian-bookworm-aarch64 has Python 3.11 only -- next: Python 3.8 "
        "needs a base that has it: apexkit image.build --arch aarch64 --base quay.io/pypa/manylinux2014_aarch64 (then "
        "--image apexkit/builder:manylinux2014_aarch64-aarch64); no Debian suite has Python 3.8, or --pythons 3.8 "
        "(uv; downloads from github.com)"
    )
    with pytest.raises(
        InterpreterNotFoundError,
        match="--base debootstrap:bullseye \\(then --image "
        "apexkit/builder:debian-bullseye-aarch64\\)",
    ):
        builder.require_python(BOOKWORM_JSON, image, "3.9", "aarch64", data)


def test_matrix_image_states_without_a_daemon():
    m = matrix.load()
    combo = m.combinations([{"python": "3.8", "torch": "2.1.0", "arch": "aarch64"}])[0]
    assert matrixrun.check_image(m, combo, None, host="x86_64") == (
        "apexkit/builder:manylinux2014_aarch64-aarch64",
        "not checked",
        None,
    )
    assert matrixrun.check_image(m, combo, None, host="aarch64") == (
        "",
        "host",
        None,
    )  # native: no image
    assert matrixrun.build_options(m, combo, host="aarch64", image="mine:1")["image"] == "mine:1"


def test_plan_with_more_pythons(tmp_path):
    environ = {"HOME": str(tmp_path)}
    plan = builder.plan_image(
        builder.ImageOptions("x86_64", "debootstrap:bullseye", pythons="3.8, 3.10,3.8"),
        environ=environ,
    )
    assert plan.build_args["APEXKIT_PYTHONS"] == "3.8 3.10"
    assert plan.build_args["APEXKIT_UV_VERSION"] == matrix.load().data["matrix"]["images"]["uv"]
    assert (
        "pythons",
        "3.8, 3.10 where the base lacks them: uv "
        f"{plan.build_args['APEXKIT_UV_VERSION']} python install (downloads from github.com)",
    ) in plan.describe()
    assert (
        "APEXKIT_PYTHONS"
        not in builder.plan_image(
            builder.ImageOptions("x86_64", "debian"), environ=environ
        ).build_args
    )
    with pytest.raises(ConfigError, match="--pythons 3.8,2.7: '2.7' is not a supported Python"):
        builder.plan_image(
            builder.ImageOptions("x86_64", "debian", pythons="3.8,2.7"), environ=environ
        )


def test_builder_json_from_an_image_is_untrusted():
    """python_versions reads only well-formed entries: a lying image's builder.json is no traceback."""
    assert builder.python_versions({"pythons": "3.11"}) == []
    assert builder.python_versions({"pythons": [{"version": 3.11}, "x", {"version": "3.9.2"}]}) == [
        "3.9"
    ]


def test_bases_and_pythons_come_through_the_configured_mirrors(tmp_path):
    """quay.io and Docker Hub bases through the registry prefixes (issue 27: no override for quay.io before); the
    uv Python mirror reaches `uv python install` as a build arg, never one holding a password."""
    environ = {
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "APEXKIT_QUAY_REGISTRY": "registry.corp:5000/quay",
        "APEXKIT_DOCKER_REGISTRY": "registry.corp:5000/hub",
        "UV_PYTHON_INSTALL_MIRROR": "https://mirror.corp/pbs",
    }
    plan = builder.plan_image(
        builder.ImageOptions("x86_64", "quay.io/pypa/manylinux2014_x86_64", pythons="3.8"),
        environ=environ,
    )
    assert plan.base_ref == "registry.corp:5000/quay/pypa/manylinux2014_x86_64"
    assert plan.tag == builder.default_tag("quay.io/pypa/manylinux2014_x86_64", "x86_64")
    assert plan.build_args["BASE_IMAGE"] == plan.base_ref
    assert plan.build_args["UV_PYTHON_INSTALL_MIRROR"] == "https://mirror.corp/pbs"
    assert dict(plan.describe())["pythons"].endswith("(downloads from https://mirror.corp/pbs)")
    hub = builder.plan_image(builder.ImageOptions("x86_64", "ubuntu:22.04"), environ=environ)
    assert hub.base_ref == "registry.corp:5000/hub/library/ubuntu:22.04"
    assert "UV_PYTHON_INSTALL_MIRROR" not in hub.build_args  # only with --pythons
    with pytest.raises(ConfigError, match="password or token"):
        builder.plan_image(
            builder.ImageOptions("x86_64", "debootstrap:bookworm", pythons="3.8"),
            environ={**environ, "UV_PYTHON_INSTALL_MIRROR": "https://u:pw@mirror.corp/pbs"},
        )
