"""publish's reading of dist/<target>/manifest.json, in-process: what a build left (or someone else put there) is one
ConfigError line whatever its shape. Publishing to a real index and pip installing from it: tests/e2e/test_publish.py."""

from __future__ import annotations

import pytest

from apexkit.errors import ConfigError
from apexkit.index import publish


@pytest.mark.parametrize("text", ["[1]", '"a string"', "null", "7"])
def test_a_manifest_that_is_json_but_not_an_object_is_one_line(tmp_path, text):
    target = tmp_path / "dist" / "py3.11-torch2.13.0-x86_64-master"
    target.mkdir(parents=True)
    (target / "manifest.json").write_text(text)
    with pytest.raises(ConfigError, match="not a readable JSON manifest"):
        publish.collect(tmp_path / "dist")
