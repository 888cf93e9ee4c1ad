"""The fatbin reader on section bytes laid out as nvcc 13.0 writes them (apexkit.wheel.cudabin), and the arch list."""

from __future__ import annotations

import struct

import pytest

from apexkit.errors import ConfigError
from apexkit.wheel import cudabin


def entry(kind: int, arch: int, payload: bytes = b"\x7fELF....", header: int = 64) -> bytes:
    head = struct.pack("<HHIQIIHHI", kind, 257, header, len(payload), 0, 0, 8, 1, arch)
    return head + b"\0" * (header - len(head)) + payload


def blob(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", cudabin.FATBIN_MAGIC, 1, 16, len(body)) + body


def test_reads_sass_and_ptx_across_padded_blobs():
    first = blob(entry(2, 80), entry(2, 90))
    second = blob(entry(2, 80), entry(1, 90, b".version 9.0", header=80), entry(2, 90))
    padding = b"\0" * (-len(first) % 8 + 8)
    found = cudabin.parse_fatbin(first + padding + second)
    assert found == cudabin.Embedded(frozenset({80, 90}), frozenset({90}))
    assert found.describe() == "sm_80, sm_90, compute_90 (PTX)"


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"\x01" * 32, "no fatbin header at byte 0"),
        (struct.pack("<IHHQ", cudabin.FATBIN_MAGIC, 1, 16, 1 << 40), "past the section's end"),
        (blob(entry(2, 90)[:8] + struct.pack("<Q", 1000) + entry(2, 90)[16:]), "claims more bytes"),
        (blob(entry(7, 90)), "unknown kind 7"),
        (blob(entry(2, 90, header=16)), "claims more bytes"),
    ],
    ids=["not-a-fatbin", "blob-too-long", "entry-too-long", "unknown-kind", "header-too-short"],
)
def test_damaged_or_crafted_sections_are_refused(data, said):
    with pytest.raises(cudabin.FatbinError, match=said):
        cudabin.parse_fatbin(data)


def test_an_entry_flood_is_refused(monkeypatch):
    monkeypatch.setattr(cudabin, "MAX_ENTRIES", 3)
    with pytest.raises(cudabin.FatbinError, match="more than 3 entries"):
        cudabin.parse_fatbin(blob(*(entry(2, 80) for _ in range(4))))


def test_arch_list_as_torch_reads_it():
    arches = cudabin.parse_arch_list(" 8.0;8.6 9.0a;10.0+PTX ")
    assert [(a.number, a.ptx) for a in arches] == [
        (80, False),
        (86, False),
        (90, False),
        (100, True),
    ]
    assert cudabin.wanted(arches) == cudabin.Embedded(
        frozenset({80, 86, 90, 100}), frozenset({100})
    )


@pytest.mark.parametrize("text", ["", " ; ", "Hopper", "9", "9.0+ptx", "sm_90", "9.0;$(rm -rf ~)"])
def test_arch_list_refuses_what_is_not_a_compute_capability(text):
    with pytest.raises(ConfigError) as caught:
        cudabin.parse_arch_list(text)
    assert "\n" not in caught.value.format()
    assert caught.value.hint  # says what to give instead


def test_problems_name_what_is_missing_and_what_is_extra():
    found = cudabin.Embedded(frozenset({80, 90}), frozenset({90}))
    assert (
        cudabin.problems(found, cudabin.Embedded(frozenset({80, 90}), frozenset({90})), "amp_C")
        == []
    )
    said = cudabin.problems(found, cudabin.Embedded(frozenset({90, 100}), frozenset()), "amp_C")
    assert said == [
        "amp_C: lacks sm_100 (embeds sm_80, sm_90, compute_90 (PTX))",
        "amp_C: embeds sm_80, compute_90 (PTX) that the arch list did not ask for",
    ]
    assert cudabin.problems(None, cudabin.Embedded(frozenset({90}), frozenset()), "apex_C") == [
        "apex_C: no GPU code (.nv_fatbin missing), asked for sm_90"
    ]
