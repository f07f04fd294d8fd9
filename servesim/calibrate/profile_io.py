"""Writing fitted values into hardware- and engine-profile TOML files, keeping their comments and layout.

``update_profile`` rewrites the numeric values of some ``[efficiency]`` keys and the ``fit_source``
line of an existing hardware profile (used by ``experiments/fit_costmodel.py`` and ``servesim
calibrate``); ``derived_profile`` makes the text of a *new* profile from a base one: ``name`` = the
new stem, ``efficiency_from = ""`` and an ``[efficiency]`` table (copied from the profile it
borrowed from when the base had none) carrying the fitted values. ``update_engine_profile``
replaces or appends an engine profile's ``[hardware.<gpu>]`` table (``experiments/fit_engine_kernels.py``,
``experiments/validate_serving.py``, ``servesim calibrate --engine-output``).
"""
from __future__ import annotations

import re
from pathlib import Path

from servesim.errors import ConfigError

# Decimals written per file key; keys not listed get 4.
DECIMALS = {"gemm_max": 3, "gemm_half_tokens": 1, "kernel_latency_us": 2, "hbm_fraction": 3,
            "scaleup_bw_fraction": 3, "scaleup_latency_us": 2, "collective_base_latency_us": 2,
            "norm_hbm_fraction": 3, "rope_hbm_fraction": 3, "activation_hbm_fraction": 3,
            "elementwise_latency_us": 2, "p2p_bw_fraction": 3, "p2p_latency_us": 2,
            "p2p_large_bw_fraction": 3, "p2p_large_message_mib": 1, "attn_prefill_max": 3}
# [efficiency] file key -> (Efficiency field, multiplier from SI to file units), in file order.
EFFICIENCY_FILE_KEYS = {
    "gemm_max": ("gemm_max", 1.0), "gemm_half_tokens": ("gemm_half_tokens", 1.0),
    "kernel_latency_us": ("kernel_latency_s", 1e6), "hbm_fraction": ("hbm_fraction", 1.0),
    "attn_prefill_max": ("attn_prefill_max", 1.0),
    "scaleup_bw_fraction": ("scaleup_bw_fraction", 1.0), "scaleup_latency_us": ("scaleup_latency_s", 1e6),
    "scaleout_bw_fraction": ("scaleout_bw_fraction", 1.0), "scaleout_latency_us": ("scaleout_latency_s", 1e6),
    "pcie_bw_fraction": ("pcie_bw_fraction", 1.0), "pcie_latency_us": ("pcie_latency_s", 1e6),
    "norm_hbm_fraction": ("norm_hbm_fraction", 1.0), "rope_hbm_fraction": ("rope_hbm_fraction", 1.0),
    "activation_hbm_fraction": ("activation_hbm_fraction", 1.0),
    "elementwise_latency_us": ("elementwise_latency_s", 1e6),
    "collective_base_latency_us": ("collective_base_latency_s", 1e6),
    "p2p_bw_fraction": ("p2p_bw_fraction", 1.0), "p2p_latency_us": ("p2p_latency_s", 1e6),
    "p2p_large_bw_fraction": ("p2p_large_bw_fraction", 1.0),
    "p2p_large_message_mib": ("p2p_large_message_bytes", 2.0 ** -20),
}


def _fmt(key: str, value: float) -> str:
    return f"{value:.{DECIMALS.get(key, 4)}f}"


def _check_fit_source(fit_source: str) -> None:
    if '"' in fit_source or "\\" in fit_source or "\n" in fit_source:
        raise ConfigError("fit_source must not contain quotes, backslashes or newlines")


def update_profile(path: Path, values: dict, fit_source: str, text: str | None = None,
                   keep_previous: bool = True) -> str:
    """Rewrite the numeric values of ``values``' keys (file units, e.g. ``kernel_latency_us``) and the
    fit_source line inside [efficiency], keeping key order, comments and the comment column.

    ``text`` is the profile text (default: read ``path``, which is then only used in messages).
    With ``keep_previous`` an existing fit_source note (other than "initial values ...") is kept
    after the new one. Returns the new text.
    """
    path = Path(path)
    text = path.read_text() if text is None else text
    start = re.search(r"^\[efficiency\][^\n]*\n", text, flags=re.M)
    if start is None:
        raise ConfigError(f"{path}: no [efficiency] table")
    nxt = re.search(r"^\[", text[start.end():], flags=re.M)
    end = start.end() + (nxt.start() if nxt else len(text) - start.end())
    block = text[start.end():end]
    for key, value in values.items():
        pat = re.compile(rf"^({re.escape(key)}\s*=\s*)([-+0-9.eE]+)([ \t]*)(#[^\n]*)?$", flags=re.M)
        m = pat.search(block)
        if m is None:
            raise ConfigError(f"{path}: [efficiency] has no numeric line for {key}")
        new = _fmt(key, value)
        pad = m.group(3)
        if m.group(4):
            width = len(m.group(2)) + len(pad)
            pad = " " * max(1, width - len(new))
        block = block[:m.start()] + m.group(1) + new + pad + (m.group(4) or "") + block[m.end():]
    _check_fit_source(fit_source)
    found = re.findall(r'^fit_source\s*=\s*"([^"\n]*)"', block, flags=re.M)
    if len(found) != 1:
        raise ConfigError(f"{path}: [efficiency] needs exactly one fit_source line, found {len(found)}")
    # Other fits append their own "; ..." notes to fit_source (e.g. the serving validation): keep them.
    current = found[0]
    if keep_previous:
        if fit_source in current:
            fit_source = current
        elif not current.startswith("initial values"):
            fit_source = f"{fit_source}; {current}"
    block = re.sub(r'^fit_source\s*=\s*"[^"\n]*"', lambda _: f'fit_source = "{fit_source}"', block, flags=re.M)
    return text[:start.end()] + block + text[end:]


