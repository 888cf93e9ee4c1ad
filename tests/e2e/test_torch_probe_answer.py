"""The build venv's torch probe (Builder._torch_facts) answers with a JSON line: a line a torch prints after it (an
exit hook) is ignored, and no JSON object at all is the build's one-line BuildError naming its log, never exit 70
"apexkit bug" (review of issue 39's merge). A stand-in venv whose python is a shell script."""

from __future__ import annotations

import pytest

from apexkit.errors import BuildError
from apexkit.exits import exit_code
from apexkit.wheel import builder, venvs

FACTS = '{"lib": "/x", "site": "/x", "cxx11_abi": 1, "npu_lib": null, "interpreter": [], "cuda": "13.0"}'


def _venv(tmp_path, monkeypatch, answer: str) -> tuple[builder.Builder, venvs.Venv]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{answer}\n")
    python.chmod(0o755)
    build = object.__new__(builder.Builder)  # only what _torch_facts reads
    build.env = {"PATH": "/usr/bin:/bin"}
    monkeypatch.setattr(builder.Builder, "log_path", property(lambda self: tmp_path / "build.log"))
    return build, venvs.Venv(venv)


def test_a_line_printed_after_the_answer_is_ignored(tmp_path, monkeypatch):
    build, venv = _venv(tmp_path, monkeypatch, f"echo '{FACTS}'; echo 'Warning: printed at exit'")
    assert build._torch_facts(venv)["cuda"] == "13.0"


@pytest.mark.parametrize("answer", ["true", "echo '[1, 2]'", "echo 'Segmentation fault'"])
def test_a_probe_without_a_json_answer_is_one_build_error(tmp_path, monkeypatch, answer):
    build, venv = _venv(tmp_path, monkeypatch, answer)
    with pytest.raises(BuildError) as caught:
        build._torch_facts(venv)
    assert (
        "no JSON answer" in caught.value.cause and str(tmp_path / "build.log") in caught.value.hint
    )
    assert exit_code(lambda: build._torch_facts(venv)) == BuildError.exit_code
    assert not (venv.path / "apexkit-torch-facts.json").exists()
