"""Wall-clock timings the README cites, each of a command or call as the README describes it.

These depend on the machine and on what else runs on it, so the README prints them with this
script's name and the date measured, `(experiments/bench_readme.py, measured YYYY-MM-DD)`, and a
test (`tests/test_readme_figures.py`) checks that the label is there, not the seconds. The
simulation speed of the standard case is `experiments/bench_speed.py`'s.

    python experiments/bench_readme.py                 # everything but the test suite (~3-5 min on 2 cores)
    python experiments/bench_readme.py plan report     # some of them
    python experiments/bench_readme.py suite           # `python -m pytest -q`: its wall time and test count

Each line printed is `name: seconds (what ran)`; the machine's load average is printed first and
last, since a busy machine stretches every figure.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _cli() -> list[str]:
    exe = shutil.which("servesim")
    return [exe] if exe else [sys.executable, "-m", "servesim.cli"]


def _timed(cmd: list[str], cwd=None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd or ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _best(f, repeats: int = 3) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return min(out)


def api_tour() -> dict:
    """README Commands: experiments/api_tour.py start to end (a fresh interpreter, warm numba cache)."""
    return {"api_tour_s": _timed([sys.executable, "experiments/api_tour.py"])}


def daily_day() -> dict:
    """README simulate options: a whole day of chat on one h100-sxm through the CLI."""
    return {"daily_24h_s": _timed(_cli() + ["simulate", "--arrival", "daily", "--rate", "4", "--duration", "24h"])}


def overload() -> dict:
    """README Speed: 20,000 requests at 200 req/s against one H100, through the CLI."""
    return {"overload_s": _timed(_cli() + ["simulate", "--rate", "200", "--num-requests", "20000"])}


def interval_cost() -> dict:
    """README Confidence intervals: what the ci95 computation adds to the summary of 2,000 and 100,000
    requests (best of 3 summaries with and without it, same engine output)."""
    import servesim
    import servesim.api as api
    from servesim import intervals as CI
    out = {}
    real = api.summarize
    for n in (2000, 100_000):
        captured = {}

        def spy(*a, **k):
            captured["args"], captured["kwargs"] = a, k
            return real(*a, **k)
        api.summarize = spy
        try:
            servesim.simulate(num_requests=n)
        finally:
            api.summarize = real
        a, k = captured["args"], captured["kwargs"]
        with_ci = _best(lambda: real(*a, **k))
        saved = {f: getattr(CI, f) for f in ("mean_ci", "quantile_ci", "ratio_ci", "batch_size")}
        try:
            CI.mean_ci = CI.quantile_ci = CI.ratio_ci = lambda *x, **y: (None, None)
            CI.batch_size = lambda x: 1
            without = _best(lambda: real(*a, **k))
        finally:
            for f, v in saved.items():
                setattr(CI, f, v)
        out[f"ci95_cost_{n}_requests_s"] = with_ci - without
    return out


def plan() -> dict:
    """README Capacity planning: the exhaustive and the pruned plan of readme_figures.PLAN_ARGS on the
    local pool (all cores)."""
    import servesim
    from readme_figures import PLAN_ARGS
    t0 = time.perf_counter()
    full = servesim.plan(exhaustive=True, **PLAN_ARGS)
    t_full = time.perf_counter() - t0
    t0 = time.perf_counter()
    pruned = servesim.plan(**PLAN_ARGS)
    t_pruned = time.perf_counter() - t0
    same = {k: full.best[k] for k in ("hardware", "tp", "replicas")} == \
        {k: pruned.best[k] for k in ("hardware", "tp", "replicas")}
    return {"plan_exhaustive_s": t_full, "plan_exhaustive_simulations": full.summary["simulations"],
            "plan_pruned_s": t_pruned, "plan_pruned_simulations": pruned.summary["simulations"],
            "search_space": pruned.summary["search_space"], "same_answer": same}


def report() -> dict:
    """README Reports and studies: its two `servesim report` examples."""
    with tempfile.TemporaryDirectory() as tmp:
        return {"report_default_s": _timed(_cli() + ["report", "-o", "r/"], cwd=tmp),
                "report_70b_s": _timed(_cli() + ["report", "--model", "llama-3.1-70b", "--hardware",
                                                 "h100-sxm,h200-sxm", "-o", "r70b/"], cwd=tmp)}


def design_study() -> dict:
    """README Reports and studies: experiments/design_tp_vs_replicas.py (it rewrites its results files;
    run on a clean checkout, or restore them after)."""
    return {"design_study_s": _timed([sys.executable, "experiments/design_tp_vs_replicas.py"])}


def suite() -> dict:
    """README Tests: `python -m pytest -q` (the default suite, slow tests left out): wall time and count."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|error)", tail)}
    return {"suite_s": wall, "suite_summary": tail, **counts}


TIMINGS = {f.__name__: f for f in (api_tour, daily_day, overload, interval_cost, plan, report, design_study, suite)}
DEFAULT = [n for n in TIMINGS if n not in ("suite", "design_study")]


def main(names):
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name in names or DEFAULT:
        out = TIMINGS[name]()
        print(f"{name}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()),
              flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
