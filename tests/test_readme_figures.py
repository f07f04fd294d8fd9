"""Every figure of README.md has a source (issue #17, "README truth").

A figure is a number with a unit (%, ms, us, s, req/s, tok/s, GiB, x, ... or a count of rows, tests,
requests, runs, simulations) or a number in a table cell. Each one is, in this order:

(a) checked against the data or code it restates: a profile or engine TOML, a code constant, a
    results file that an `experiments/` script writes (`experiments/results/*.md`, `*_rows.csv`);
    `FIGURES` and the table checks `TABLES` below (fast);
(b) checked against what a short computation gives, `experiments/readme_figures.py` (the `slow`
    figures of `FIGURES`: a test runs its function, a few seconds each);
(c) labelled with the script that measures it and the date: `(experiments/bench_speed.py, measured
    2026-12-03)` in its paragraph, or in the paragraph just above its table (timings, speeds, the
    test suite: machine- and load-dependent, so not checked, but dated);
(d) or listed in `EXEMPT` with the reason (definitions, unit factors, counts no script has). A
    figure of a previous model quoted beside the current one is `BEFORE` in its check; numbers in
    `code spans` (option examples such as `--rate 12`) are not figures.

Values are checked within 20% (REL) of their source, counts and configuration values exactly (at
the README's precision). `test_every_figure_has_a_source` fails on a figure that is none of these,
so a new number cannot enter the README without a source.
"""
from __future__ import annotations

import datetime
import functools
import importlib
import importlib.util
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "experiments" / "results"
REL = 0.20
EXACT = 0.0

# -- the README, cut into sections, blocks and figures -------------------------------------------------

UNITS = (r"%|ms|µs|us|s|min|h|req/s|requests/s|tok/s|GiB|GB|MiB|MB|GB/s|TB/s|B|x|rows|tests|requests|runs|"
         r"deployments|simulations|iterations/s|seeds|points")
NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"       # 1,000,000 or 4.0
FIG = re.compile(r"(?<![\w.\-/,])~?(" + NUMBER + r")( ?)(" + UNITS + r")(?![\w/])")
CELL_NUM = re.compile(r"(?<![\w.\-,])(" + NUMBER + r")%?(?![\w.])")
NUM = r"~?(" + NUMBER + ")"
LABEL = re.compile(r"\([^()]*?`?((?:experiments|tests)/[\w/.-]+\.py)`?[^()]*?measured\s+(\d{4}-\d{2}-\d{2})[^()]*\)")
BEFORE = None       # a figure of the previous model, quoted for comparison: no current script gives it


@functools.cache
def text() -> str:
    return README.read_text()


@functools.cache
def sections() -> dict[str, tuple[int, int]]:
    """heading text -> (start, end) offsets of its body (to the next heading of any level)."""
    heads = [(m.start(), m.end(), m.group(2).strip()) for m in re.finditer(r"^(#+) (.+)$", text(), re.M)
             if not _in_code(m.start())]
    out = {}
    for i, (_, end, name) in enumerate(heads):
        out[name] = (end, heads[i + 1][0] if i + 1 < len(heads) else len(text()))
    return out


@functools.cache
def _code_spans() -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"^```.*?^```", README.read_text(), re.M | re.S)]


def _in_code(pos: int) -> bool:
    return any(a <= pos < b for a, b in _code_spans())


def section_of(pos: int) -> str:
    for name, (a, b) in sections().items():
        if a <= pos < b:
            return name
    return ""


@dataclass(frozen=True)
class Block:
    start: int
    end: int
    table: bool


@functools.cache
def blocks() -> list[Block]:
    """Paragraphs, list items and tables (code blocks left out), as offset ranges."""
    out, start, pos, kind = [], None, 0, None
    for line in text().splitlines(keepends=True):
        s = line.strip()
        is_table = s.startswith("|")
        new_item = re.match(r"\s*(- |\d+\. )", line) is not None
        if not s or s.startswith("#") or _in_code(pos) or (start is not None and (
                is_table != kind or (new_item and not is_table))):
            if start is not None:
                out.append(Block(start, pos, kind))
                start = None
        if s and not s.startswith("#") and not _in_code(pos) and start is None:
            start, kind = pos, is_table
        pos += len(line)
    if start is not None:
        out.append(Block(start, pos, kind))
    return out


@dataclass(frozen=True)
class Figure:
    start: int
    end: int
    text: str

    @property
    def where(self) -> str:
        line = text().count("\n", 0, self.start) + 1
        return f"README.md:{line} [{section_of(self.start)}] {self.text!r}"


@functools.cache
def figures() -> list[Figure]:
    out = []
    for b in blocks():
        body = text()[b.start:b.end]
        code_spans = [m.span() for m in re.finditer(r"`[^`]+`", body)]    # option examples, code: not figures
        for m in FIG.finditer(body):
            if (m.group(3) == "x" and m.group(2)) or (m.group(3) == "B" and not m.group(2)):
                continue      # "2 x max seqs" is a product, "7.1B" a model size
            if any(lo <= m.start() < hi for lo, hi in code_spans):
                continue
            out.append(Figure(b.start + m.start(), b.start + m.end(), m.group(0)))
        if b.table:
            off = b.start
            for row in body.splitlines(keepends=True):
                if not set(row.strip()) <= set("|-: "):
                    cells = row.strip().strip("|").split("|")
                    if row.strip() != body.splitlines()[0].strip():       # not the header row
                        c0 = off + row.index("|") + 1
                        for cell in cells:
                            if not re.fullmatch(r"[\d.,%/ ~*\-]*\d[\d.,%/ ~*\-]*", cell.strip()):
                                c0 += len(cell) + 1
                                continue       # a cell of text: its figures, if any, carry units
                            for m in CELL_NUM.finditer(cell):
                                if not any(f.start <= c0 + m.start() < f.end for f in out):
                                    out.append(Figure(c0 + m.start(), c0 + m.end(), m.group(0)))
                            c0 += len(cell) + 1
                off += len(row)
    return sorted(set(out), key=lambda f: f.start)


def number(s: str) -> float:
    return float(s.replace(",", "").replace("~", ""))


def decimals(s: str) -> int:
    s = s.replace(",", "")
    return len(s.split(".")[1]) if "." in s else 0


def agrees(readme: str, truth: float, tol: float) -> bool:
    v = number(readme)
    if tol == EXACT:     # at the README's precision
        return abs(v - truth) <= 0.5 * 10 ** -decimals(readme) + 1e-9 * abs(truth)
    return abs(v - truth) <= tol * abs(truth) + 0.5 * 10 ** -decimals(readme)


# -- sources -------------------------------------------------------------------------------------------

