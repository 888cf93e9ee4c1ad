"""tools/testtools.py: what `nox -s tests-e2e` installs and registers, and only when asked
(APEXKIT_INSTALL_SYSTEM_TOOLS=1 or CI=true, as root); the skip reasons name the install command. The sessions
themselves are run in tests/e2e/test_safe_defaults.py."""

from __future__ import annotations

import os

import pytest

from tools import systools, testtools

EVERYTHING_MISSING = lambda commands: list(commands)  # noqa: E731 - a bare machine


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"CI": "false"},
        {"CI": "true", testtools.OPT_IN: "0"},
        {testtools.OPT_IN: "1", "CI": "true", "_root": ""},
    ],
)
def test_without_the_opt_in_nothing_is_installed_or_registered(environ):
    can_install = "_root" not in environ  # the last case: asked, but not root + apt: nothing either
    plan = testtools.decide(environ, can_install=can_install, missing=EVERYTHING_MISSING)
    assert plan.install == () and not plan.register_binfmt and not plan.require_services
    assert set(plan.not_installed) == {*systools.TEST_PACKAGES, *systools.QEMU_PACKAGES}
    assert set(plan.missing_build_tools) == set(systools.DEBIAN_PACKAGES)


@pytest.mark.parametrize(
    "environ", [{"CI": "true"}, {testtools.OPT_IN: "1"}, {"CI": "false", testtools.OPT_IN: "1"}]
)
def test_with_the_opt_in_as_root_everything_missing_is_installed(environ):
    plan = testtools.decide(environ, can_install=True, missing=EVERYTHING_MISSING)
    wanted = {"docker.io", "tinyproxy", "debootstrap", "qemu-user-static", "binfmt-support", "g++"}
    assert wanted <= set(testtools.packages(plan.install))
    assert plan.register_binfmt and plan.require_services
    # what the session hands to systools.ensure: commands it knows (here, on this machine, a dry run)
    assert set(plan.install) == {
        *systools.DEBIAN_PACKAGES,
        *systools.TEST_PACKAGES,
        *systools.QEMU_PACKAGES,
    }
    assert set(systools.ensure(plan.install, dry_run=True)) <= set(testtools.packages(plan.install))


def test_skip_reason_names_the_exact_install_command():
    reason = testtools.skip_reason("apexkit-no-such-tool", "dockerd")
    sudo = "" if os.geteuid() == 0 else "sudo "
    assert reason.startswith("apexkit-no-such-tool") and "not installed" in reason
    assert (
        f"install: {sudo}apt-get install -y --no-install-recommends apexkit-no-such-tool" in reason
    )
    assert f"{testtools.OPT_IN}=1 nox -s tests" in reason
