"""Request traces (CSV) -> arrays of arrival times and prompt/output lengths.

Formats, detected from the header line:
- ``azure``: the Azure LLM inference traces 2023/2024 (Patel et al., "Splitwise", ISCA 2024;
  https://github.com/Azure/AzurePublicDataset), columns ``TIMESTAMP,ContextTokens,GeneratedTokens``;
  TIMESTAMP is a date-time string such as ``2023-11-16 18:15:46.6805900`` (up to 9 fractional digits).
- ``splitwise``: the processed form used by Vidur (Agrawal et al., MLSys 2024), columns
  ``[arrived_at,]num_prefill_tokens,num_decode_tokens`` (arrived_at in seconds; without it the trace
  gives lengths only, e.g. the arXiv summarisation statistics file).
- ``burstgpt``: BurstGPT (Wang et al. 2024, https://github.com/HPMLL/BurstGPT), columns
  ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` (Timestamp in seconds).
  Rows with ``Response tokens == 0`` are failed requests in BurstGPT; they are dropped, and
  `Trace.dropped` counts them.

Arrival times are returned relative to the first row, in seconds, and must be non-decreasing.
Every error names the file and the 1-based line number of the first bad row.
"""
from __future__ import annotations

import csv
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from servesim.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd     # imported where a trace is read: a run without one never loads pandas


@dataclass(frozen=True, eq=False)  # arrays do not compare with ==; a Trace is equal only to itself
class Trace:
    path: str
    arrival_s: np.ndarray | None  # float64 seconds since the first row, or None (lengths only)
    prompt: np.ndarray            # int64 prompt (input) tokens per request
    output: np.ndarray            # int64 output (generated) tokens per request
    format: str                   # "azure", "splitwise" or "burstgpt"
    dropped: int = 0              # rows dropped (BurstGPT failed requests)

    def __len__(self) -> int:
        return int(self.prompt.size)

    @property
    def mean_rate(self) -> float | None:
        """Mean arrival rate (requests/s) over the trace, (n - 1) / span; None without timestamps."""
        if self.arrival_s is None or self.arrival_s.size < 2 or self.arrival_s[-1] <= self.arrival_s[0]:
            return None
        return float((self.arrival_s.size - 1) / (self.arrival_s[-1] - self.arrival_s[0]))


@dataclass(frozen=True)
class _Format:
    name: str
    time: str | None        # arrival column (None: lengths only)
    prompt: str
    output: str
    time_optional: bool = False

    @property
    def required(self) -> tuple[str, ...]:
        cols = (self.prompt, self.output)
        return cols if self.time is None or self.time_optional else (self.time,) + cols