@functools.cache
def md_tables(name: str) -> list[list[dict]]:
    """The tables of a results markdown file, each a list of {header: cell} rows."""
    out, rows = [], []
    for line in (RESULTS / name).read_text().splitlines() + [""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            head, body = rows[0], [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]
            out.append([dict(zip(head, r)) for r in body])
            rows = []
    return out


def md_row(name: str, **match) -> dict:
    """The one row of a results table whose cells start with the given values (keys: headers)."""
    hits = [r for t in md_tables(name) for r in t
            if all(k in r and r[k].startswith(v) for k, v in match.items())]
    assert len(hits) == 1, f"{name}: {len(hits)} rows match {match}"
    return hits[0]


def pct(cell: str) -> float:
    return float(re.search(r"-?[\d.]+", cell).group(0))


@functools.cache
def toml(path: str) -> dict:
    with open(ROOT / path, "rb") as f:
        return tomllib.load(f)


@functools.cache
def rows_csv(name: str) -> pd.DataFrame:
    return pd.read_csv(RESULTS / name)


def static_ttft_rows(gpu: str) -> pd.DataFrame:
    """The batch-1 static TTFT rows of one GPU (H100, A100) in serving_validation_rows.csv."""
    d = rows_csv("serving_validation_rows.csv")
    return d[(d.load_kind == "static_batch") & (d.metric == "ttft_ms") & d.hardware.str.startswith(gpu)]


def abs_err_median(name: str, stride: int = 1) -> float:
    return 100 * rows_csv(name).iloc[::stride]["rel_error"].abs().median()


def abs_err_p90(name: str) -> float:
    return 100 * rows_csv(name)["rel_error"].abs().quantile(0.9)


@functools.cache
def readme_figures_module():
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "experiments" / "readme_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def computed(name: str) -> dict:
    """What experiments/readme_figures.py's function `name` gives (each run once per session)."""
    return getattr(readme_figures_module(), name)()


def code(module: str, attr: str):
    mod = importlib.import_module(module)
    return getattr(mod, attr)


def vllm_h100(key: str) -> float:
    return toml("engines/vllm.toml")["hardware"]["h100-sxm"][key]


# -- (a) and (b): single figures -----------------------------------------------------------------------

@dataclass(frozen=True)
class Fig:
    section: str
    pattern: str                      # regex; each "#" captures a README number (a space matches any space)
    truth: Callable[[], object]       # one value per "#", in the README's units (BEFORE: not checked)
    tol: float | tuple = REL          # one per "#", or one for all
    slow: bool = False                # the truth runs experiments/readme_figures.py

    def regex(self) -> re.Pattern:
        return re.compile(self.pattern.replace(" ", r"\s+").replace("#", NUM))

    def match(self) -> re.Match:
        a, b = sections()[self.section]
        hits = list(self.regex().finditer(text(), a, b))
        assert hits, f"README section {self.section!r} no longer says {self.pattern!r}; update tests/test_readme_figures.py"
        assert len(hits) == 1, f"README section {self.section!r} says {self.pattern!r} {len(hits)} times"
        return hits[0]

    @property
    def id(self) -> str:
        return f"{self.section[:20]}: {self.pattern[:50]}"


def _vals(x):
    return x if isinstance(x, tuple) else (x,)


SIM = "`servesim simulate` options"
STREAM = "Long runs in bounded memory (`--stream`)"
BUSY = "Busy and capacity headroom"
MODERR = "Model-error intervals"
CI = "Confidence intervals"
COST = "Cost model (`servesim/costmodel`)"
ENGINE = "Engine (`servesim/engine`)"
PLAN = "Capacity planning"
TRAIN = "Training and training-vs-serving cost"
CAL = "Calibration and accuracy"
REPORT = "Reports and studies"
CALIB = "Calibrating your own hardware"
REL_SEC = "Reliability"
DESIGN = "design_tp_vs_replicas.md"
WEIGHT = "weight_only_validation.md"
COSTMD = "costmodel_validation.md"
KERN = "engine_kernels_validation.md"
TRAINMD = "training_validation.md"
VLLM = "vllm_validation.md"
STEP = "step_table.md"
TTFT = "ttft_steps.md"


def results_text(name: str) -> str:
    return (RESULTS / name).read_text()


def found(pattern: str, source: str, flags=re.S) -> tuple:
    """The numbers a regex finds in a text (a results file, a TOML's fit_source)."""
    m = re.search(pattern, source, flags)
    assert m, f"{pattern!r} not found in the source"
    return tuple(float(g.replace(",", "")) for g in m.groups())


def n_vllm() -> int:
    return int(rows_csv("vllm_validation_rows.csv").experiment.nunique())


def vllm_signed(name: str, metric: str) -> float:
    """Signed error (%) of one deployment's whole run with the shipped (all-13) fit."""
    d = rows_csv("vllm_validation_rows.csv")
    d = d[(d.split == "fitted") & d.experiment.str.contains(name) & (d.metric == metric) & (d.stage == -1)]
    assert len(d) == 1, (name, metric, len(d))
    return 100 * float(d.rel_error.iloc[0])


@functools.cache
def model_error_data() -> dict:
    import json
    return json.loads(results_text("model_error.json"))


FP8 = "fp8"
FP8_PEAK_H100, BF16_PEAK_H100 = 1979.0, 989.0   # TFLOP/s, hardware_profiles/h100-sxm.toml (checked below)


def decode_us(seqs: int, heads: int, kv_heads: int, step: int, gpu: str = "h100_sxm") -> float:
    """Microseconds of vLLM's decode table: ``seqs`` sequences of ``step`` cached tokens, bf16 KV."""
    from servesim.calibrate import engine_kernels as ek
    d = ek.decode_frame(gpu, "vllm")
    d = d[(d.seqs == seqs) & (d.heads == heads) & (d.kv_heads == kv_heads) & (d.kv_dtype == "bf16")
          & (d.kv_tokens == seqs * (step + 1))]
    assert len(d) == 1, (seqs, heads, kv_heads, step)
    return round(1e6 * float(d.time_s.iloc[0]), 1)


def a100_decode_us(seqs: int, heads: int, kv_heads: int, step: int) -> float:
    return decode_us(seqs, heads, kv_heads, step, "a100_sxm")


def fitted_quant(gpu: str, engine: str) -> float:
    """The fitted gemm_fp8_quant_bytes of the kernel report's fitted-values table."""
    return float(md_row(KERN, gpu=gpu, engine=engine, parameter="`gemm_fp8_quant_bytes`")["value"])


def fp8_heldout(gpu: str, engine: str) -> float:
    return pct(md_row(KERN, gpu=gpu, engine=engine, **{"class": "GEMM fp8"}, rows="held out: 5-fold")["median"])


def fp8_ratios(gpu: str) -> tuple:
    """The model's fp8 / bf16 ratios of fp8_ratios.md, rounded as the README's table prints them."""
    cases = ("llama-3.1-8b TP1 prefill 4,096", "llama-3.1-70b TP4 prefill 8,192", "llama-3.1-8b TP1 decode 64 x 1,024",
             "llama-3.1-70b TP4 decode 64 x 1,024")
    return tuple(f"{float(fp8_row(gpu, c)['ratio']):.2f}" for c in cases)


def published_fp8_ratios() -> tuple:
    rows = md_tables("fp8_ratios.md")[2]
    pre = [float(r["time ratio fp8/fp16"]) for r in rows if r["isl/osl"] == "2048/128"]
    dec = {float(r["time ratio fp8/fp16"]) for r in rows if r["isl/osl"] == "128/2048"}
    assert len(dec) == 1
    return (f"{min(pre):.2f}", f"{max(pre):.2f}", f"{dec.pop():.2f}")


def table_fp8(engine: str, m: str) -> tuple:
    """(lowest, highest) fp8 / bf16 GEMM time of fp8_ratios.md's kernel-table rows for one engine on H100."""
    v = [float(r["ratio"]) for r in md_tables("fp8_ratios.md")[1]
         if r["gpu"] == "h100-sxm" and r["engine"] == engine and r["m"] == m]
    return (f"{min(v):.2f}", f"{max(v):.2f}")


def plan_fp8(dtype: str) -> tuple:
    r = next(r for r in md_tables("fp8_ratios.md")[3] if r["dtype"] == dtype)
    return (int(r["replicas"]), int(r["tp"]), int(r["gpus"]), f"{float(r['usd_per_hour']):.2f}")


def fp8_row(gpu: str, case: str) -> dict:
    hits = [r for r in md_tables("fp8_ratios.md")[0] if r["hardware"] == gpu and r["case"] == case]
    assert len(hits) == 1, (gpu, case)
    return hits[0]


def step_row(gpu_table: int, cls: str, kind: str, batch: str) -> dict:
    """A row of step_table.md's per-GPU table (0 h100-sxm, 1 a100-sxm-80gb, 2 h200-sxm, 3 b200)."""
    hits = [r for r in md_tables(STEP)[gpu_table] if (r["class"], r["kind"], r["batch"]) == (cls, kind, batch)]
    assert len(hits) == 1, (gpu_table, cls, kind, batch)
    return hits[0]


def lodo_stage(name: str, stage: int, metric: str = "e2e_mean") -> float:
    """Signed error (%) of one deployment's load stage, left out one deployment at a time."""
    d = rows_csv("vllm_validation_rows.csv")
    d = d[(d.split == "lodo") & d.experiment.str.contains(name) & (d.metric == metric) & (d.stage == stage)]
    assert len(d) == 1, (name, stage, metric, len(d))
    return 100 * float(d.rel_error.iloc[0])


def llama2_output_share() -> float:
    """Mean output of the Llama-2-7B deployments (implied by their E2E, TTFT, ITL) over the length asked."""
    from servesim.calibrate import vllm_serving as vs
    df = vs.load()
    asked = df[df.stage == -1].set_index("experiment").output_len
    got = vs.implied_output(df)
    names = [e for e in got.index if "llama-2-7b" in e]
    return 100 * float((got[names] / asked[names]).mean())


def max_param_error() -> float:
    from servesim.config import load_model
    return 100 * max(abs(load_model(p.stem).param_count() / load_model(p.stem).published_params - 1)
                     for p in (ROOT / "workloads" / "models").glob("*.toml"))


def design_rate(hw: str, tp: str) -> float:
    return float(md_row(DESIGN, hardware=hw, dtype="bf16", TP=tp)["max rate (req/s)"])


def kernel_fit(gpu: str, engine: str, key: str) -> float:
    import json
    return json.loads((RESULTS / "engine_kernels_fit.json").read_text())[gpu][engine][key]


def quick() -> int:
    return code("servesim.calibrate.validate", "QUICK_STRIDE")


def budget(name: str):
    return code("servesim.engine.budget", name)


FIGURES = [
    # Quickstart, simulate options: defaults and what the code gives
    Fig("Quickstart", r"default rate \(# req/s\), # requests",
        lambda: (toml("workloads/chat.toml")["default_rate"], code("servesim.workload.spec", "DEFAULT_NUM_REQUESTS")),
        EXACT),
    Fig("Commands", r"the model's # tokens", lambda: code("servesim.config", "load_model")("llama-3.1-8b").max_context, EXACT),
    Fig(SIM, r"# requests at `--rate 12` deliver\s+about # req/s",
        lambda: (300, computed("daily_short")["delivered_rate_req_s"]), slow=True),
    Fig(SIM, r"whole day, # requests", lambda: computed("daily_day")["requests"], EXACT),
    Fig(SIM, r"\(histogram, #%-wide log bins\)",
        lambda: 100 * (10 ** ((code("servesim.engine.codes", "GAP_LOG10_MAX") - code("servesim.engine.codes", "GAP_LOG10_MIN"))
                              / code("servesim.engine.codes", "GAP_BINS")) - 1)),
    Fig(SIM, r"\(# requests at #% of capacity are\s+undetermined; # are saturated\)",
        lambda: (100 if computed("verdict_short_overload")[100] == "undetermined" else -1, 120,
                 3000 if computed("verdict_short_overload")[3000] == "saturated" else -1), EXACT, slow=True),
    Fig(SIM, r"fall more than #% behind arrivals", lambda: 100 * code("servesim.metrics", "MAX_ADMISSION_LAG"), EXACT),
    Fig(SIM, r"grows by more than # s per second", lambda: code("servesim.metrics", "MAX_QUEUE_SLOPE"), EXACT),
    Fig(SIM, r"fewer than # arrivals", lambda: code("servesim.metrics", "MIN_WINDOW_ARRIVALS"), EXACT),
    # streamed runs: the constants of the code
    Fig(STREAM, r"\(`servesim/engine/budget.py`, ~# B per request\)",
        lambda: code("servesim.engine.budget", "BYTES_PER_REQUEST"), EXACT),
    Fig(STREAM, r"is above # GB or half the available memory",
        lambda: code("servesim.engine.budget", "STREAM_ABOVE_BYTES") / 1e9, EXACT),
    Fig(STREAM, r"chunk by chunk \(# at a time\)", lambda: code("servesim.engine.stream", "CHUNK"), EXACT),
    Fig(STREAM, r"bins #% wide: each percentile within \*\*#%\*\*",
        lambda: (100 * code("servesim.loghist", "REL_WIDTH"), 100 * code("servesim.loghist", "REL_ERROR")),
        (EXACT, 0.01)),
    Fig(STREAM, r"batch means over # separate batches", lambda: code("servesim.metrics_stream", "BATCHES"), EXACT),
    Fig(STREAM, r"Student-t, # degrees of freedom", lambda: code("servesim.metrics_stream", "BATCHES") - 1, EXACT),
    Fig(STREAM, r"throughput over # equal bins", lambda: code("servesim.metrics_stream", "BATCHES"), EXACT),
    Fig(STREAM, r"more than n / # requests", lambda: code("servesim.metrics_stream", "BATCHES"), EXACT),
    Fig(STREAM, r"past # requests in the system", lambda: code("servesim.engine.stream", "MAX_WINDOW"), EXACT),
    # Busy and capacity headroom
    Fig(BUSY, r"reads\s+~#% far below capacity \(the default deployment at # req/s: busy #%, KV cache #%",
        lambda: (computed("default_load")["busy_pct"], 5.5, computed("default_load")["busy_pct"],
                 computed("default_load")["kv_cache_pct"]), slow=True),
    Fig(MODERR, r"It holds #% intervals", lambda: 100 * code("servesim.model_error", "LEVEL"), EXACT),
    Fig(MODERR, r"vLLM suite: # runs and\s+stages", lambda: len({r["key"] for r in model_error_data()["latency"]}), EXACT),
    Fig(MODERR, r"needs\s+residuals of # deployments and the suite\s+has 13",
        lambda: code("servesim.model_error", "MIN_CLASS"), EXACT),
    Fig(MODERR, r"the pooled #% interval covers #% of its E2E\s+rows, #% of its ITL rows and #% of its TTFT rows",
        lambda: (80, *(100 * model_error_data()["coverage"][m] for m in ("e2e_mean", "itl_mean", "ttft_mean"))),
        EXACT),
    Fig(MODERR, r"asserts #-#%\)", lambda: (70, 90), EXACT),
    Fig(MODERR, r"per\s+family and load class it covered #% and #%",
        lambda: found(r"however small: e2e_mean (\d+)%, ttft_mean (\d+)%", results_text("model_error.md")), EXACT),
    Fig(MODERR, r"prints a\s+`model #%` row", lambda: 100 * code("servesim.model_error", "LEVEL"), EXACT),
    Fig(PLAN, r"default #%, the worst", lambda: 100 * code("servesim.model_error", "margin_default")("dense"), EXACT),
    Fig(BUSY, r"bisected to #%", lambda: 100 * code("servesim.planning.capacity", "TOL"), EXACT),
    Fig(BUSY, r"That costs #-# more\s+simulations",
        lambda: _within(computed("default_capacity")["simulations"], 5, 8), EXACT, slow=True),
    Fig(BUSY, r"sustains # req/s, headroom #% at # req/s",
        lambda: (computed("default_capacity")["max_sustainable_rate_req_s"], computed("default_capacity")["headroom_pct"],
                 5.5), slow=True),
    Fig(BUSY, r"calls growth of the queueing delay under\s+# s per s",
        lambda: code("servesim.metrics", "MAX_QUEUE_SLOPE"), EXACT),
    Fig(BUSY, r"can sit up to ~#% above", lambda: 100 * code("servesim.metrics", "MAX_QUEUE_SLOPE"), EXACT),
    # Confidence intervals: constants
    Fig(CI, r"Over # seeds of the default deployment \(# requests\) the intervals of mean and p99 TTFT and E2E\s+"
            r"hold the across-seed mean in #% \(#% of capacity\) and #% \(#%\) of cases, against #% and #%",
        lambda: (40, 2000, computed("interval_coverage")["latency_pct_at_30%"], 30,
                 computed("interval_coverage")["latency_pct_at_75%"], 75, BEFORE, BEFORE), slow=True),
    Fig(CI, r"\(# seeds: req/s covered in #% at #%, #% at #%\)",
        lambda: (120, computed("interval_coverage")["requests_per_s_pct_at_30%"], 30,
                 computed("interval_coverage")["requests_per_s_pct_at_75%"], 75), slow=True),
    Fig(CI, r"correlate at\s+most #", lambda: code("servesim.intervals", "MAX_BATCH_CORR"), EXACT),
    Fig(CI, r"within # to # batches",
        lambda: (code("servesim.intervals", "K_MIN"), code("servesim.intervals", "K_MAX")), EXACT),
    Fig(CI, r"fewer than # values", lambda: code("servesim.intervals", "MIN_VALUES"), EXACT),
    # Cost model: weight-only int4, the memory error
    Fig(COST, r"GEMMs #x of bf16 on h100-sxm, the\s+bytes give #x",
        lambda: (computed("int4_decode_gemms")["time_ratio"], computed("int4_decode_gemms")["bytes_ratio"]), slow=True),
    Fig(COST, r"add # us of fixed time per GEMM",
        lambda: code("servesim.costmodel.dtypes", "WEIGHT_ONLY_EXTRA_LATENCY_US")),
    Fig(COST, r"median error\s+#% against #% for the bf16 fit",
        lambda: found(r"shipped: .*?median \|error\| ([\d.]+)%.*?bf16 fit on the same shapes: median \|error\| ([\d.]+)%",
                      results_text(WEIGHT))),
    Fig(COST, r"are the bf16 ones within #%",
        lambda: 100 * max(abs(x - 1) for x in found(r"compute fraction x ([\d.]+), bandwidth fraction x ([\d.]+)",
                                                    results_text(WEIGHT)))),
    Fig(COST, r"needs # GiB of weights per GPU at TP=1 PP=1; h100-sxm holds\s+# GiB \(# GiB",
        lambda: (computed("infeasible_70b")["weights_gib"], computed("infeasible_70b")["holds_gib"],
                 computed("infeasible_70b")["usable_gib"]), EXACT),
    # Engine: the FIFO pipeline now (the figures before it are the previous model's: EXEMPT)
    Fig(ENGINE, r"about #% of PP micro-batches overtook, and TP=4 x PP=2 matched TP=8 offline\s+\(llama-3.1-70b, "
                r"chat, # requests: # vs # output tok/s\); now it gives #, its first\s+stage computing #% of the time "
                r"and the later one #%",
        lambda: (BEFORE, 2000, BEFORE, computed("pipeline_fifo")["tp8_output_tok_s"],
                 computed("pipeline_fifo")["tp4pp2_output_tok_s"], computed("pipeline_fifo")["first_stage_busy_pct"],
                 computed("pipeline_fifo")["later_stage_busy_pct"]), slow=True),
    # Capacity planning: defaults
    Fig(PLAN, r"within `--tolerance` \(#%\)", lambda: 100 * _default("find_max_rate", "tolerance"), EXACT),
    Fig(PLAN, r"with\s+`--margin` headroom \(#%\)", lambda: 100 * _default("plan", "margin"), EXACT),
    Fig(PLAN, r"still within #x its value", lambda: code("servesim.planning.sweep", "KNEE_FACTOR"), EXACT),
    Fig(PLAN, r"# requests per\s+simulation, # req/s,", lambda: (readme_figures_module().PLAN_ARGS["num_requests"],
                                                                readme_figures_module().PLAN_ARGS["rate"]), EXACT),
    Fig(PLAN, r"exhaustive plan over the #-point space", lambda: computed("plan_space")["search_space"], EXACT,
        slow=True),
    Fig(PLAN, r"finds the same answer with # simulations", lambda: computed("plan_space")["simulations"], EXACT,
        slow=True),
    # Training: constants and fitted values
    Fig(TRAIN, r"FlashAttention-2: #% of the H100 peak",
        lambda: 100 * toml("servesim/training/data/architectures.toml")["hopper"]["fa2_attention_max"], EXACT),
    Fig(TRAIN, r"fp8/bf16 GEMM ratio \(# on H100, measured\)",
        lambda: toml("servesim/training/data/architectures.toml")["hopper"]["fp8_gemm_ratio"], EXACT),
    Fig(TRAIN, r"NVLink-C2C at # GB/s on GB200",
        lambda: toml("hardware_profiles/gb200-nvl72.toml")["interconnect"]["pcie_bandwidth_GBps"], EXACT),
    Fig(TRAIN, r"\(A100 #, H100 #: training",
        lambda: found(r"shipped: compute scale ampere ([\d.]+), hopper ([\d.]+)", results_text(TRAINMD)), EXACT),
    Fig(TRAIN, r"DP `overlap` \(#, the best", lambda: found(r"shipped: compute scale.*?overlap (\d+\.\d+)",
                                                            results_text(TRAINMD)), EXACT),
    Fig(TRAIN, r"with ALiBi, x# of the FlashAttention-2 curve",
        lambda: dict(code("servesim.training.params", "FITTED").attn_scale)["composer"]),
    Fig(TRAIN, r"All # runs of the file", lambda: len(rows_csv("training_validation_rows.csv")), EXACT),
    Fig(TRAIN, r"the # MFU / HFU rows restate", lambda: found(r"(\d+) MFU / HFU rows restate", results_text(TRAINMD)),
        EXACT),
    Fig(TRAIN, r"bf16 GEMM fractions \(# over # shapes\)",
        lambda: (toml("servesim/training/data/architectures.toml")["blackwell"]["gemm_vs_source"],
                 found(r"bf16 GEMM, (\d+) shapes", results_text("training_kernels.md"))[0]), EXACT),
    Fig(TRAIN, r"fp8/bf16 ratio \(# in all\)",
        lambda: toml("servesim/training/data/architectures.toml")["blackwell"]["fp8_gemm_ratio"], EXACT),
    Fig(TRAIN, r"bus-bandwidth ratio \(#\)",
        lambda: toml("servesim/training/data/architectures.toml")["blackwell"]["scaleup_bw_vs_source"], EXACT),
    Fig(TRAIN, r"--check` requires median <= #%, p90 <= #% and no framework x GPU group median\s+above #%",
        lambda: (100 * code("servesim.calibrate.validate", "TOLERANCE")["training"],
                 100 * code("servesim.calibrate.validate", "TRAINING_P90"),
                 100 * code("servesim.calibrate.validate", "TRAINING_GROUP")), EXACT),
    # Data
    Fig("Data", r"# accelerators", lambda: len(list((ROOT / "hardware_profiles").glob("*.toml"))), EXACT),
    Fig("Data", r"# architectures", lambda: len(list((ROOT / "workloads" / "models").glob("*.toml"))), EXACT),
    Fig("Data", r"published totals within #%", lambda: max_param_error()),
    # Calibration and accuracy
    Fig(CAL, r"held out at #% \(#% with one fraction of the fp8 peak and a fixed time\)",
        lambda: (pct(md_row(KERN, gpu="h100-sxm", engine="vllm", **{"class": "GEMM fp8"}, rows="held out: 5-fold")["median"]),
                 13.3)),   # 13.3%: the previous fit's held-out median, as the README says (the report of that commit)
    Fig(CAL, r"explains for vLLM but not for SGLang \(#% held out\)",
        lambda: pct(md_row(KERN, gpu="h100-sxm", engine="sglang", **{"class": "GEMM fp8"}, rows="held out: 5-fold")["median"])),
    Fig(CAL, r"fused MoE in 16 bits is held out at #% over all token counts and #% at decode batches \(1-512\s+tokens",
        lambda: tuple(pct(md_row(KERN, gpu="h100-sxm", engine="vllm", **{"class": "fused MoE bf16"}, rows=r)["median"])
                      for r in ("held out: 5-fold", "held out: decode"))),
    Fig(CAL, r"vary from # to # of the fp8 peak",
        lambda: (float(md_row(KERN, gpu="h100-sxm", engine="vllm", min="0.")["min"]), float(md_row(KERN, gpu="h100-sxm", engine="vllm", min="0.")["max"])),
        EXACT),
    Fig(CAL, r"reads KV faster than HBM allows \(up to #x",
        lambda: float(md_row(KERN, gpu="h100-sxm", engine="trtllm", **{"max KV read": ""})["ratio"])),
    Fig(CAL, r"# vLLM 0\.15\.1 deployments on H100 measured", n_vllm, EXACT),
    Fig(CAL, r"`graph_overlap` # of each", lambda: vllm_h100("graph_overlap"), EXACT),
    Fig(CAL, r"tuned tiles \(TP 2-8\):\s+#% median on H100 \(#% before\), #% on H200 \(#% before\); all TP #% and #% "
             r"\(#% and #% before\)",
        lambda: (*(v for g in ("h100-sxm", "h200-sxm") for v in (
                     pct(md_row(KERN, gpu=g, engine="vllm", **{"class": "fused MoE bf16"},
                                rows="held out: Mixtral shapes, 1-512 tokens, tuned")["median"]), BEFORE)),
                 *(pct(md_row(KERN, gpu=g, engine="vllm", **{"class": "fused MoE bf16"},
                              rows="held out: Mixtral 8x7B and 8x22B shapes")["median"]) for g in ("h100-sxm", "h200-sxm")),
                 BEFORE, BEFORE), EXACT),   # before: the report at a3f4035, without moe_stream_bytes
    Fig(CAL, r"#% and #% before `moe_stream_bytes`;\s+H200 #% and #%, from #% and #%",
        lambda: (BEFORE, BEFORE, *(pct(md_row(KERN, gpu="h200-sxm", engine="vllm", **{"class": "fused MoE bf16"},
                                              rows=r)["median"]) for r in ("held out: 5-fold", "held out: decode")),
                 BEFORE, BEFORE), EXACT),
    Fig(CAL, r"at #-# rows per expert on H100 the default large tile's\s+#-element step \(#-byte runs\) streams the "
             r"weights at # of HBM \(median\), the tuned tiles' #-,\s+#- and #-element steps at #, # and #",
        lambda: (1, 32, 32, 64, *(float(md_row(KERN, gpu="h100-sxm", **{"K step": str(k)})["median rate"])
                                  for k in (32,)), 64, 128, 256,
                 *(float(md_row(KERN, gpu="h100-sxm", **{"K step": str(k)})["median rate"]) for k in (64, 128, 256))),
        EXACT),
    Fig(CAL, r"\(fitted: H100 # bytes, H200 #; on B200, whose vLLM #\.# default tile was not checked, the fit finds no "
             r"gain and writes #\)",
        lambda: (*(toml("engines/vllm.toml")["hardware"][g]["moe_stream_bytes"] for g in ("h100-sxm", "h200-sxm")),
                 0, 19, toml("engines/vllm.toml")["hardware"]["b200"]["moe_stream_bytes"]), EXACT),
    Fig(CAL, r"within the #% target at every batch", lambda: 100 * code("servesim.calibrate.step_check", "TARGET"), EXACT),
    Fig(CAL, r"decode attention at batch 1 and 8 is #% and\s+#% \(median\) on H100, #% and #% on A100",
        lambda: tuple(pct(step_row(g, "attention", "decode", b)["median"]) for g in (0, 1) for b in ("1", "8")), EXACT),
    Fig(CAL, r"\(H100 was -#% before the split-KV term below\)", lambda: 13.0, EXACT),
        # -12.9% / -12.6% signed at batch 1 / 8: step_table.md before the split-KV term (a3f4035)
    Fig(CAL, r"# sequences x 1 KV head take # us, 1 sequence x # KV heads\s+# us, at # tokens of context",
        lambda: (8, decode_us(8, 4, 1, 4095), 8, decode_us(1, 32, 8, 4095), 4095), EXACT),
    Fig(CAL, r"`attn_decode_block_GBps` \(# GB/s fitted on H100\)", lambda: vllm_h100("attn_decode_block_GBps"), EXACT),
    Fig(CAL, r"vLLM's A100 decode table is held out\s+at #%",
        lambda: pct(md_row(KERN, gpu="a100-sxm-80gb", engine="vllm", **{"class": "decode attention"},
                           rows="held out: 5-fold")["median"]), EXACT),
    Fig(CAL, r"two sequences take ~# us more than one even at # tokens",
        lambda: (float(np.median([a100_decode_us(2, 4 * kv, kv, 127) - a100_decode_us(1, 4 * kv, kv, 127)
                                  for kv in (2, 4, 8)])), 128), (0.1, EXACT)),
    Fig(CAL, r"on decode attention at batch 8 \(\+#%\)", lambda: pct(step_row(3, "attention", "decode", "8")["signed"]),
        EXACT),
    Fig(CAL, r"above the custom kernel's # MiB", lambda: toml("engines/vllm.toml")["kernels"]["custom_allreduce_max_mib"],
        EXACT),
    Fig(CAL, r"with vLLM's frontend time of the time \(# ms\) added, the four H100 batch-1 static TTFT rows "
             r"\(#-# ms measured\) were #% off",
        lambda: (BEFORE, *(lambda v: (v.min(), v.max()))(static_ttft_rows("H100").value), BEFORE), EXACT),
        # 8.65 ms and 27.7%: engines/vllm.toml and serving_validation.md before the in-process rows dropped
        # the frontend (2a369ae)
    Fig(CAL, r"on the # deployments of the short-output workloads", lambda: found(r"On the (\d+) deployments",
                                                                                  results_text(TTFT)), EXACT),
    Fig(CAL, r"the measured TTFT is # ms \+ # x ITL,\s+each within -#..\+#% of that line",
        lambda: found(r"TTFT = ([\d.]+) ms \+ ([\d.]+) x ITL.*?within -([\d.]+)\.\.\+([\d.]+)%", results_text(TTFT)),
        EXACT),
    Fig(CAL, r"The three reasoning deployments sit \+#..\+#% above the line",
        lambda: (min(found(r"reasoning-lite-\S+ \+([\d.]+)%, \S+ \+([\d.]+)%, \S+ \+([\d.]+)%", results_text(TTFT))),
                 max(found(r"reasoning-lite-\S+ \+([\d.]+)%, \S+ \+([\d.]+)%, \S+ \+([\d.]+)%", results_text(TTFT)))),
        EXACT),
    Fig(CAL, r"on the codegen shape at # req/s asks\s+# output tokens/s",
        lambda: found(r"against ([\d,]+) that (\d+) req/s", results_text(TTFT))[::-1], EXACT),
    Fig(CAL, r"\(# sequences at the mean context of #\s+tokens\) gives at most #",
        lambda: found(r"the batch is (\d+): ([\d,]+) tokens/s at the datasheet", results_text(TTFT))[:1]
        + found(r"mean context (\d+) tokens", results_text(TTFT))
        + found(r"the batch is \d+: ([\d,]+) tokens/s at the datasheet", results_text(TTFT)), EXACT),
    Fig(CAL, r"and # generated tokens per request", lambda: found(r"x (\d+) tokens ask for", results_text(TTFT)), EXACT),
    Fig(CAL, r"host time carried from H100 \(at most # ms, at batch #\)",
        lambda: (max(float(r["host ms (hidden when < step)"]) for r in md_tables(TTFT)[-1]),
                 max(int(r["batch"]) for r in md_tables(TTFT)[-1])), EXACT),
    Fig(CAL, r"`step_gpu_us` \(# us: H100's, scaled by A100's\s+own GEMM fixed time\), is #-#% of a step",
        lambda: (float(md_tables(TTFT)[-1][0]["step_gpu ms"]) * 1000,
                 min(100 * float(r["step_gpu ms"]) / float(r["step ms"]) for r in md_tables(TTFT)[-1]),
                 max(100 * float(r["step_gpu ms"]) / float(r["step ms"]) for r in md_tables(TTFT)[-1])), EXACT),
    Fig(CAL, r"\(#% of an H100 step, median\)",
        lambda: pct(next(r for r in md_tables(STEP)[5] if r["gpu"] == "h100-sxm")["elementwise share"])),
    Fig(CAL, r"`step_gpu_us` #, GPU time", lambda: vllm_h100("step_gpu_us"), EXACT),
    Fig(CAL, r"`host_step_us` # and\s+`host_per_seq_us` # \(CPU time",
        lambda: (vllm_h100("host_step_us"), vllm_h100("host_per_seq_us")), EXACT),
    Fig(CAL, r"`frontend_us` # per\s+request", lambda: vllm_h100("frontend_us"), EXACT),
    Fig(CAL, r"at batch # that is # ms of CPU",
        lambda: (256, (vllm_h100("host_step_us") + 256 * vllm_h100("host_per_seq_us")) / 1000), EXACT),
    Fig(CAL, r"stage 0 \(the lower rate\) -#%\s+E2E, -#% TTFT, -#% ITL; stage 1 \(the higher rate\) \+#%, \+#%, \+#%\. "
             r"All meet the \+-#%\s+target",
        lambda: tuple(abs(pct(md_tables(VLLM)[5][i][m])) for i in (0, 1) for m in ("E2E mean", "TTFT mean", "ITL mean"))
        + (100 * code("servesim.calibrate.vllm_heldout", "STAGE_BIAS"),), EXACT),
    Fig(CAL, r"Llama-2-7B codegen:\s+\+#..\+#%\) and under-predicts the reasoning workload's \(1,064-token prompts, "
             r"1,448 output tokens:\s+-#..-#%\)",
        lambda: (min(lodo_stage(e, 1, "ttft_mean") for e in ("62-mistral", "63-mistral", "llama-2-7b-tp1-codegen")),
                 max(lodo_stage(e, 1, "ttft_mean") for e in ("62-mistral", "63-mistral", "llama-2-7b-tp1-codegen")),
                 min(-lodo_stage(e, -1, "ttft_mean") for e in ("66-qwen", "67-llama-2", "48-llama-4")),
                 max(-lodo_stage(e, -1, "ttft_mean") for e in ("66-qwen", "67-llama-2", "48-llama-4")))),
    Fig(CAL, r"None of the # stable deployments", n_vllm, EXACT),
    Fig(CAL, r"With all # fitted", n_vllm, EXACT),
    Fig(CAL, r"E2E mean\s+#%, TTFT mean #%, ITL #%\.",
        lambda: tuple(pct(md_tables(VLLM)[0][0][m]) for m in ("E2E mean", "TTFT mean", "ITL mean")), EXACT),
    Fig(CAL, r"Worst: Llama-4-Scout at\s+# req/s with # output tokens \(-#% E2E, -#% TTFT\), Llama-3.1-70B TP4 "
             r"\(-#..-#% E2E\) and\s+Llama-2-7B codegen \(\+#% E2E, \+#% TTFT\)",
        lambda: (1, 1448, -vllm_signed("48-llama-4", "e2e_mean"), -vllm_signed("48-llama-4", "ttft_mean"),
                 *sorted(-vllm_signed(e, "e2e_mean") for e in ("60-llama-3", "61-llama-3")),
                 vllm_signed("llama-2-7b-tp1-codegen", "e2e_mean"), vllm_signed("llama-2-7b-tp1-codegen", "ttft_mean")),
        (EXACT, EXACT, 0.05, 0.05, 0.1, 0.1, 0.1, 0.1)),
    Fig(CAL, r"except for Llama-2-7B \(#:\s+SentencePiece\)", lambda: llama2_output_share() / 100),
    Fig(CAL, r"at\s+1 req/s with # output tokens \(-#% E2E, -#% TTFT\)",
        lambda: (1448, -vllm_signed("48-llama-4-scout", "e2e_mean"), -vllm_signed("48-llama-4-scout", "ttft_mean"))),
    Fig(CAL, r"Llama-3.1-70B TP4 \(-#..-#% E2E\)",
        lambda: tuple(sorted(-vllm_signed(e, "e2e_mean") for e in ("60-llama-3-1-70b", "61-llama-3-1-70b")))),
    Fig(CAL, r"grows from the lower to the higher rate #x as fast\s+as measured",
        lambda: found(r"request ([\d.]+)x", results_text("vllm_workload_evidence.md")), EXACT),
    Fig(CAL, r"the growth is #x the measured one and the signed ITL error -#% at\s+the lower rate, \+#% at the higher",
        lambda: found(r"user ([\d.]+)x", results_text("vllm_workload_evidence.md"))
        + tuple(abs(v) for v in found(r"user: stage 0 ([+-][\d.]+)%, stage 1 ([+-][\d.]+)%",
                                      results_text("vllm_workload_evidence.md"))), EXACT),
    Fig(CAL, r"Llama-3.1-70B TP4 codegen \+# ms from # to\s+# req/s against \+# ms measured",
        lambda: (found(r"61-llama-3-1-70b-tp4-codegen-4-1 \| [\d.]+ \| [\d.]+ \| [+-][\d.]+ \| [\d.]+ \| [\d.]+ \| "
                       r"\+([\d.]+)", results_text("vllm_workload_evidence.md"))[0], 5, 10,
                 found(r"61-llama-3-1-70b-tp4-codegen-4-1 \| [\d.]+ \| [\d.]+ \| \+([\d.]+)",
                       results_text("vllm_workload_evidence.md"))[0]), EXACT),
    Fig(CAL, r"turns a 50-decode\s+step of # ms into one of # ms",
        lambda: found(r"50 decodes \(context 720\) \| ([\d.]+) .*?chunk \(96 cached\) \| ([\d.]+)",
                      results_text("vllm_workload_evidence.md")), EXACT),
    # fp8
    Fig(FP8, r"holds out at #% median for vLLM on H100\s+\(#% with one fraction and a fixed time, the previous fit\), #% "
             r"on H200, #% for TensorRT-LLM",
        lambda: (fp8_heldout("h100-sxm", "vllm"), 13.3, fp8_heldout("h200-sxm", "vllm"), fp8_heldout("h100-sxm", "trtllm"))),
        # 13.3%: the previous fit's held-out median (engine_kernels_validation.md of d46b37c)
    Fig(FP8, r"\| h100-sxm \(own tables\) \| # \| # \| # \| # \|", lambda: fp8_ratios("h100-sxm"), EXACT),
    Fig(FP8, r"\| h200-sxm \(own tables\) \| # \| # \| # \| # \|", lambda: fp8_ratios("h200-sxm"), EXACT),
    Fig(FP8, r"\| b200 \(own tables\) \| # \| # \| # \| # \|", lambda: fp8_ratios("b200"), EXACT),
    Fig(FP8, r"is #-#x the time on prefill-heavy rows and #x on decode-heavy rows",
        lambda: published_fp8_ratios(), EXACT),
    Fig(FP8, r"tables give fp8 / bf16 GEMM time # and #-# at\s+m = 4,096 on those layers; vLLM 0.14's per-tensor rows give "
             r"#-# there",
        lambda: (table_fp8("sglang", "4096")[0], *table_fp8("trtllm", "4096"), *table_fp8("vllm", "4096")), EXACT),
    Fig(FP8, r"its vLLM 0.19 fp8\s+rows reach # of the fp8 peak", lambda: kernel_fit("b200", "vllm", "gemm_fp8_max")),
    Fig(FP8, r"Llama-3.1-70B at # req/s \(`ttft_p99=2s,tpot_p99=80ms`\) gets # x TP# in fp8 \(# GPUs,\s+\$#/h; the "
             r"cheapest in bf16 is # x TP#, # GPUs, \$#/h\)",
        lambda: (10, *plan_fp8("fp8"), *plan_fp8("bf16")), EXACT),
    Fig(FP8, r"E2E within \+#..\+#% on three workloads, -#% on the\s+reasoning one",
        lambda: (min(vllm_signed(e, "e2e_mean") for e in ("17-llama-4", "20-llama-4", "21-llama-4")),
                 max(vllm_signed(e, "e2e_mean") for e in ("17-llama-4", "20-llama-4", "21-llama-4")),
                 -vllm_signed("48-llama-4", "e2e_mean"))),
    Fig(FP8, r"runs at # of the H100 fp8 peak \(# PFLOP/s, #x its bf16 GEMMs\)",
        lambda: (vllm_h100("gemm_fp8_max"), FP8_PEAK_H100 * vllm_h100("gemm_fp8_max") / 1000,
                 FP8_PEAK_H100 * vllm_h100("gemm_fp8_max") / (BF16_PEAK_H100 * vllm_h100("gemm_max")))),
    Fig(FP8, r"moves the equivalent of # bytes per element \(H100; SGLang's #,\s+TensorRT-LLM's #, vLLM 0.19 on B200 #",
        lambda: (fitted_quant("h100-sxm", "vllm"), fitted_quant("h100-sxm", "sglang"), fitted_quant("h100-sxm", "trtllm"),
                 fitted_quant("b200", "vllm"))),
    Fig(FP8, r"the\s+engine profile prices # bytes", lambda: vllm_h100("gemm_fp8_quant_bytes"), EXACT),
    Fig(FP8, r"The 8B 4,096-token prefill on H100 is # ms in fp8 against # ms in bf16",
        lambda: tuple(float(fp8_row("h100-sxm", "llama-3.1-8b TP1 prefill 4,096")[k]) for k in ("fp8_ms", "bf16_ms")),
        tol=0.002),
    Fig(FP8, r"70B TP4 at 8,192 tokens\s+# ms against # ms",
        lambda: tuple(float(fp8_row("h100-sxm", "llama-3.1-70b TP4 prefill 8,192")[k]) for k in ("fp8_ms", "bf16_ms")),
        tol=0.002),
    Fig(CAL, r"`p2p_large_message_mib` = # MiB",
        lambda: toml("hardware_profiles/a100-sxm-80gb.toml")["efficiency"]["p2p_large_message_mib"], EXACT),
    Fig(CAL, r"rate steps down from ~# to ~# GB/s",
        lambda: found(r"a100_dgx (\d+) -> (\d+) GB/s", results_text(COSTMD)), EXACT),
    Fig(CAL, r"\(# GB/s bidirectional for the A100 PCIe",
        lambda: found(r"\((\d+) GB/s bidirectional: A100 PCIe", results_text(COSTMD)), EXACT),
    Fig(CAL, r"predict these eager rows at #-#% \(held out\), against #-#%",
        lambda: found(r"held-out median is ([\d.]+)%-([\d.]+)% against today's ([\d.]+)%-([\d.]+)%", results_text(KERN)),
        tol=0.25),
    Fig(CAL, r"fitted to the # TensorRT-LLM v0\.9 static-batch rows",
        lambda: int(rows_csv("serving_validation_rows.csv").split.str.startswith("fitted").sum()), EXACT),
    Fig(CAL, r"then all # published rows", lambda: len(rows_csv("serving_validation_rows.csv")), EXACT),
    Fig(CAL, r"steps from ~# to ~# GB/s between # and # MiB",
        lambda: found(r"a100_dgx (\d+) -> (\d+) GB/s.*?between ([\d.]+) and ([\d.]+) MiB", results_text(COSTMD)), EXACT),
    Fig(CAL, r"one rate for all sizes gave #% held\s+out",
        lambda: found(r"one rate for all sizes: a100-sxm-80gb [\d.]+% vs ([\d.]+)%", results_text(COSTMD))),
    Fig(CAL, r"\(#x the predicted time, median; #% error; H100's bridge pair #x\)",
        lambda: found(r"2-worker all-reduce over the bridge.*?takes a100-sxm-80gb ([\d.]+)x, h100-sxm ([\d.]+)x", results_text(COSTMD))[:1]
        + (pct(md_row(COSTMD, gpu="a100-sxm-80gb", **{"operator class": "all_reduce"}, split="held-out: pairwise, 2 GPUs")["median rel. error"]),)
        + found(r"2-worker all-reduce over the bridge.*?takes a100-sxm-80gb [\d.]+x, h100-sxm ([\d.]+)x", results_text(COSTMD))),
    Fig(CAL, r"move ~# GB/s, above one\s+direction of either bridge \(# GB/s\)",
        lambda: found(r"a100_pairwise_nvlink (\d+) GB/s", results_text(COSTMD)) + (300,), EXACT),
    Fig(CAL, r"# of #\s+groups would exceed", lambda: found(r"(\d+) of the (\d+) \(system", results_text(COSTMD)), EXACT),
    Fig(CAL, r"per-tensor fp8 GEMMs \(# of the fp8 peak", lambda: kernel_fit("h100-sxm", "trtllm", "gemm_fp8_max")),
    Fig(CAL, r"held-out H100 FP8 throughput rows #% too slow",
        lambda: found(r"FP8 throughput rows (\d+)% too slow", toml("engines/trtllm.toml")["hardware"]["h100-sxm"][
            "fit_source"]), EXACT),
    Fig(CAL, r"The suite median is # points better and its p90 # points better; (\w+) of the (\w+) groups got\s+"
             r"worse, by up to # points", lambda: serving_table_changes(p90_better=True), tol=(EXACT, EXACT, EXACT, EXACT, EXACT)),
    Fig(CAL, r"held-out rows under the #%\s+median target",
        lambda: 100 * code("servesim.calibrate.validate", "TOLERANCE")["serving"], EXACT),
    # Reports and studies: the design study's results
    Fig(REPORT, r"h200-sxm \(# and # req/s; TP=8 x 1 #% and #% less, TP=2 x 4 the least, # req/s on the\s+H100, "
                r"whose KV cache then holds # tokens",
        lambda: (design_rate("h100-sxm", "4"), design_rate("h200-sxm", "4"),
                 100 * (1 - design_rate("h100-sxm", "8") / design_rate("h100-sxm", "4")),
                 100 * (1 - design_rate("h200-sxm", "8") / design_rate("h200-sxm", "4")), design_rate("h100-sxm", "2"),
                 number(md_row(DESIGN, hardware="h100-sxm", dtype="bf16", TP="2")["KV tokens / replica"])),
        (REL, REL, REL, REL, REL, EXACT)),
    Fig(REPORT, r"the H200 adds ~#% rate at TP=4 for\s+~#x the \$ per output token",
        lambda: (100 * (design_rate("h200-sxm", "4") / design_rate("h100-sxm", "4") - 1),
                 found(r"TP=4: [\d.]+x, TP=8: [\d.]+x the max rate.*?, ([\d.]+)x, [\d.]+x the \$", results_text(DESIGN))[0])),
    Fig(REPORT, r"the fp8 GEMM at\s+# of the fp8 peak, the activation quantised in one pass\) fp8 weights carry #x the best bf16",
        lambda: (vllm_h100("gemm_fp8_max"), found(r"carry ([\d.]+)x the best bf16 rate", results_text(DESIGN))[0])),
    Fig(REPORT, r"# requests\s+per simulation, 15e12", lambda: code("servesim.report.build", "ReportSpec")().num_requests, EXACT),
    Fig(TRAIN, r"keeps each layout within #% of device memory",
        lambda: 100 * code("servesim.training.search", "SEARCH_MEMORY_FRACTION"), EXACT),
    Fig(TRAIN, r"a # GiB runtime\s+reserve", lambda: code("servesim.training.memory", "RUNTIME_RESERVE_BYTES") / 2**30,
        EXACT),
    # Calibrating your own hardware: calibrate's thresholds, the validate suites
    Fig(CALIB, r"changes the predictions by < #%", lambda: 100 * code("servesim.calibrate.fit", "UNIDENTIFIED"), EXACT),
    Fig(CALIB, r"faster than #x the datasheet peak", lambda: code("servesim.calibrate.fit", "PLAUSIBLE_OVER_PEAK"), EXACT),
    Fig(CALIB, r"a median #x off", lambda: math.exp(code("servesim.calibrate.fit", "IMPLAUSIBLE_LOG_RES")), EXACT),
    Fig(CALIB, r"serving #%, training #%",
        lambda: tuple(100 * code("servesim.calibrate.validate", "TOLERANCE")[k] for k in ("serving", "training")), EXACT),
    Fig(CALIB, r"currently #% on the\s+# serving rows, #% on the # rows of the `--quick` sample, #% on the # training rows",
        lambda: (abs_err_median("serving_validation_rows.csv"), len(rows_csv("serving_validation_rows.csv")),
                 abs_err_median("serving_validation_rows.csv", quick()), len(rows_csv("serving_validation_rows.csv")[::quick()]),
                 abs_err_median("training_validation_rows.csv"), len(rows_csv("training_validation_rows.csv"))),
        (REL, EXACT, REL, EXACT, REL, EXACT)),
    Fig(CALIB, r"training suite also checks p90 #% and each framework x GPU group's median #%",
        lambda: (100 * code("servesim.calibrate.validate", "TRAINING_P90"),
                 100 * code("servesim.calibrate.validate", "TRAINING_GROUP")), EXACT),
    Fig(CALIB, r"`--quick` takes every #th serving row", lambda: code("servesim.calibrate.validate", "QUICK_STRIDE"),
        EXACT),
    # Speed: the overload example (its wall time is dated)
    Fig("Speed", r"# requests at # req/s against one H100 \(capacity ~ # req/s\)",
        lambda: (20000, 200, computed("default_capacity")["max_sustainable_rate_req_s"]), slow=True),
    # Tests
    Fig("Tests", r"saturation verdict at #% and #% of simulated capacity",
        lambda: tuple(100 * x for x in found(r"stages=f\"\{(\d\.\d+) \* mu.*?stages=f\"\{(\d\.\d+) \* mu",
                                             (ROOT / "tests" / "test_vllm_suite.py").read_text())), EXACT),
    # Reliability: the memory budget
    Fig(REL_SEC, r"about # B per request", lambda: budget("BYTES_PER_REQUEST"), EXACT),
    Fig(REL_SEC, r"does so instead, above # GB", lambda: budget("STREAM_ABOVE_BYTES") / 1e9, EXACT),
    Fig(REL_SEC, r"measured # B plus ~# MB per run",
        lambda: found(r"per request: (\d+) B, plus ~(\d+) MB once", code("servesim.engine.budget", "__doc__")), EXACT),
    Fig(REL_SEC, r"# B x `max_num_seqs` x \(1 \+ 2 PP\)",
        lambda: (budget("replica_bytes")(2, 1) - budget("replica_bytes")(1, 1)) / 3, EXACT),
    Fig(REL_SEC, r"this run needs about # GB of memory", lambda: budget("run_bytes")(2000, 100_000_000, 256) / 1e9, EXACT),
    Fig(REL_SEC, r"more than\s+the # GB available \(MemAvailable\); use --replicas # or fewer",
        lambda: (24.5, (24.5e9 - budget("run_bytes")(2000, 0, 256)) / budget("replica_bytes")(256)), tol=0.01),
    Fig(REL_SEC, r"capped at # points", lambda: budget("MAX_SWEEP_POINTS"), EXACT),
]


WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def serving_table_changes(p90_better: bool = False) -> tuple:
    """The README's summary of its serving table against the table's "before" column: how much the
    suite median and p90 moved, how many groups got worse and by how much at most (points)."""
    _, rows = readme_table(CAL, r"\| rows \| GPU \| metric")
    now = [(number(nums(r[4])[0]), number(nums(r[5])[0])) for r in rows]
    before = [tuple(number(x) for x in nums(r[6])) for r in rows]
    (med, p90), (med0, p900) = now[-1], before[-1]
    worse = [n[0] - b[0] for n, b in zip(now[:-1], before[:-1]) if n[0] > b[0]]
    return (round(med0 - med, 1), round((p900 - p90) if p90_better else (p90 - p900), 1), len(worse), len(now) - 1,
            round(max(worse), 1))


def _within(value: float, lo: float, hi: float) -> tuple:
    """(lo, hi) when lo <= value <= hi, else the value where it falls outside: a README range checked
    against one case."""
    return (lo if value >= lo else value, hi if value <= hi else value)


def _default(function: str, keyword: str):
    """The default of a keyword of a Python API function (the CLI's are the same, tested elsewhere)."""
    import inspect

    import servesim
    return inspect.signature(getattr(servesim, function)).parameters[keyword].default


@pytest.mark.parametrize("fig", [f for f in FIGURES if not f.slow], ids=lambda f: f.id)
def test_figure_matches_its_source(fig):
    _check(fig)


@pytest.mark.slow
@pytest.mark.parametrize("fig", [f for f in FIGURES if f.slow], ids=lambda f: f.id)
def test_computed_figure_matches_its_script(fig):
    _check(fig)


def _check(fig: Fig):
    m = fig.match()
    truth = _vals(fig.truth())
    got = [str(WORDS[g]) if g in WORDS else g for g in m.groups()]
    assert len(got) == len(truth), (fig.pattern, got, truth)
    tols = fig.tol if isinstance(fig.tol, tuple) else (fig.tol,) * len(got)
    bad = [(g, t) for g, t, tol in zip(got, truth, tols) if t is not BEFORE and not agrees(g, float(t), tol)]
    assert not bad, f"{fig.section}: README says {bad} (README, source); tolerance {tols} (0: exact)"


# -- (a): tables, cell by cell ------------------------------------------------------------------------

def readme_table(section: str, header: str) -> tuple[Block, list[list[str]]]:
    """The README table of a section whose header row matches `header`: its block and body rows."""
    a, b = sections()[section]
    for blk in blocks():
        if blk.table and a <= blk.start < b:
            lines = text()[blk.start:blk.end].strip().splitlines()
            if re.match(header, lines[0].strip()):
                rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]
                return blk, rows
    raise AssertionError(f"README section {section!r} has no table headed {header!r}")