def efficiency_table(efficiency) -> str:
    """An ``[efficiency]`` table (file units) holding the values of an ``Efficiency``."""
    lines = ["[efficiency]", f'fit_source = "{efficiency.fit_source.replace(chr(34), chr(39))}"']
    for key, (field, mult) in EFFICIENCY_FILE_KEYS.items():
        lines.append(f"{key} = {_fmt(key, getattr(efficiency, field) * mult)}")
    return "\n".join(lines) + "\n"


def derived_profile(base, name: str, values: dict, fit_source: str, engine_fit_from: str = "") -> str:
    """Text of a new profile: a copy of ``base`` (a loaded HardwareProfile) named ``name``, carrying its
    own [efficiency] with ``values`` (file units) and ``fit_source``; its ``efficiency_from`` names
    ``engine_fit_from``, the profile whose engine tables it uses ("": none, an engine needs a table for
    ``name``)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(f"profile name {name!r}: use letters, digits, '.', '_' and '-' only")
    text = Path(base.path).read_text()
    text, n = re.subn(r'^name\s*=\s*"[^"\n]*"', lambda _: f'name = "{name}"', text, count=1, flags=re.M)
    if n != 1:
        raise ConfigError(f"{base.path}: no name line")
    line = (f'efficiency_from = "{engine_fit_from}"  # [efficiency] fitted by servesim calibrate (see fit_source); '
            f'engine fits borrowed from {engine_fit_from} (a [hardware.{name}] table of an engine overrides; "" '
            'to borrow none)' if engine_fit_from else
            'efficiency_from = ""  # fitted by servesim calibrate (see fit_source); engines need a '
            f'[hardware.{name}] table')
    text = re.sub(r'^\[efficiency\][^\n]*', '[efficiency]', text, count=1, flags=re.M)
    text = re.sub(r'^efficiency_from\s*=\s*"[^"\n]*"[^\n]*', lambda _: line, text, count=1, flags=re.M)
    if not re.search(r"^\[efficiency\]", text, flags=re.M):
        text = text.rstrip("\n") + "\n\n" + efficiency_table(base.efficiency)
    return update_profile(Path(base.path), values, fit_source, text=text, keep_previous=False)


def engine_table(hw_name: str, values: dict, fit_source: str, comments: dict | None = None) -> str:
    """A ``[hardware.<hw_name>]`` table of an engine profile: every FIT_KEYS file key, in order, from
    ``values`` (file units), with an optional comment per key."""
    from servesim.config.engine import _OPTIONAL_FIT, FIT_KEYS
    _check_fit_source(fit_source)
    values = {**_OPTIONAL_FIT, **values}
    missing = [k for k, _, _ in FIT_KEYS if k not in values]
    if missing:
        raise ConfigError(f"engine table for {hw_name}: missing {', '.join(missing)}")
    lines = [f"[hardware.{hw_name}]", f'fit_source = "{fit_source}"']
    for key, _, _ in FIT_KEYS:
        v = float(values[key])
        text = f"{v:.4g}" if abs(v) < 1e-3 and v != 0 else f"{round(v, 4):g}"
        note = (comments or {}).get(key)
        lines.append(f"{key} = {text}" + (f"{' ' * max(1, 32 - len(key) - len(text))}# {note}" if note else ""))
    return "\n".join(lines) + "\n"


def update_engine_profile(path: Path, hw_name: str, values: dict, fit_source: str | None = None,
                          comments: dict | None = None) -> str:
    """Replace (or append) the ``[hardware.<hw_name>]`` table of an engine profile with ``values``
    (file units); keys not in ``values`` keep their current numbers, and the fit_source its text
    unless one is given. Returns the new text (the caller writes it)."""
    import tomllib
    path = Path(path)
    text = path.read_text()
    current = tomllib.loads(text).get("hardware", {}).get(hw_name, {})
    merged = {**current, **values}
    source = fit_source if fit_source is not None else current.get("fit_source", "")
    merged.pop("fit_source", None)
    table = engine_table(hw_name, merged, source, comments)
    m = re.search(rf"^\[hardware\.{re.escape(hw_name)}\][^\n]*\n", text, flags=re.M)
    if m is None:
        return text.rstrip("\n") + "\n\n" + table
    nxt = re.search(r"^\[", text[m.end():], flags=re.M)
    end = m.end() + (nxt.start() if nxt else len(text) - m.end())
    tail = text[end:]
    return text[:m.start()] + table + ("\n" + tail if tail else "")


__all__ = ["DECIMALS", "EFFICIENCY_FILE_KEYS", "derived_profile", "efficiency_table", "engine_table",
           "update_engine_profile", "update_profile"]
