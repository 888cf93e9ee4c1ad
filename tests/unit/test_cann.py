"""One CANN locator (apexkit/cann.py) for the build, doctor and the fleet's node script."""

from __future__ import annotations

import re

from apexkit import cann
from apexkit.doctor import machine
from apexkit.fleet import validate


def test_a_sourced_set_env_wins_and_every_user_agrees(tmp_path):
    home = tmp_path / "ascend-toolkit" / "latest"
    home.mkdir(parents=True)
    for key in cann.VARIABLES:
        env = {key: str(home)}
        assert cann.home(env) == machine.cann_home(env) == str(home)
    assert cann.home({"ASCEND_HOME_PATH": str(tmp_path / "gone")}) in (
        None,
        *cann.HOMES,
    )  # a stale variable: ignored
    assert cann.set_env_for(str(home)) == str(tmp_path / "ascend-toolkit" / "set_env.sh")
    assert cann.set_env_for("/usr/local/Ascend/cann") == "/usr/local/Ascend/cann/set_env.sh"


def test_the_fleet_tries_both_layouts_set_env_by_default():
    assert validate.SET_ENV == cann.SET_ENV_FILES
    assert validate.Plan.__dataclass_fields__["set_env"].default == cann.SET_ENV_FILES


def test_the_bench_side_names_the_same_locations_and_variable():
    """bench/ cannot import apexkit (nor apexkit bench/): bench/targetenv.py repeats cann.py's facts, and is their only
    home in bench/ (the probes are single files run on their own, and name the variable themselves)."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location(
        "bench_targetenv", ROOT / "bench" / "targetenv.py"
    )
    targetenv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(targetenv)
    assert targetenv.CANN_HOMES == cann.HOMES
    assert targetenv.CANN_SET_ENV == cann.SET_ENV_FILES
    assert targetenv.CANN_VARIABLES == cann.VARIABLES
    assert targetenv.NO_AUTOLOAD == cann.NO_AUTOLOAD
    assert targetenv.cann_home({}) == cann.home({})
    for path in sorted((ROOT / "bench").rglob("*.py")):
        text = path.read_text()
        assert set(re.findall(r"TORCH_\w*AUTOLOAD\w*", text)) <= {cann.NO_AUTOLOAD}, path.name
        if path.parent.name == "bench" and path.name != "targetenv.py":
            assert cann.NO_AUTOLOAD not in text and "/usr/local/Ascend/" not in text, (
                f"{path.name}: use targetenv"
            )