def nums(cell: str) -> list[str]:
    return re.findall(r"(?<![\w.,])" + NUMBER, cell)


def engines_table(rows):
    for r in rows:
        name = re.search(r"`(\w+)`", r[0]).group(1)
        eng = toml(f"engines/{name}.toml")
        s, g, k = eng["scheduler"], eng["cuda_graph"], eng["kernels"]
        yield f"{name} max seqs", nums(r[2])[0], s["max_num_seqs"], EXACT
        yield f"{name} token budget", nums(r[3])[0], s["max_num_batched_tokens"], EXACT
        yield f"{name} block", nums(r[4])[0], s["block_size"], EXACT
        yield f"{name} KV memory", nums(r[5])[0], s["gpu_memory_utilization"], EXACT
        if g["mode"] != "none":
            top = re.search(r"up to (\d+)|(\d+)\.\.\d+ by \d+, up to (\d) x max seqs", r[6])
            if name == "vllm":
                yield f"{name} graph sizes", nums(r[6])[:3], tuple(g["sizes"]), EXACT
                yield f"{name} largest graph", re.search(r"\.\.(\d+) by 16", r[6]).group(1), g["max_size"], EXACT
                yield f"{name} graph per seq", re.search(r"up to (\d+) x max seqs", r[6]).group(1), g["max_size_per_seq"], EXACT
            else:
                yield f"{name} largest graph", top.group(1), g["max_size"], EXACT
        if k["allreduce"] == "custom":
            yield f"{name} custom all-reduce", re.search(r"up to (\d+) MiB", r[7]).group(1), k["custom_allreduce_max_mib"], EXACT