FORMATS = (
    _Format("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    _Format("splitwise", "arrived_at", "num_prefill_tokens", "num_decode_tokens", time_optional=True),
    _Format("burstgpt", "Timestamp", "Request tokens", "Response tokens"),
)

_EXPECTED = ("expected one of: TIMESTAMP,ContextTokens,GeneratedTokens (Azure LLM trace); "
             "[arrived_at,]num_prefill_tokens,num_decode_tokens (Splitwise/Vidur); "
             "Timestamp,Request tokens,Response tokens (BurstGPT)")


def read_trace(path) -> Trace:
    """Read a trace CSV of any supported format (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: trace file not found; pass the path of a CSV trace")
    header = _header(p)
    fmt = _detect(p, header)
    cols = [c for c in (fmt.time, fmt.prompt, fmt.output) if c is not None and c in header]
    got = _plain_numbers_cached(p, cols)
    values, line = got if got is not None else _read_table(p, fmt, cols)
    prompt = _whole(p, values[fmt.prompt], line, fmt.prompt)
    output = _whole(p, values[fmt.output], line, fmt.output)
    has_time = fmt.time is not None and fmt.time in values
    if has_time:
        t = values[fmt.time]

    dropped = 0
    if fmt.name == "burstgpt":
        ok = output != 0
        dropped = int((~ok).sum())
        prompt, output, line = prompt[ok], output[ok], line[ok]
        if has_time:
            t = t[ok]
        if prompt.size == 0:
            raise ConfigError(f"{p}: every row is a failed request (Response tokens = 0); "
                              "no successful requests to use")

    _positive(p, prompt, line, fmt.prompt)
    _positive(p, output, line, fmt.output)
    arrival = None
    if has_time:
        back = np.flatnonzero(np.diff(t) < 0)
        if back.size:
            i = int(back[0]) + 1
            raise ConfigError(f"{p}:{line[i]}: {fmt.time} goes backwards ({_show(t[i])} s after "
                              f"{_show(t[i - 1])} s on line {line[i - 1]}); sort the trace by arrival time")
        arrival = np.ascontiguousarray(t - t[0], dtype=np.float64)
    return Trace(path=str(p), arrival_s=arrival, prompt=np.ascontiguousarray(prompt, dtype=np.int64),
                 output=np.ascontiguousarray(output, dtype=np.int64), format=fmt.name, dropped=dropped)


_NUMBERS = re.compile(r"(?:[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\n)+")   # one a line


def _plain_numbers_cached(p: Path, cols: list[str]) -> tuple[dict, np.ndarray] | None:
    """`_plain_numbers`, remembered per file version (path, modification time, size) for the process:
    a sweep, a plan or a test suite simulates the same shipped trace many times (~60 ms a read).
    Each call gets its own copies of the arrays."""
    st = p.stat()
    got = _plain_numbers_of(str(p.resolve()), st.st_mtime_ns, st.st_size, tuple(cols))
    if got is None:
        return None
    values, line = got
    return {c: v.copy() for c, v in values.items()}, line.copy()


@functools.lru_cache(maxsize=16)
def _plain_numbers_of(path: str, mtime_ns: int, size: int, cols: tuple) -> tuple[dict, np.ndarray] | None:
    return _plain_numbers(Path(path), list(cols))


def _plain_numbers(p: Path, cols: list[str]) -> tuple[dict, np.ndarray] | None:
    """({column: float64 values}, line numbers) of a trace whose columns ``cols`` hold only plain decimal
    numbers in every row, read with the csv module: the shipped traces, without importing pandas (~0.3 s
    of a run's start-up). None for anything else (a blank or short row, another cell, a repeated column
    name, no rows, date-time stamps), which `_read_table` reads and reports as it always has. Python's
    float() reads each number (pandas' own parser gave the same values on every shipped trace)."""
    with open(p, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    header = [c.strip() for c in rows[0]]
    if len(rows) < 2 or any(header.count(c) != 1 for c in cols) or any(len(r) != len(header) for r in rows):
        return None
    values = {}
    for c in cols:
        k = header.index(c)
        cells = [r[k] for r in rows[1:]]
        if _NUMBERS.fullmatch("\n".join(cells) + "\n") is None:
            return None
        values[c] = np.array([float(v) for v in cells], dtype=np.float64)
    return values, np.arange(len(rows) - 1, dtype=np.int64) + 2


def _read_table(p: Path, fmt: _Format, cols: list[str]) -> tuple[dict, np.ndarray]:
    """({column: float64 values (date-times: seconds since the first)}, line numbers) of a trace, read
    with pandas; blank rows dropped, a bad cell reported with its line."""
    import pandas as pd
    try:
        df = pd.read_csv(p, usecols=lambda c: c.strip() in cols, encoding="utf-8-sig",
                         skip_blank_lines=False, low_memory=False)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot parse as CSV ({str(e).splitlines()[0]}); "
                          "check the delimiter is a comma and quoting is balanced") from None
    df.columns = [c.strip() for c in df.columns]
    line = np.arange(df.shape[0], dtype=np.int64) + 2  # header is line 1
    blank = df.isna().all(axis=1).to_numpy()
    if blank.any():
        df, line = df[~blank], line[~blank]
    if df.shape[0] == 0:
        raise ConfigError(f"{p}:1: no data rows after the header; a trace needs at least one request")
    values = {c: _whole(p, _numeric(p, df[c], line, c), line, c) for c in (fmt.prompt, fmt.output)}
    if fmt.time is not None and fmt.time in df.columns:
        values[fmt.time] = _timestamps(p, df[fmt.time], line, fmt.time) if fmt.name == "azure" \
            else _numeric(p, df[fmt.time], line, fmt.time)
    return values, line


def _header(p: Path) -> list[str]:
    try:
        with open(p, newline="", encoding="utf-8-sig") as f:
            row = next(csv.reader(f), None)
    except UnicodeDecodeError:
        raise ConfigError(f"{p}:1: not a UTF-8 text file; a trace is a CSV with a header line") from None
    if row is None or not any(c.strip() for c in row):
        raise ConfigError(f"{p}:1: empty trace (no header line); {_EXPECTED}")
    return [c.strip() for c in row]


def _detect(p: Path, header: list[str]) -> _Format:
    have = set(header)
    for fmt in FORMATS:
        if all(c in have for c in fmt.required):
            return fmt
    # No full match: report the format the header is closest to, and what it lacks. The message names
    # only the columns servesim knows: a file that is not a trace (a path gone wrong) is never echoed.
    best = max(FORMATS, key=lambda f: sum(c in have for c in f.required))
    if any(c in have for c in best.required):
        missing = [c for c in best.required if c not in have]
        known = [c for c in header if c in _KNOWN_COLUMNS]
        others = len(header) - len(known)
        found = ", ".join(known) + (f" and {others} other column(s)" if others else "")
        raise ConfigError(f"{p}:1: missing column(s) {', '.join(missing)} for the {best.name} trace format "
                          f"(found: {found}; expected: {','.join(best.required)})")
    raise ConfigError(f"{p}:1: unrecognised trace header ({len(header)} column(s), none a trace column; "
                      f"is this a trace?); {_EXPECTED}")


_KNOWN_COLUMNS = {c for f in FORMATS for c in (f.time, f.prompt, f.output) if c} | {"Model", "Total tokens",
                                                                                  "Log Type"}


def _quote(raw, limit: int = 40) -> str:
    """A cell of a recognised trace, for an error message: repr (control characters escaped), cut."""
    text = str(raw).strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _numeric(p: Path, col: pd.Series, line: np.ndarray, name: str) -> np.ndarray:
    import pandas as pd
    if pd.api.types.is_numeric_dtype(col.dtype):
        x = col.to_numpy(dtype=np.float64)
    else:
        x = np.array(pd.to_numeric(col.astype(str).str.strip(), errors="coerce"), dtype=np.float64)
        x[col.isna().to_numpy()] = np.nan
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        i = int(bad[0])
        raw = col.iloc[i]
        what = "an empty value" if pd.isna(raw) else f"non-numeric value {_quote(raw)}"
        raise ConfigError(f"{p}:{line[i]}: column '{name}' has {what}; use a number")
    return x


def _whole(p, x: np.ndarray, line: np.ndarray, name: str) -> np.ndarray:
    """Token counts: ``x`` (float64) as int64, or an error at the first that is not a whole number."""
    bad = np.flatnonzero(x != np.round(x))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"{p}:{line[i]}: column '{name}' has non-integer token count {_show(x[i])}; "
                          "use a whole number of tokens")
    return x.astype(np.int64)


def _positive(p, x: np.ndarray, line: np.ndarray, name: str) -> None:
    bad = np.flatnonzero(x <= 0)
    if bad.size:
        i = int(bad[0])
        kind = "negative" if x[i] < 0 else "zero"
        raise ConfigError(f"{p}:{line[i]}: column '{name}' has {kind} token count {x[i]}; "
                          "every request needs >= 1 token")


def _timestamps(p: Path, col: pd.Series, line: np.ndarray, name: str) -> np.ndarray:
    import pandas as pd
    if pd.api.types.is_numeric_dtype(col.dtype):  # already seconds (some processed copies)
        return _numeric(p, col, line, name)
    s = col.astype(str).str.strip()
    ts = pd.to_datetime(s, format="ISO8601", errors="coerce")
    bad = np.flatnonzero(ts.isna().to_numpy() | col.isna().to_numpy())
    if bad.size:
        i = int(bad[0])
        raw = col.iloc[i]
        what = "an empty value" if pd.isna(raw) else f"unparsable date-time {_quote(raw)}"
        raise ConfigError(f"{p}:{line[i]}: column '{name}' has {what}; "
                          "use e.g. 2023-11-16 18:15:46.6805900")
    if getattr(ts.dt, "tz", None) is not None:
        ts = ts.dt.tz_convert("UTC").dt.tz_localize(None)
    ns = ts.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    return (ns - ns[0]).astype(np.float64) / 1e9


def _show(v: float) -> str:
    return f"{v:.6g}"
