"""Issue #17, "options declared once": every simulation option is one SimConfig field (servesim.options)
from which the click options, the API keywords, the checks and the --grid keys are made; the SLO is
one type, parsed at the edge before any simulation."""
from __future__ import annotations

import time
from dataclasses import dataclass, fields

import click
import pytest
from click.testing import CliRunner

import servesim
import servesim.api
import servesim.options as O
from servesim.checks import check_sim_config, sim_config
from servesim.cli import main
from servesim.cli.options import simulate_options
from servesim.engine import codes as C
from servesim.errors import ConfigError
from servesim.planning import grid as G
from servesim.slo import Slo, parse_slo

SLO = "ttft_p99=1s,tpot_p99=60ms"


def _params(command) -> dict:
    return {p.name: p for p in command.params}


def test_simulate_flags_are_the_simconfig_fields():
    params = _params(main.commands["simulate"])
    names = [f.name for f in fields(O.SimConfig)]
    assert set(names) <= set(params)      # the others say what to print or write (--format, -o, ...)
    for name in names:
        p = params[name]
        assert p.opts == [O.flag(name)] and p.help, name
        default = O.defaults()[name]
        if O.options()[name].kind == "duration":     # seconds in the API, text on the command line
            assert p.default == (None if default is None else f"{default:g}s")
        else:
            assert p.default == default, name


def test_sweep_and_plan_take_the_same_options():
    sim = set(O.options()) - {"price"}     # sweep and plan take --price per hardware
    sweep = set(_params(main.commands["sweep"]))
    plan = set(_params(main.commands["plan"]))
    assert sim <= sweep
    assert sim - {"replicas"} <= plan      # plan searches the replica count (--max-replicas)


def test_choices_come_from_the_engine_codes_and_help_lists_them():
    help_text = CliRunner().invoke(main, ["simulate", "--help"], terminal_width=400).output
    for table in (C.POLICIES, C.ROUTERS, C.PREEMPTION):
        assert "[" + "|".join(table) + "]" in help_text
    assert "default: the engine profile's" in help_text


def test_every_declaration_is_consistent():
    for f in fields(O.SimConfig):
        o = f.metadata["option"]
        assert o.kind in O.KINDS and o.help, f.name
        if o.kind == "choice":
            assert f.default is None or f.default in o.choice_list(), f.name
        if o.kind in ("int", "float"):
            assert o.kind in str(f.type), (f.name, f.type)
        if o.names is not None:
            assert f.default in o.names(), f.name
        if o.preset:                     # None filled from the engine profile: the attribute exists
            from servesim.config.engine import load_engine
            assert hasattr(load_engine("vllm").scheduler, o.preset), f.name
    assert set(O.grid_keys()) == {f.name for f in fields(O.SimConfig)} - {"rate", "stages", "offline", "slo",
                                                                              "speculative", "fast_forward", "stream", "threads"}


# ------------------------------------------------------------------------------------------------
# a trial option, declared in one place


@dataclass(frozen=True)
class _Trial(O.SimConfig):
    trial_knob: float | None = O.opt(None, "float", ge=0.0, preset="watermark", help="A trial knob.")


@pytest.fixture
def trial(monkeypatch):
    monkeypatch.setattr(O, "SimConfig", _Trial)
    return _Trial


def test_a_trial_option_is_a_flag_a_keyword_checked_and_a_grid_key(trial):
    seen = []

    @click.command()
    @simulate_options
    def cmd(**kw):
        from servesim.cli.options import sim_config as from_cli
        seen.append(from_cli(kw))

    assert "--trial-knob" in CliRunner().invoke(cmd, ["--help"]).output
    r = CliRunner().invoke(cmd, ["--trial-knob", "0.25"], catch_exceptions=False)
    assert r.exit_code == 0 and seen[-1].trial_knob == 0.25
    r = CliRunner().invoke(cmd, ["--trial-knob", "-1"])
    assert isinstance(r.exception, ConfigError) and "--trial-knob -1" in str(r.exception)
    # the API keyword, checked, with the closest name for a typo
    assert sim_config(None, trial_knob=3).trial_knob == 3
    with pytest.raises(ConfigError, match="--trial-knob nan"):
        sim_config(None, trial_knob=float("nan"))
    with pytest.raises(ConfigError, match="did you mean 'trial_knob'"):
        sim_config(None, trial_knbo=1.0)
    # a sweep grid key, its values checked by the same rule
    g = G.parse_grid(["trial-knob=0.1,0.2"])
    assert g == [("trial_knob", [0.1, 0.2])]
    assert [p.trial_knob for p in G.expand(trial(), g, None)] == [0.1, 0.2]
    with pytest.raises(ConfigError, match="--trial-knob -2"):
        G.parse_grid(["trial-knob=1,-2"])