def frameworks_table(rows):
    for r in rows:
        name = re.search(r"`([\w-]+)`", r[0]).group(1)
        fw = toml(f"servesim/training/data/frameworks/{name}.toml")
        zero = nums(r[3])
        if zero:
            yield f"{name} ZeRO default", zero[0], _find_key(fw, "default_zero"), EXACT


def _find_key(d: dict, key: str):
    if key in d:
        return d[key]
    for v in d.values():
        if isinstance(v, dict):
            hit = _find_key(v, key)
            if hit is not None:
                return hit
    return None


TRAIN_ROWS = {   # README row -> (framework, gpu) of the per-group table of training_validation.md, or "all"
    "all": "all",
    "Megatron-LM / Megatron-Core, A100": ("megatron", "a100-sxm-80gb"),
    "Megatron-Core, H100": ("megatron", "h100-sxm"),
    "NeMo / DGX Cloud, H100": ("nemo", "h100-sxm"),
    "DeepSpeed ZeRO-3, A100": ("deepspeed", "a100-sxm-80gb"),
    "llm-foundry (Composer FSDP), A100 40GB": ("llm-foundry", "a100-sxm-40gb"),
    "llm-foundry (Composer FSDP), A100 80GB": ("llm-foundry", "a100-sxm-80gb"),
    "llm-foundry (Composer FSDP), H100": ("llm-foundry", "h100-sxm"),
}


