"""One target-id scheme: a matrix combination names the dist/<target-id>/ its build writes, the one parser reads
every such id back, and the matrix's --target takes either the combination's id or that target id."""

from __future__ import annotations

import json

import pytest

from apexkit.errors import ConfigError
from apexkit.fleet import matrixrun
from apexkit.plan import matrix, target


def test_every_combination_names_a_target_id_the_parser_reads_back():
    for combo in matrix.load().combinations():
        facts = target.Target.from_id(combo.target_id).facts()
        assert (facts["python"], facts["torch"], facts["arch"], facts["torch_npu"]) == (
            combo.python,
            combo.torch,
            combo.arch,
            combo.torch_npu,
        )


def test_matrix_target_takes_the_combination_id_or_its_target_id(capsys):
    combo = matrix.load().combinations()[0]
    for chosen in (combo.id, combo.target_id):
        assert matrixrun.main(["--target", chosen, "--format", "json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [r["id"] for r in rows] == [combo.id]
    with pytest.raises(ConfigError, match="not in the matrix"):
        matrixrun.main(["--target", "py3.11-torch9.9.9-x86_64-master"])


@pytest.mark.parametrize(
    "hostile",
    [
        "py3.11-torchabc-x86_64-master",
        "py3.11-torch2.1.0-x86_64-master+npuX",
        "py3.11-" + "x" * 400,
        "\x1b[2J",
    ],
)
def test_a_target_id_apexkit_did_not_write_is_one_bounded_line(hostile):
    with pytest.raises(ConfigError, match="is not an apexkit target id") as refused:
        target.Target.from_id(hostile)
    assert len(refused.value.cause) < 220 and "\x1b" not in refused.value.cause
