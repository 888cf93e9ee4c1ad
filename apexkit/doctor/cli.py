"""`invoke doctor` as a plain function (tasks.py forwards options and turns errors into exits)."""

from __future__ import annotations

import json

from apexkit import checks, log
from apexkit.doctor import machine


def main(
    log_file: str | None = None,
    as_json: bool = False,
    venv: str | None = None,
    python: str | None = None,
    scripts: str | None = None,
    probe_defaults: bool = False,
) -> int:
    """Exit 0 when nothing fails (doctor) / when a known failure was found (--log); else 1.
    venv / python / scripts: the training environment to say whether it needs Apex for Ascend at all."""
    if log_file:
        return _explain_log(log_file, as_json)
    apex = machine.apex_target(
        venv, python, scripts
    )  # bad options stop here, before any check runs
    with log.console.status("checking …") as status:
        rows = machine.run_all(
            progress=lambda stage: status.update(f"checking {stage} …"), apex=apex
        )
        status.update("probing the sources …")
        rows += machine.check_sources(probe_defaults)
    return checks.report(rows, as_json, legacy=machine.legacy_json)


def _explain_log(path: str, as_json: bool) -> int:
    hits, tail = machine.analyse_log(path)
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "id": h.failure.id,
                        "line": h.line_no,
                        "text": log.mask(h.line),
                        "cause": h.failure.cause,
                        "fix": h.failure.fix,
                    }
                    for h in hits
                ],
                indent=1,
            )
        )
        return 0 if hits else 1
    if not hits:
        log.notice(
            f"no known failure in {path} (known_failures.toml has the signatures); its last lines:"
        )
        for line in tail:
            log.foreign(line, "  ")
        return 1
    for hit in hits:
        shown = log.escape(
            log.sanitise(log.mask(hit.line[:160]))
        )  # the log's text: no markup, no control characters
        log.console.print(
            f"[bold]{hit.failure.id}[/bold]  line {hit.line_no}: {shown}", highlight=False
        )
        log.info(f"  cause: {hit.failure.cause}")
        log.info(f"  fix:   {hit.failure.fix}")
    return 0