def training_table(rows):
    """The README's accuracy table against training_validation.md: in sample, the two held-out
    splits and the model before, per framework x GPU and overall."""
    for r in rows:
        label = r[0].replace("**", "")
        key = TRAIN_ROWS[label]
        if key == "all":
            src = md_row(TRAINMD, rows="all, fitted on all")
            lofo = md_row(TRAINMD, rows="all, leave one framework out")["median"]
            logo = md_row(TRAINMD, rows="all, leave one GPU generation out")["median"]
            n, med, p90, before = src["n"], src["median"], src["p90"], src["before: rows, median, p90"]
        else:
            src = md_row(TRAINMD, **{"framework (source)": key[0], "GPU": key[1]})
            n, med, p90, before = src["rows"], src["median"], src["p90"], src["before: rows, median, p90"]
            lofo, logo = src["leave framework out: median"], src["leave generation out: median"]
        yield f"{label} n", nums(r[1])[0], int(n), EXACT
        yield f"{label} median", nums(r[2])[0], pct(med), REL
        yield f"{label} p90", nums(r[3])[0], pct(p90), REL
        yield f"{label} leave framework out", nums(r[4])[0], pct(lofo), REL
        yield f"{label} leave generation out", nums(r[5])[0], pct(logo), REL
        for i, (got, want) in enumerate(zip(nums(r[6]), nums(before))):   # the previous model, as the report keeps it
            yield f"{label} before[{i}]", got, float(want), EXACT


