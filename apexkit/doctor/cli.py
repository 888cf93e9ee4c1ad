"""`doctor`: its options (apexkit.declare) and the function that runs it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from apexkit import checks, log
from apexkit.declare import json_option, option
from apexkit.doctor import machine


@dataclass(frozen=True)
class Doctor:
    """Check this machine for building Apex for Ascend (interpreters, compiler, torch, CANN, Docker, QEMU, disk,
    proxy, CA) and whether the training stack needs apex at all: each check with its status and the fix. Exit 1
    when one fails."""

    as_json: bool = json_option("print JSON on stdout (for CI)")
    log: str | None = option(
        None,
        "a failed build's log: name the known failures in it (cause and fix) instead of checking the machine",
    )
    venv: str | None = option(
        None,
        "the training environment (venv/conda dir): does it need Apex for Ascend at all? "
        "(MindSpeed >= 2.2: no)",
    )
    interpreter: str | None = option(
        None,
        "the training environment's interpreter (instead of --venv): does it need Apex for Ascend?",
    )
    scripts: str | None = option(
        None,
        "training scripts (dir or file) to scan for amp.initialize/combine_grad/apex.optimizers.NpuFused*",
    )
    probe_defaults: bool = option(
        False,
        "also probe the sources left at their default (gitcode.com, github.com, quay.io, ...), not only "
        "the ones configured (apexkit config.show)",
    )


def main(o: Doctor = Doctor()) -> int:
    """Exit 0 when nothing fails (doctor) / when a known failure was found (--log); else 1.
    venv / interpreter / scripts: the training environment to say whether it needs Apex for Ascend at all."""
    if o.log:
        return _explain_log(o.log, o.as_json)
    apex = machine.apex_target(
        o.venv, o.interpreter, o.scripts
    )  # bad options stop here, before any check runs
    with log.console.status("checking …") as status:
        rows = machine.run_all(
            progress=lambda stage: status.update(f"checking {stage} …"), apex=apex
        )
        status.update("probing the sources …")
        rows += machine.check_sources(o.probe_defaults)
    return checks.report(rows, o.as_json, legacy=machine.legacy_json)


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
