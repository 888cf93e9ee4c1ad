"""A team index whose index.json holds entries another party wrote badly (review of issue 39's merge): a version past
int's digit limit, in the torch field or in the file name, is one line leaving that entry out, never exit 70 for the
whole lookup. Reads a file:// index (remote.make_client asks pip's config: a process)."""

from __future__ import annotations

import json

from apexkit.index import publish, remote

GOOD = {"filename": "apex-0.1-cp311-cp311-linux_x86_64.whl", "project": "apex", "sha256": "a" * 64}
HUGE = "1" * 5000


def test_a_team_index_with_bad_entries_keeps_the_good_ones(tmp_path, capsys):
    files = [
        dict(GOOD, torch=HUGE),
        dict(GOOD, filename=f"apex-{HUGE}-cp311-cp311-linux_x86_64.whl"),
        GOOD,
    ]
    (tmp_path / "index.json").write_text(json.dumps({"format": publish.FORMAT, "files": files}))
    url = tmp_path.as_uri()
    kept = remote.read_listing(remote.make_client([url], {}), url)
    assert [e.filename for e in kept] == [GOOD["filename"]]
    warned = [line for line in capsys.readouterr().err.splitlines() if "left out" in line]
    assert len(warned) == 2 and all(len(line) < 400 for line in warned), warned