KERNEL_CLASSES = {   # README row -> (class, held-out split prefix) of engine_kernels_validation.md
    "GEMM bf16": ("GEMM bf16", "held out: 5-fold"),
    "GEMM fp8 per-tensor": ("GEMM fp8", "held out: 5-fold"),
    "prefill attention": ("prefill attention", "held out: 5-fold"),
    "decode attention": ("decode attention", "held out: 5-fold"),
    "engine all-reduce, CUDA graph": ("all-reduce (CUDA graph)", "held out: one GPU count"),
    "engine all-reduce, eager": ("all-reduce eager", "held out: one GPU count"),
}
KERNEL_COLUMNS = [("h100-sxm", "vllm"), ("h100-sxm", "sglang"), ("h100-sxm", "trtllm"),
                  ("a100-sxm-80gb", "vllm"), ("a100-sxm-80gb", "sglang"), ("a100-sxm-80gb", "trtllm")]


def kernels_table(rows):
    for r in rows:
        label = re.sub(r" \(.*", "", r[0])
        for (gpu, eng), cell in zip(KERNEL_COLUMNS, r[1:]):
            got = nums(cell)
            if not got:
                continue
            if label.startswith("fused MoE"):     # bf16 median / fp8 median
                for dt, g in zip(("bf16", "fp8"), [c.strip() for c in cell.split("/")]):
                    if nums(g):
                        src = md_row(KERN, gpu=gpu, engine=eng, **{"class": f"fused MoE {dt}"}, rows="held out: 5-fold")
                        yield f"{label} {gpu} {eng} {dt}", nums(g)[0], pct(src["median"]), REL
                continue
            cls, split = KERNEL_CLASSES[label]
            src = md_row(KERN, gpu=gpu, engine=eng, **{"class": cls}, rows=split)
            yield f"{label} {gpu} {eng} median", got[0], pct(src["median"]), REL
            yield f"{label} {gpu} {eng} p90", got[1], pct(src["p90"]), REL


