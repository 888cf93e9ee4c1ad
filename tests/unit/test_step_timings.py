"""Step timings under stable keys (manifest durations_s), ccache's counters diffed on output captured from a real
ccache (4.7.5), and cached attestations, in-process. The real ccache and a real build are in
tests/e2e/test_step_timings.py."""

from __future__ import annotations

import conftest
import pytest

from apexkit import log
from apexkit.wheel import ccachestats

DATA = conftest.DATA / "ccache"


def test_step_key_is_the_title_before_its_detail():
    assert log.step_key("binary checks (identity, ELF machine, NEEDED)") == "binary_checks"
    assert log.step_key("smoke test (fresh venv: install the wheel)") == "smoke_test"
    assert (
        log.step_key("compile (--cpp_ext, -j2, ccache)")
        == log.step_key("compile (--cpp_ext, -j1)")
        == "compile"
    )
    assert log.step_key("find python3.11") == log.step_key("find python3.8") == "find_python"


def test_step_records_under_its_key_adds_repeats_and_skips_failures():
    timings: dict[str, float] = {}
    with log.step("compile (--cpp_ext, -j2)", timings, key="compile") as s:
        assert s.key == "compile"
    with log.step("smoke test (fresh venv)", timings):
        pass
    with log.step("smoke test (again)", timings):
        pass
    with pytest.raises(RuntimeError), log.step("apply our patches", timings, key="patches"):
        raise RuntimeError("drift")
    assert set(timings) == {"compile", "smoke_test"}  # a failed step is not recorded
    assert all(isinstance(v, float) and v >= 0 for v in timings.values())
    with log.step("no timings asked") as s:  # callers without a timings dict behave as before
        pass
    assert s.seconds >= 0


def test_stats_diff_of_captured_ccache_4_output():
    before = ccachestats.parse((DATA / "ccache-4.7.5-before.txt").read_text())
    after = ccachestats.parse((DATA / "ccache-4.7.5-after.txt").read_text())
    assert (
        before["direct_cache_hit"] == 1
        and before["cache_miss"] == 1
        and "stats_updated_timestamp" in before
    )
    # between the two: a.c and b.c compiled (b.c a miss, a.c a hit), b.c and a.c again (two hits), nothing else
    assert ccachestats.diff(before, after) == {"hits": 3, "misses": 1, "hit_rate": 0.75}
    assert ccachestats.diff(after, after) == {"hits": 0, "misses": 0, "hit_rate": None}
    assert (
        ccachestats.describe(ccachestats.diff(before, after))
        == "ccache 3 hits, 1 misses (75% hits)"
    )


def test_cached_attestations_are_used_only_when_they_match_their_record(tmp_path):
    import hashlib
    import os

    from apexkit.wheel import cache

    sbom_text, prov = b'{"bomFormat": "CycloneDX"}', b'{"_type": "https://in-toto.io/Statement/v1"}'
    (tmp_path / "sbom.cdx.json").write_bytes(sbom_text)
    (tmp_path / "provenance.json").write_bytes(prov)
    record = {
        "sbom": {"file": "sbom.cdx.json", "sha256": hashlib.sha256(sbom_text).hexdigest()},
        "provenance": {"file": "provenance.json", "sha256": hashlib.sha256(prov).hexdigest()},
    }
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert cache._cached_documents({"attestations": record}, fd) == {
            "sbom.cdx.json": sbom_text,
            "provenance.json": prov,
        }
        assert cache._cached_documents({}, fd) is None  # an entry from before: written again
        (tmp_path / "provenance.json").write_bytes(prov + b" ")  # changed since it was recorded
        assert cache._cached_documents({"attestations": record}, fd) is None
        (tmp_path / "provenance.json").unlink()
        (tmp_path / "provenance.json").symlink_to(tmp_path / "sbom.cdx.json")  # never followed
        assert cache._cached_documents({"attestations": record}, fd) is None
        bad_name = {**record, "sbom": {**record["sbom"], "file": "../x"}}
        assert cache._cached_documents({"attestations": bad_name}, fd) is None
    finally:
        os.close(fd)
