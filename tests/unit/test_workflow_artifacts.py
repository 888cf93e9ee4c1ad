"""The CI build job uploads every file a build writes into dist/<target>/, so the index job's publish (which
re-hashes the SBOM and the provenance each manifest records, and refuses a missing one) gets what it checks."""

from __future__ import annotations

import fnmatch

import yaml
from conftest import ROOT

from apexkit.wheel import sbom

WORKFLOW = ROOT / ".github" / "workflows" / "build.yml"


def uploaded_patterns() -> list[str]:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["build"]["steps"]
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert len(uploads) == 1
    return uploads[0]["with"]["path"].split()


def test_the_build_job_uploads_every_file_of_a_dist_target():
    written = [
        "apex-0.1+ascend.torch2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "manifest.json",
        sbom.SBOM_FILE,
        sbom.PROVENANCE_FILE,
    ]
    patterns = uploaded_patterns()
    for name in written:
        path = f"dist/py3.11-torch2.13.0-x86_64-master/{name}"
        assert any(fnmatch.fnmatch(path, p) for p in patterns), (
            f"{name} is not uploaded by the build job"
        )