VLLM_SPLITS = {   # README row -> (table of vllm_validation.md: 0 fitted, 1 lodo, 2 stage, 3 workload, 4 family; rows)
    "in sample": (0, "whole runs"), "leave one deployment out: whole": (1, "whole runs"),
    "leave one deployment out: load": (1, "load stages"), "stage extrapolation": (2, "load stages"),
    "leave one workload kind out": (3, "whole runs"), "leave one model family out": (4, "whole runs"),
}


def vllm_table(rows):
    tables = md_tables(VLLM)
    tol = code("servesim.calibrate.vllm_heldout", "TOLERANCE")["lodo"]
    for r in rows:
        key = next(k for k in VLLM_SPLITS if r[0].startswith(k))
        t, kind = VLLM_SPLITS[key]
        src = next(x for x in tables[t] if x["rows"] == kind)
        yield f"{key} n", nums(r[1])[0], float(src["n"]), EXACT
        for col, name in ((2, "E2E mean"), (3, "TTFT mean"), (4, "ITL mean"), (5, "signed E2E")):
            got = re.search(r"[+-]?" + NUMBER, r[col]).group(0).lstrip("+")     # signed: the sign is checked too
            yield f"{key} {name}", got, pct(src[name]), EXACT
        for got, m in zip(nums(r[6]), ("e2e_mean", "ttft_mean", "itl_mean")):
            yield f"{key} target {m}", got, 100 * tol[m], EXACT


