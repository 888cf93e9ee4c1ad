"""Packages are found, not listed: every package under apexkit/ ships (a hand list once forgot apexkit.install).
pyproject.toml holds everything else; apexkit._data is the checkout's own data (matrix.toml, patches/, docker/, bench/,
noxfile.py, tasks.py) packaged so that an installed apexkit finds what a checkout has (apexkit/paths.py): setuptools'
find cannot see it, because it maps the checkout's top folder, so it is named here."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["apexkit", "apexkit.*"]), "apexkit._data"])