def test_a_trial_option_is_filled_from_the_engine_profile_and_reported(trial):
    from servesim.config.engine import load_engine
    res = servesim.api.simulate(num_requests=20, rate=2.0)
    assert res.config["trial_knob"] == load_engine("vllm").scheduler.watermark
    assert servesim.api.simulate(num_requests=20, rate=2.0, trial_knob=0.5).config["trial_knob"] == 0.5


# ------------------------------------------------------------------------------------------------
# the SLO: one type, parsed at the edge


def test_slo_parsed_once_into_seconds_in_order():
    s = parse_slo(" tpot_p99=50ms, ttft_p90 = 1.5s ,e2e_mean=2min")
    assert s.items() == (("tpot_p99", 0.05), ("ttft_p90", 1.5), ("e2e_mean", 120.0))
    assert parse_slo(s) is s and parse_slo(None) is None
    assert s == parse_slo("tpot_p99=0.05s,ttft_p90=1500ms,e2e_mean=120s")      # same targets, other text
    assert str(s) == "tpot_p99=50ms, ttft_p90 = 1.5s ,e2e_mean=2min".strip()
    assert bool(s) and not Slo()
    assert check_sim_config(O.SimConfig(slo=SLO)).slo == parse_slo(SLO)


@pytest.mark.parametrize("text, words", [
    ("ttft_p999=1s", "unknown target 'ttft_p999'"),
    ("ttft_p99", "not KEY=DURATION"),
    ("ttft_p99=1sx", "cannot read a duration"),
    ("ttft_p99=0ms", "> 0"),
    ("ttft_p99=1s,ttft_p99=2s", "given twice"),
    ("  ", "empty"),
    (0.5, "must be a string"),
])
def test_slo_errors_are_one_line(text, words):
    with pytest.raises(ConfigError) as e:
        parse_slo(text, "--slo")
    assert words in str(e.value) and str(e.value).startswith("--slo") and "\n" not in str(e.value)


def _no_simulation(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a simulation ran before the SLO was checked")
    monkeypatch.setattr(servesim.api, "simulate", refuse)
    monkeypatch.setattr(servesim.api, "resolve", refuse)


@pytest.mark.parametrize("args", [
    ["simulate"], ["sweep", "--rates", "1,2"], ["sweep", "--find-max-rate"], ["plan"], ["report", "-o", "{tmp}"],
    ["compare"],
])
def test_an_slo_typo_fails_before_any_simulation(args, monkeypatch, tmp_path):
    _no_simulation(monkeypatch)
    args = [a.replace("{tmp}", str(tmp_path / "out")) for a in args]
    t0 = time.perf_counter()
    r = CliRunner().invoke(main, args + ["--slo", "ttft_p99=1s,tpot_p9=60ms"])
    assert time.perf_counter() - t0 < 1.0
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    line = r.output.strip()
    assert line.startswith("servesim: error: --slo: unknown target 'tpot_p9'") and "\n" not in line
    assert not (tmp_path / "out").exists()


def test_an_slo_typo_fails_before_any_simulation_in_the_api(monkeypatch):
    from servesim.planning.plan import PlanSpec, run_plan as plan
    monkeypatch.setattr(servesim.api, "run", lambda *a, **k: pytest.fail("the engine ran"))
    with pytest.raises(ConfigError, match="unknown target 'tpot_p9'"):
        servesim.api.simulate(slo="tpot_p9=1s")
    _no_simulation(monkeypatch)
    with pytest.raises(ConfigError, match="unknown target 'tpot_p9'"):
        plan(PlanSpec(base=O.SimConfig(slo="tpot_p9=1s")))


# ------------------------------------------------------------------------------------------------
# the offered rate: one default, one meaning


def test_default_rate_is_the_workloads_for_the_whole_deployment():
    from servesim.workload import load_workload
    want = load_workload("chat").default_rate
    for replicas in (1, 2):
        assert servesim.api.simulate(num_requests=20, replicas=replicas).config["rate"] == want
