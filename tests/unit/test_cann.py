"""One CANN locator (apexkit/cann.py) for the build, doctor and the fleet's node script."""

from __future__ import annotations

from apexkit import cann
from apexkit.doctor import machine
from apexkit.fleet import validate
from apexkit.wheel import builder


def test_a_sourced_set_env_wins_and_every_user_agrees(tmp_path):
    home = tmp_path / "ascend-toolkit" / "latest"
    home.mkdir(parents=True)
    for key in cann.VARIABLES:
        env = {key: str(home)}
        assert cann.home(env) == builder.detect_cann(env) == machine.cann_home(env) == str(home)
    assert cann.home({"ASCEND_HOME_PATH": str(tmp_path / "gone")}) in (None, *cann.HOMES)  # a stale variable: ignored
    assert cann.set_env_for(str(home)) == str(tmp_path / "ascend-toolkit" / "set_env.sh")
    assert cann.set_env_for("/usr/local/Ascend/cann") == "/usr/local/Ascend/cann/set_env.sh"


def test_the_fleet_tries_both_layouts_set_env_by_default():
    assert validate.SET_ENV == cann.SET_ENV_FILES
    assert validate.Plan.__dataclass_fields__["set_env"].default == cann.SET_ENV_FILES
