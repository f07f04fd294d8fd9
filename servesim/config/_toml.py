"""Strict readers for data files: every key known, every key typed, every error one line.

Each error names the file, the dotted key, the bad value and what would work, e.g.
``hardware_profiles/x.toml: key 'memory.hbm_bandwidth_GBps' must be > 0, got -1``.
"""
from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any, Iterable

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from servesim.errors import ConfigError

_REPO = Path(__file__).resolve().parent.parent.parent
MAX_MAGNITUDE = 1e18   # a number in a data file, in its key's unit (GB, TFLOPS, us, ...)


def did_you_mean(name: str, choices) -> str:
    """"did you mean 'h100-sxm' or 'h100-pcie'? " for a name close to some of ``choices`` (those it
    begins, then difflib's close matches), else ""."""
    choices = list(choices)
    low = name.lower()
    close = sorted((c for c in choices if low and c.lower().startswith(low)),
                   key=lambda c: -difflib.SequenceMatcher(None, low, c.lower()).ratio())
    close += [c for c in difflib.get_close_matches(name, choices, n=3, cutoff=0.6) if c not in close]
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(c) for c in close[:3]) + "? "


def display_path(path: Path) -> str:
    """The path as shown in messages: relative to the repository when inside it."""
    path = Path(path)
    try:
        return path.resolve().relative_to(_REPO).as_posix()
    except ValueError:
        return str(path)


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a missing file or a syntax error becomes a ConfigError."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{display_path(path)}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{display_path(path)}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{display_path(path)}: not UTF-8 text (a binary or UTF-16 file?); "
                          "save the TOML file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{display_path(path)}: cannot read it ({exc.strerror or exc})") from None


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file; errors become ConfigError."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{display_path(path)}: file not found") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{display_path(path)}: not valid JSON ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{display_path(path)}: not UTF-8 text (a binary or UTF-16 file?); "
                          "save the JSON file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{display_path(path)}: cannot read it ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{display_path(path)}: expected a JSON object at top level, got {type(data).__name__}")
    return data


def read_named(path: Path, keys: Iterable[str], optional: Iterable[str] = ()) -> tuple["Table", str]:
    """A data file whose top table has exactly ``keys`` (and ``optional``) and a ``name`` equal to
    the file stem: (top table, name)."""
    top = Table(read_toml(path), path)
    top.expect_keys(keys, optional)
    name = top.str("name", nonempty=True)
    if name != Path(path).stem:
        raise top.error("name", f"must equal the file stem '{Path(path).stem}', got {name!r}")
    return top, name


class Table:
    """One TOML table with its file and dotted prefix, read key by key with type checks."""

    def __init__(self, data: dict[str, Any], path: Path, prefix: str = ""):
        self.data = data
        self.path = Path(path)
        self.prefix = prefix

    # -- messages -------------------------------------------------------------
    def key_name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{display_path(self.path)}: key '{self.key_name(key)}' {message}")

    # -- structure ------------------------------------------------------------
    def expect_keys(self, required: Iterable[str], optional: Iterable[str] = ()) -> None:
        """Unknown keys first (they are usually typos of a missing one), then missing keys."""
        required = list(required)
        allowed = required + list(optional)
        for key in self.data:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f"did you mean '{self.key_name(close[0])}'?" if close else (
                    "allowed: " + ", ".join(allowed))
                raise self.error(key, f"is not a known key; {hint}")
        for key in required:
            if key not in self.data:
                raise self.error(key, "is missing; add it (see the README for the schema)")

    def has(self, key: str) -> bool:
        return key in self.data

    def table(self, key: str) -> "Table":
        value = self.data[key]
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table [{self.key_name(key)}], got {value!r}")
        return Table(value, self.path, self.key_name(key))

    # -- scalars --------------------------------------------------------------
    def str(self, key: str, choices: Iterable[str] | None = None, nonempty: bool = False) -> str:
        value = self.data[key]
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {value!r}")
        if choices is not None:
            choices = list(choices)
            if value not in choices:
                raise self.error(key, f"must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
        if nonempty and not value.strip():
            raise self.error(key, "must be a non-empty string, got ''")
        return value

    def bool(self, key: str) -> bool:
        value = self.data[key]
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def float(self, key: str, *, gt: float | None = None, ge: float | None = None,
              le: float | None = None) -> float:
        """A number (TOML int or float, not bool), finite, within the given bounds."""
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise self.error(key, f"must be a finite number, got {value!r}")
        if abs(value) > MAX_MAGNITUDE:
            raise self.error(key, f"is implausibly large ({value:g}; at most {MAX_MAGNITUDE:g} in the key's "
                                  "unit, which stays finite once converted to SI); check the unit in the key name")
        _check_bounds(self, key, value, gt, ge, le)
        return value

    def fraction(self, key: str) -> float:
        """A number in (0, 1]."""
        value = self.float(key)
        if not 0.0 < value <= 1.0:
            raise self.error(key, f"must be a fraction in (0, 1], got {_fmt(value)}")
        return value

    def int(self, key: str, *, gt: int | None = None, ge: int | None = None,
            le: int | None = None) -> int:
        """An integer (TOML int, not bool or float) within the given bounds."""
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}")
        if abs(value) > MAX_MAGNITUDE:
            raise self.error(key, f"is implausibly large ({value}; at most {MAX_MAGNITUDE:g})")
        _check_bounds(self, key, value, gt, ge, le)
        return value


def _check_bounds(table: Table, key: str, value: float, gt, ge, le) -> None:
    shown = _fmt(value)
    if gt is not None and not value > gt:
        raise table.error(key, f"must be > {_fmt(gt)}, got {shown}")
    if ge is not None and not value >= ge:
        raise table.error(key, f"must be >= {_fmt(ge)}, got {shown}")
    if le is not None and not value <= le:
        raise table.error(key, f"must be <= {_fmt(le)}, got {shown}")


def _fmt(value: float) -> str:
    """-1.0 -> '-1', 0.5 -> '0.5' (messages read like the file)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)