OPERATOR_ROWS = {   # README row -> (operator class, split suffix of the held-out column)
    "GEMM QKV": ("gemm_qkv", None), "GEMM attention out": ("gemm_attn_out", None),
    "GEMM MLP up": ("gemm_mlp_up", None), "GEMM MLP down": ("gemm_mlp_down", None),
    "elementwise, per layer": ("elementwise", None), "all-reduce, all held-out rows": ("all_reduce", None),
    "DGX, group size not fitted": ("all_reduce", "held-out: DGX, 4 GPUs"),
    "pairwise-NVLink, 4 GPUs over PCIe": ("all_reduce", "held-out: pairwise, 4 GPUs"),
    "pairwise-NVLink, 2 GPUs over the bridge": ("all_reduce", "held-out: pairwise, 2 GPUs"),
    "send/recv, held out": ("send_recv", "held-out: DGX, 2-fold"),
}


def operators_table(rows):
    for r in rows:
        label = re.sub(r"&nbsp;|\s*\(.*", "", r[0]).strip()
        cls, sub = OPERATOR_ROWS[label]
        for gpu, cols in (("a100-sxm-80gb", (1, 2)), ("h100-sxm", (3, 4))):
            for col, split in zip(cols, ("fitted", sub or "held-out")):
                got = nums(r[col])
                if not got:
                    continue
                if split == "held-out":
                    src = [x for t in md_tables(COSTMD) for x in t if x.get("gpu") == gpu
                           and x.get("operator class") == cls and x.get("split") == "held-out"]
                    assert len(src) == 1
                    src = src[0]
                else:
                    src = md_row(COSTMD, gpu=gpu, **{"operator class": cls}, split=split)
                yield f"{label} {gpu} {split} median", got[0], pct(src["median rel. error"]), REL
                yield f"{label} {gpu} {split} p90", got[1], pct(src["p90 rel. error"]), REL


SERVING_ROWS = {   # README (rows, GPU, metric) -> (split, gpu, metric) of serving_validation.md
    ("fitted: static batch v0.9", "output tok/s/GPU"): ("fitted", "output_tokens_per_s_per_gpu"),
    ("fitted: static batch v0.9", "TTFT, batch 1"): ("fitted", "ttft_ms"),
    ("held out: max throughput v0.14/v0.17", "output tok/s"): ("held out (offline", "total_output_tokens_per_s"),
    ("held out: online, Poisson rate v0.14", "achieved req/s"): ("held out (request_rate)", "achieved_request_throughput"),
    ("held out: online, Poisson rate v0.14", "mean ITL"): ("held out (request_rate)", "itl_ms_mean"),
    ("held out: online, Poisson rate v0.14", "output tok/s"): ("held out (request_rate)", "total_output_tokens_per_s"),
    ("held out: online, Poisson rate v0.14", "mean TTFT"): ("held out (request_rate)", "ttft_ms_mean"),
}
GPUS = {"A100": "a100-sxm-80gb", "H100": "h100-sxm"}


def serving_table(rows):
    for r in rows:
        if r[0].startswith("all rows"):
            yield "all rows n", r[3], len(rows_csv("serving_validation_rows.csv")), EXACT
            yield "all rows median", nums(r[4])[0], abs_err_median("serving_validation_rows.csv"), REL
            yield "all rows p90", nums(r[5])[0], abs_err_p90("serving_validation_rows.csv"), REL
            continue   # the "before" column: the previous model's figures, recorded when it was replaced (EXEMPT)
        split, metric = SERVING_ROWS[(r[0], r[2])]
        src = md_row("serving_validation.md", split=split, GPU=GPUS[r[1]], metric=metric)
        yield f"{r[0]} {r[1]} {r[2]} n", r[3], int(src["n"]), EXACT
        yield f"{r[0]} {r[1]} {r[2]} median", nums(r[4])[0], pct(src["median rel. error"]), REL
        yield f"{r[0]} {r[1]} {r[2]} p90", nums(r[5])[0], pct(src["p90 rel. error"]), REL


@dataclass(frozen=True)
class Table:
    section: str
    header: str
    check: Callable                 # README body rows -> (label, README number(s), source value(s), tolerance)

    @property
    def id(self) -> str:
        return f"{self.section[:20]}: {self.header[:30]}"


TABLES = [
    Table("Engines", r"\| engine \| scheduler", engines_table),
    Table(TRAIN, r"\| framework \| attention", frameworks_table),
    Table(TRAIN, r"\| rows \| n \| median", training_table),
    Table(CAL, r"\| class \(held out by\)", kernels_table),
    Table(CAL, r"\| split: rows predicted", vllm_table),
    Table(CAL, r"\| operator class \|", operators_table),
    Table(CAL, r"\| rows \| GPU \| metric", serving_table),
]


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.id)
def test_table_matches_its_source(table):
    _, rows = readme_table(table.section, table.header)
    checked, bad = 0, []
    for label, got, truth, tol in table.check(rows):
        got, truth = (got, truth) if isinstance(got, list) else ([got], [truth])
        for g, t in zip(got, _vals(tuple(truth) if isinstance(truth, (list, tuple)) else truth)):
            checked += 1
            if not agrees(str(g), float(t), tol):
                bad.append((label, g, t))
    assert checked, "nothing checked"
    assert not bad, f"README table {table.header!r} disagrees with its source (label, README, source): {bad}"


# -- (c) dated labels and (d) exemptions; every figure accounted for ----------------------------------

def labels() -> list[tuple[Block, str, str]]:
    """(block, script, date) of every `(experiments/x.py, measured YYYY-MM-DD)` label."""
    return [(b, m.group(1), m.group(2)) for b in blocks() for m in LABEL.finditer(text()[b.start:b.end])]


def dated_blocks() -> list[Block]:
    """Blocks under a dated label: its own block, and a table right after a labelled paragraph."""
    bl = blocks()
    out = []
    for b, _, _ in labels():
        out.append(b)
        i = bl.index(b)
        if not b.table and i + 1 < len(bl) and bl[i + 1].table:
            out.append(bl[i + 1])
    return out


@dataclass(frozen=True)
class Exempt:
    section: str
    pattern: str        # regex of the README text holding the figures (a space matches any space)
    reason: str


EXEMPT = [
    Exempt(SIM, r"with 95%\s+confidence intervals", "the intervals' level, a definition"),
    Exempt(STREAM, r"95% intervals of a streamed run", "the intervals' level, a definition"),
    Exempt(SIM, r"At 30, 60 and 90% of capacity", "the loads tests/test_delivered_rates.py runs at, not a measurement"),
    Exempt(SIM, r"judging completions called 4 of 20 short runs at 27% load saturated",
           "the rule that was rejected, measured when the saturation verdict was designed"),
    Exempt(TRAIN, r"copies of GEMM inputs at 1 B", "fp8 is one byte: a definition"),
    Exempt(TRAIN, r"The issue's 82 runs on H200", "runs listed in the issue and not in the data: no script has them"),
    Exempt(CALIB, r"units off by 1000x", "a unit slip (ms for s), not a measurement"),
    Exempt(CALIB, r"moves every row of a file 1000x, so a file whose median row runs faster than\s+~32x",
           "a unit slip and its square root, the threshold's definition (calibrate.fit.UNIT_SLIP)"),
    Exempt(CALIB, r"\(10% of the shipped Vidur H100\s+elementwise rows, up to 1.26x",
           "printed by the README's own Vidur example (tests/test_calibrate_fits.py runs it)"),
    Exempt(CALIB, r"a key no row moves by 1% over a tenth", "the identifiability threshold (calibrate.serving.MIN_SENSITIVITY)"),
    Exempt(FP8, r"it was 118.9 ms\s+against 95.0 ms with the previous fit's fp8 at 0.333 of the fp8 peak",
           "issue #25's measurement of the previous release"),
]


def exempt_spans() -> list[tuple[int, int]]:
    out = []
    for e in EXEMPT:
        a, b = sections()[e.section]
        m = re.compile(e.pattern.replace(" ", r"\s+")).search(text(), a, b)
        assert m, f"EXEMPT: section {e.section!r} no longer says {e.pattern!r}"
        out.append((m.start(), m.end()))
    return out


def test_dated_labels_name_a_script_and_a_real_date():
    found_ = labels()
    assert found_, "no dated label in README.md"
    for _, script, date in found_:
        assert (ROOT / script).is_file(), f"label names {script}, which does not exist"
        assert datetime.date(2026, 1, 1) <= datetime.date.fromisoformat(date) <= datetime.date.today() + \
            datetime.timedelta(days=1), date


def test_every_figure_has_a_source():
    covered = [fig.match().span() for fig in FIGURES] + exempt_spans()
    covered += [(readme_table(t.section, t.header)[0].start, readme_table(t.section, t.header)[0].end) for t in TABLES]
    covered += [(b.start, b.end) for b in dated_blocks()]
    loose = [f.where for f in figures() if not any(a <= f.start and f.end <= b for a, b in covered)]
    assert not loose, ("figures in README.md with no source: add a check (FIGURES, TABLES), a dated label "
                       "`(experiments/SCRIPT.py, measured YYYY-MM-DD)`, or an EXEMPT entry with its reason:\n"
                       + "\n".join(loose))
