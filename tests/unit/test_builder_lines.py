"""The build's last lines (issue 41 item 8): a training venv gets the wheel with apexkit install, from the team
index when one is configured, its password masked."""

from __future__ import annotations

from apexkit import vocab
from apexkit.wheel import builder


def test_the_last_line_names_apexkit_install_with_the_team_index_masked(monkeypatch):
    monkeypatch.setattr(vocab, "entry", lambda: vocab.APEXKIT)
    line = builder.install_venv_command(("https://team:s3cret@idx.corp/apex/", "/srv/index"))
    assert (
        "install --venv VENV --index 'https://team:***@idx.corp/apex/' --index /srv/index" in line
    )
    assert "s3cret" not in line
    assert builder.install_venv_command(()).split("   ")[0].endswith("install --venv VENV")
