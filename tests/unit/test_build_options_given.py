"""A matrix combination reaches the build as typed options (nox -s build-<combo>), not as a command line parsed
again; the same options as a command line are what another process (a local matrix run, a Slurm job) is given."""

from __future__ import annotations

import pytest

from apexkit.errors import ConfigError
from apexkit.fleet import matrixrun
from apexkit.plan import matrix
from apexkit.wheel import options


@pytest.fixture(scope="module")
def m():
    return matrix.load()


def test_a_combination_is_the_same_build_typed_or_as_a_command_line(m, tmp_path):
    combos = m.combinations(
        [
            {"python": "3.11", "torch": "2.13.0", "arch": "x86_64"},
            {
                "python": "3.11",
                "torch": "2.7.1",
                "torch_npu": "2.7.1.post8",
                "arch": "x86_64",
                "ref": "v2.7.1",
            },
        ]
    )
    common = ["--dist", str(tmp_path / "dist"), "--dry-run"]
    for combo in combos:
        typed = options.resolve(
            "3.11", common, env={}, given=matrixrun.build_options(m, combo, host="x86_64")
        )
        parsed = options.resolve(
            "3.11", [*matrixrun.build_args(m, combo, host="x86_64"), *common], env={}
        )
        assert typed == parsed
        assert typed.torch == combo.torch and typed.torch_npu == combo.torch_npu


def test_the_command_line_still_overrides_and_contradictions_are_one_line(m, tmp_path):
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    given = matrixrun.build_options(m, combo, host="x86_64")
    assert options.resolve("3.11", ["--torch", "2.12.0"], env={}, given=given).torch == "2.12.0"
    with pytest.raises(ConfigError, match="contradict each other"):
        options.resolve("3.11", ["--use-system-torch"], env={}, given=given)
    with pytest.raises(ConfigError, match="unknown build option"):
        options.resolve("3.11", [], env={}, given={"torhc": "2.13.0"})


def test_a_foreign_arch_combination_is_given_its_builder_image(m):
    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "aarch64"}])[0]
    given = matrixrun.build_options(m, combo, host="x86_64")
    assert given["image"] == matrixrun.build_args(m, combo, host="x86_64")[-1]


def test_options_json_does_not_silently_drop_a_combinations_given_options(m, tmp_path):
    """--options-json carries a whole build (a container's): with a combination's typed options (nox -s
    build-<combo> -- --options-json F) it would build what F says under the combination's name."""
    import json

    combo = m.combinations([{"python": "3.11", "torch": "2.13.0", "arch": "x86_64"}])[0]
    other = options.resolve("3.11", ["--torch", "2.12.0", "--dry-run"], env={})
    path = tmp_path / "options.json"
    path.write_text(json.dumps({**options.to_json(other), "python_path": None}))
    assert options.resolve("3.11", ["--options-json", str(path)], env={}).torch == "2.12.0"
    with pytest.raises(ConfigError, match="--options-json"):
        options.resolve(
            "3.11",
            ["--options-json", str(path)],
            env={},
            given=matrixrun.build_options(m, combo, host="x86_64"),
        )
