"""Validation status of a hardware profile: own fit or borrowed (`efficiency_from`), which data the
fit used (`fit_source`), and the median errors quoted from the calibration reports in
experiments/results/ (markdown tables; the rows whose GPU column names the calibrated profile)."""
from __future__ import annotations

from pathlib import Path

from ..paths import results_dir

RESULTS_DIR = results_dir()
REPORTS = (("cost model, per operator", "costmodel_validation.md"),
           ("serving, end to end", "serving_validation.md"),
           ("training step time", "training_validation.md"))


def markdown_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(heading above the table, header cells, body rows) for every pipe table in `text`."""
    out, heading, block = [], "", []
    for line in text.splitlines() + [""]:
        s = line.strip()
        if s.startswith("|"):
            block.append([c.strip() for c in s.strip("|").split("|")])
            continue
        if len(block) >= 2 and set("".join(block[1])) <= set("-: "):
            out.append((heading, block[0], block[2:]))
        block = []
        if s.startswith("#"):
            heading = s.lstrip("#").strip()
    return out


def _col(header, *words):
    for i, h in enumerate(header):
        if all(w in h.lower() for w in words):
            return i
    return None


def quoted_errors(calibrated: str, results_dir: Path = RESULTS_DIR) -> list[dict]:
    """Rows {report, file, what, n, median, p90} for `calibrated` from each results file.

    Tables with a GPU column keep the rows naming `calibrated`; tables without one (training) are
    kept whole. Only the first table with a median-error column is read (the headline table of
    each report; later tables are diagnostics or 'before fitting' repeats)."""
    rows = []
    for label, name in REPORTS:
        path = results_dir / name
        if not path.is_file():
            rows.append({"report": label, "file": str(path), "what": "(file not present in this installation)",
                         "n": "", "median": "", "p90": ""})
            continue
        for heading, header, body in markdown_tables(path.read_text()):
            med = _col(header, "median", "error")
            if med is None or "before" in heading.lower():
                continue
            gpu, n, p90 = _col(header, "gpu"), _col(header, "n") if "n" in header else _col(header, "rows"), \
                _col(header, "p90")
            signed = _col(header, "signed")
            for r in body:
                if len(r) != len(header):
                    continue
                if gpu is not None and r[gpu] != calibrated:
                    continue
                skip = {i for i in (gpu, n, med, p90, signed) if i is not None}
                rows.append({"report": label, "file": f"experiments/results/{name}",
                             "what": " / ".join(c for i, c in enumerate(r) if i not in skip),
                             "n": r[n] if n is not None else "", "median": r[med],
                             "p90": r[p90] if p90 is not None else ""})
            break   # the first error table of each report is its headline table
    return rows


def profile_status(name: str, results_dir: Path = RESULTS_DIR, engine: str = "vllm") -> dict:
    from ..config import load_hardware
    from ..config.engine import load_engine
    hw = load_hardware(name)
    own = hw.own_efficiency
    calibrated = name if own else hw.efficiency_from
    fit = load_engine(engine).fit_for(hw)
    return {"hardware": name, "own_fit": own, "calibrated_on": calibrated,
            "fit_source": hw.efficiency.fit_source, "engine": engine, "engine_fit": fit.note,
            "engine_fit_source": fit.fit_source,
            "errors": quoted_errors(calibrated, results_dir)}
