"""The doctor's data, in-process: every known failure signature against a real log (tests/data/failure-logs),
the apex data's sources, and the bounds of the apex scan. The doctor commands themselves run in
tests/e2e/test_doctor.py."""

from __future__ import annotations

from pathlib import Path

from conftest import DATA

from apexkit.wheel import known_failures

LOGS = DATA / "failure-logs"
VERBATIM_ELSEWHERE = {"cxx11-abi-mismatch"}  # tests/unit/test_log_and_failures.py


# --- known failures against real logs ------------------------------------------------------------------------------------


def test_every_signature_has_a_real_log_that_matches_only_it():
    ids = [f.id for f in known_failures.load()]
    assert len(ids) == len(set(ids))
    for failure_id in ids:
        if failure_id in VERBATIM_ELSEWHERE:
            continue
        log = LOGS / f"{failure_id}.log"
        assert log.is_file(), f"no real log for {failure_id}"
        assert [h.failure.id for h in known_failures.find(log.read_text())] == [failure_id], (
            failure_id
        )
    assert sorted(p.stem for p in LOGS.glob("*.log")) == sorted(set(ids) - VERBATIM_ELSEWHERE)


def assess(env_dir: Path | None, scripts: Path | None = None):
    from apexkit.doctor import apexneed
    from apexkit.plan import matrix

    env = apexneed.read_environment(str(env_dir / "bin" / "python")) if env_dir else None
    return apexneed.assess(env, scripts, apexneed.load(), matrix.load().data.get("stacks", {}))


def test_apex_data_has_a_source_and_date_for_every_fact():
    from apexkit.doctor import apexneed

    facts = apexneed.load()
    assert facts.read == "2026-11-30"
    assert {"mindspeed", "mindspeed-llm", "modellink"} <= set(facts.distributions)
    for table in facts.distributions.values():
        assert table["source"] and table["cite"] and table["read"] == "2026-11-30", table["name"]
    for pattern in facts.patterns:
        assert pattern.source and pattern.needs in ("always", "unless-standins"), pattern.id
    assert "NpuFusedAdamW" in facts.torch_npu_optimizers


def test_apex_scan_is_bounded(tmp_path):
    import dataclasses

    from apexkit.doctor import apexneed

    for i in range(5):
        (tmp_path / f"s{i}.py").write_text("import apex\n")
    facts = apexneed.load()
    facts = dataclasses.replace(facts, scan={**facts.scan, "max_files": 3})
    hits, notes = apexneed.scan_scripts(tmp_path, facts)
    assert [h.file for h in hits] == [f"{tmp_path}/s{i}.py" for i in range(3)]
    assert notes == [
        "scanned 3 file(s) under " + str(tmp_path),
        "scanned the first 3 .py files only",
    ]


def test_apex_scan_skips_binary_files(tmp_path):
    """A *.py with a NUL byte in its first 8 KiB is a binary: its bytes are no evidence, in the text or in --json."""
    (tmp_path / "blob.py").write_bytes(
        b"import apex\n\0\x89PNG\r\n amp.initialize(m, o, combine_grad=True)\n"
    )
    (tmp_path / "train.py").write_text("import torch\nimport apex\n")
    verdict = assess(None, tmp_path)
    assert [(h["file"], h["line"]) for h in verdict.as_dict()["hits"]] == [
        (f"{tmp_path}/train.py", 2)
    ]
    assert [e.name for e in verdict.evidence] == [
        "import-apex"
    ] and "blob.py" not in verdict.summary()
    assert verdict.notes == [
        f"scanned 1 file(s) under {tmp_path}",
        f"skipped 1 binary file(s) (a NUL byte in the first 8192 bytes): {tmp_path}/blob.py",
    ]
