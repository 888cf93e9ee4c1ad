"""apexkit's own environment variables, checked where they are read: a value that is not what its name promises is
one ConfigError naming the variable, never a traceback (`APEXKIT_JOBS=abc`) nor a silent nonsense
(`APEXKIT_FETCH_RETRIES=0`: no attempt at all)."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping

from apexkit import untrusted
from apexkit.errors import ConfigError


def integer(
    environ: Mapping[str, str], name: str, default: int, low: int = 1, high: int = 1 << 16
) -> int:
    """$name as an int in [low, high], else `default` when unset or empty."""
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ConfigError(
            f"${name}={untrusted.shown(raw)} is not a whole number from {low} to {high}",
            f"set {name} to such a number, or unset it (default {default})",
        )
    return value


def number(
    environ: Mapping[str, str],
    name: str,
    default: float,
    low: float = 0.0,
    high: float = 3600.0,
    unit: str = "seconds",
) -> float:
    """$name as a finite float in [low, high] (of `unit`), else `default` when unset or empty."""
    raw = (environ.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not low <= value <= high:
        raise ConfigError(
            f"${name}={untrusted.shown(raw)} is not a number from {low:g} to {high:g}",
            f"set {name} to such a number of {unit}, or unset it (default {default:g})",
        )
    return value


def words(environ: Mapping[str, str], name: str) -> list[str]:
    """$name split as a shell splits words (unbalanced quotes: one ConfigError)."""
    try:
        return shlex.split(environ.get(name) or "")
    except ValueError as exc:
        raise ConfigError(
            f"${name} cannot be split into words: {exc}", "balance its quotes as a shell would"
        ) from None


def split_words(value: str, option: str, example: str = "--torch 2.7.1") -> list[str]:
    """An option's value split as a shell splits words (--options, --build-options): one ConfigError on bad quotes."""
    try:
        return shlex.split(value)
    except ValueError as exc:
        raise ConfigError(
            f"{option} {untrusted.shown(value)} cannot be split into words: {exc}",
            f'balance the quotes, e.g. {option} "{example}"',
        ) from None
