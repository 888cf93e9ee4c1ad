"""Issue 15: one command edge -- each invoke command declares its options once (apexkit/commands.py), tasks.py is a
one-liner onto them, and every declaration fits the function it calls. The command lines are run in
tests/e2e/test_commands.py."""

from __future__ import annotations

import inspect

import pytest
from conftest import ROOT

from apexkit import commands


@pytest.mark.parametrize("command", commands.COMMANDS, ids=lambda c: c.name)
def test_each_declaration_fits_its_function(command):
    func = commands._resolve(command.target)
    keywords = {
        (o.to or o.name): (None if o.default is commands.REQUIRED else o.default)
        for o in command.options
    }
    keywords.update(command.extra)
    if command.name == "build":
        keywords["remainder"] = ""
    inspect.signature(func).bind(**keywords)  # TypeError names an option the function does not take
    names = [o.name for o in command.options]
    assert len(names) == len(set(names)), f"{command.name}: an option declared twice"


def test_tasks_py_only_hands_over():
    code = [
        line
        for line in (ROOT / "tasks.py").read_text().split('"""', 2)[2].splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(code) <= 6 and code[-1] == "ns = commands.namespace()"
