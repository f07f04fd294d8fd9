"""Named workloads (workloads/*.toml) and turning a workload into request arrays.

A workload is a prompt-length distribution, an output-length distribution, an optional trace (for
replay), an optional shared prefix (system prompts shared by groups of users) or multi-turn sessions
(chat conversations whose turns resend their history), and a default request rate. `load_workload` reads one; `build_requests` draws `n` requests from it as a `Requests` bundle of
NumPy arrays, the form the engine takes.

Randomness: `build_requests` derives independent child streams from `numpy.random.SeedSequence(seed)`
(the seeding `numpy.random.default_rng(seed)` uses) for arrivals, prompts, outputs, joint
(prompt, output) draws, the user of each request and the think times of session turns, so changing the rate, the arrival process or
the stages never changes the lengths, and overriding one length never changes the other.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from servesim.errors import ConfigError
from servesim.paths import traces_dir, workloads_dir
from servesim.workload.arrivals import DIURNAL_CURVE, _rate, arrival_times, parse_stages, stage_arrivals
from servesim.workload.lengths import KINDS, LengthSpec, clip_lengths, sample_lengths
from servesim.workload.traces import Trace, read_trace

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

TRACE_MODES = ("lengths", "replay", "scale")
DEFAULT_NUM_REQUESTS = 2000  # synthetic workloads, when no number is given


QUESTION_PER = ("user", "request")


@dataclass(frozen=True)
class SharedPrefix:
    """`num_system_prompts` system prompts of `system_prompt_len` tokens, each shared by
    `users_per_system_prompt` users (N x M users in all). A request's prompt is its user's system
    prompt followed by a question (the workload's prompt lengths, or a fixed `--question-len`).

    `question_per` "user": each user has one question, drawn once, and sends the same prompt every
    time, so from its second request on the whole prompt is a prefix-cache hit (the benchmark behind
    the shipped vLLM deployments did this: experiments/results/vllm_validation.md); "request": a
    fresh question per request, only the system prompt is shared."""
    num_system_prompts: int
    users_per_system_prompt: int
    system_prompt_len: int
    question_per: str = "user"


@dataclass(frozen=True)
class Sessions:
    """Multi-turn chat sessions of `turns_per_session` turns. Turn 0's prompt is a question (the
    workload's prompt lengths); turn n's prompt is turn n-1's prompt + its output + a new question.
    Turn n is sent `think` seconds after turn n-1 ends, exponential with mean `think_time_s`."""
    turns_per_session: int
    think_time_s: float


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    description: str
    source: str
    prompt: LengthSpec
    output: LengthSpec
    trace: Trace | None      # kept for replay/scale, and for joint (prompt, output) sampling
    default_rate: float      # requests/s when no rate is given
    shared_prefix: SharedPrefix | None = None  # with it, `prompt` is the question after the system prompt
    sessions: Sessions | None = None  # with it, `prompt` is each turn's new question


class Requests(NamedTuple):
    arrival: np.ndarray       # float64 seconds, non-decreasing (inf: a session's follow-up turn, sent
                              # `think` s after its previous turn ends; follow-ups come after all first turns)
    prompt: np.ndarray        # int64 prompt tokens (shared prefix included)
    output: np.ndarray        # int64 output tokens
    prefix_group: np.ndarray  # int64 shared-prefix group (system prompt) of the request, -1: none
    prefix_len: np.ndarray    # int64 tokens of the prompt shared with its group, 0: none (< prompt)
    session: np.ndarray       # int64 session of the request (= index of its first turn), -1: none
    turn: np.ndarray          # int64 turn of the request in its session (0: first, or no session)
    next_turn: np.ndarray     # int64 index of the session's next request, -1: none
    think: np.ndarray         # float64 s from the end of the previous turn to sending this one (0: first)
    prefix_user: np.ndarray | None = None  # int64 user whose one prompt the request re-sends (its whole
                                           # prompt is shared with that user's other requests), -1 / None: none


# --------------------------------------------------------------------------- loading

_TOP_KEYS = {"name": True, "description": True, "source": True, "default_rate": True,
             "prompt": True, "output": True, "shared_prefix": False,
             "sessions": False}  # key -> required
_SHARED_KEYS = {"num_system_prompts": True, "users_per_system_prompt": False, "system_prompt_len": True,
                "question_per": False}
_SESSION_KEYS = {"turns_per_session": True, "think_time_s": True}  # both required in [sessions]
_SESSION_OPTIONS = {"turns_per_session": "--turns-per-session", "think_time_s": "--think-time"}
_SHARED_OPTIONS = {"num_system_prompts": "--num-system-prompts", "users_per_system_prompt": "--users-per-system-prompt",
                   "system_prompt_len": "--system-prompt-len", "question_per": "--question-per"}
_KIND_KEYS = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "lognormal": ("median", "sigma"),
    "empirical": (),  # plus exactly one of trace / samples
}
_COMMON_KEYS = ("kind", "min_len", "max_len")


def list_workloads() -> list[str]:
    """Names of the shipped workloads (the stems of workloads/*.toml), sorted."""
    return sorted(p.stem for p in workloads_dir().glob("*.toml"))


def load_workload(name_or_path) -> WorkloadSpec:
    """A shipped workload name, a path to a workload .toml, or a path to a trace .csv.

    A trace .csv gives empirical prompt and output lengths (sampled jointly, as rows) and is kept for
    replay; its default rate is the trace's mean arrival rate, or 1 request/s without timestamps.
    """
    s = str(name_or_path)
    p = Path(s)
    if p.suffix.lower() == ".csv":
        return _from_trace(p)
    if p.suffix.lower() == ".toml":
        if not p.is_file():
            raise ConfigError(f"{p}: workload file not found; pass an existing .toml or a shipped name "
                              f"({', '.join(list_workloads())})")
        return _from_toml(p)
    names = list_workloads()
    if s in names:
        return _from_toml(workloads_dir() / f"{s}.toml")
    raise ConfigError(f"unknown workload {s!r}; available: {', '.join(names)}; "
                      "or pass a .toml or trace .csv path")


def _from_trace(p: Path) -> WorkloadSpec:
    tr = read_trace(p)
    rate = tr.mean_rate or 1.0
    what = f"{len(tr)} requests" + ("" if tr.arrival_s is None else f" over {tr.arrival_s[-1]:.1f} s")
    return WorkloadSpec(
        name=p.stem,
        description=f"trace {p.name} ({tr.format} format, {what})",
        source=str(p),
        prompt=LengthSpec("empirical", samples=tuple(tr.prompt.tolist())),
        output=LengthSpec("empirical", samples=tuple(tr.output.tolist())),
        trace=tr,
        default_rate=rate,
    )


def _from_toml(p: Path) -> WorkloadSpec:
    try:
        text = p.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML ({e})") from None

    def where(section: str | None, key: str) -> str:
        n = _line_of(text, section, key)
        return f"{p}:{n}" if n else str(p)

    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"{where(None, key)}: unknown key {key!r}; allowed: {', '.join(_TOP_KEYS)}")
    for key, required in _TOP_KEYS.items():
        if required and key not in data:
            raise ConfigError(f"{p}: missing key {key!r}; a workload needs {', '.join(_TOP_KEYS)}")
    for key in ("name", "description", "source"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise ConfigError(f"{where(None, key)}: {key} = {data[key]!r}; use a non-empty string")
    if data["name"] != p.stem:
        raise ConfigError(f"{where(None, 'name')}: name = {data['name']!r} differs from the file name; "
                          f"use name = {p.stem!r}")
    rate = data["default_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (rate > 0) or math.isinf(rate):
        raise ConfigError(f"{where(None, 'default_rate')}: default_rate = {rate!r}; "
                          "use a finite rate > 0 requests/s")

    traces: dict[Path, Trace] = {}
    specs, used = {}, {}
    for section in ("prompt", "output"):
        table = data[section]
        if not isinstance(table, dict):
            raise ConfigError(f"{where(None, section)}: {section} must be a table ([{section}])")
        specs[section], used[section] = _length_spec(p, section, table, traces, where)
    same = used["prompt"] is not None and used["prompt"] == used["output"]
    shared = _shared_prefix_table(data["shared_prefix"], where) if "shared_prefix" in data else None
    sessions = _sessions_table(data["sessions"], where) if "sessions" in data else None
    if shared is not None and sessions is not None:
        raise ConfigError(f"{where(None, 'sessions')}: [sessions] and [shared_prefix] together are not "
                          "supported; keep one of the two tables")
    return WorkloadSpec(name=data["name"], description=data["description"], source=data["source"],
                        prompt=specs["prompt"], output=specs["output"],
                        trace=traces[used["prompt"]] if same else None, default_rate=float(rate),
                        shared_prefix=shared, sessions=sessions)


def _table_keys(table, name: str, keys: dict, where) -> None:
    """A workload file's [name] is a table with only the `keys` (name -> required) and the required ones."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where(None, name)}: {name} must be a table ([{name}])")
    for key in table:
        if key not in keys:
            raise ConfigError(f"{where(name, key)}: [{name}] unknown key {key!r}; allowed: {', '.join(keys)}")
    for key, required in keys.items():
        if required and key not in table:
            raise ConfigError(f"{where(name, name)}: [{name}] missing key {key!r}; "
                              f"it needs {', '.join(k for k, r in keys.items() if r)}")


def _sessions_table(table, where) -> Sessions:
    _table_keys(table, "sessions", _SESSION_KEYS, where)
    turns, think = table["turns_per_session"], table["think_time_s"]
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise ConfigError(f"{where('sessions', 'turns_per_session')}: [sessions] turns_per_session = {turns!r}; "
                          "use an integer >= 1")
    if isinstance(think, bool) or not isinstance(think, (int, float)) or not (0 <= think < math.inf):
        raise ConfigError(f"{where('sessions', 'think_time_s')}: [sessions] think_time_s = {think!r}; "
                          "use a finite number of seconds >= 0")
    return Sessions(int(turns), float(think))


def with_sessions(spec: WorkloadSpec, turns_per_session=None, think_time_s=None) -> WorkloadSpec:
    """`spec` with its sessions set or overridden (None: keep the workload's). Without a `[sessions]`
    in the workload, `turns_per_session` is needed (`think_time_s` defaults to 0 s); the workload's
    prompt lengths become the question lengths of each turn."""
    if turns_per_session is None and think_time_s is None:
        return spec
    if turns_per_session is not None and (isinstance(turns_per_session, bool) or
                                          not isinstance(turns_per_session, (int, np.integer)) or
                                          turns_per_session < 1):
        raise ConfigError(f"--turns-per-session {turns_per_session!r} is not valid; use an integer >= 1")
    if think_time_s is not None:
        try:
            t = float(think_time_s)
        except (TypeError, ValueError):
            t = float("nan")
        if isinstance(think_time_s, bool) or not (0 <= t < math.inf):
            raise ConfigError(f"--think-time {think_time_s!r} is not valid; use a finite number of seconds >= 0")
    if spec.shared_prefix is not None:
        raise ConfigError(f"--turns-per-session/--think-time: workload {spec.name!r} has a shared prefix, and "
                          "sessions with a shared prefix are not supported; use a workload without one")
    base = spec.sessions
    if base is None:
        if turns_per_session is None:
            raise ConfigError(f"--think-time {think_time_s!r}: sessions also need --turns-per-session (workload "
                              f"{spec.name!r} has no [sessions]); e.g. --turns-per-session 3 --think-time 30")
        base = Sessions(1, 0.0)
    merged = Sessions(int(turns_per_session if turns_per_session is not None else base.turns_per_session),
                      float(think_time_s if think_time_s is not None else base.think_time_s))
    return replace(spec, sessions=merged)


def _shared_prefix_table(table, where) -> SharedPrefix:
    _table_keys(table, "shared_prefix", _SHARED_KEYS, where)
    values = {}
    for key in _SHARED_KEYS:
        if key == "question_per":
            v = table.get(key, "user")
            if v not in QUESTION_PER:
                raise ConfigError(f"{where('shared_prefix', key)}: [shared_prefix] question_per = {v!r}; "
                                  f"use one of {', '.join(repr(q) for q in QUESTION_PER)}")
            values[key] = v
            continue
        v = table.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where('shared_prefix', key)}: [shared_prefix] {key} = {v!r}; use an integer >= 1")
        values[key] = v
    return SharedPrefix(**values)


def with_shared_prefix(spec: WorkloadSpec, num_system_prompts=None, users_per_system_prompt=None,
                       system_prompt_len=None, question_per=None) -> WorkloadSpec:
    """`spec` with its shared prefix set or overridden by the CLI options (None: keep the workload's).

    Without a `[shared_prefix]` in the workload, `--num-system-prompts` and `--system-prompt-len` are
    both needed (`--users-per-system-prompt` defaults to 1, `--question-per` to user); the workload's
    prompt lengths become the question lengths."""
    if question_per is not None and question_per not in QUESTION_PER:
        raise ConfigError(f"--question-per {question_per!r} is not valid; use one of {', '.join(QUESTION_PER)}")
    given = {"num_system_prompts": num_system_prompts, "users_per_system_prompt": users_per_system_prompt,
             "system_prompt_len": system_prompt_len}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        if question_per is None:
            return spec
        if spec.shared_prefix is None:
            raise ConfigError(f"--question-per {question_per}: needs a shared prefix (--num-system-prompts N "
                              "--system-prompt-len L, or a workload with [shared_prefix])")
        return replace(spec, shared_prefix=replace(spec.shared_prefix, question_per=question_per))
    if spec.sessions is not None:
        named = ", ".join(f"{_SHARED_OPTIONS[k]} {v}" for k, v in given.items())
        raise ConfigError(f"{named}: workload {spec.name!r} has [sessions], and sessions with a shared prefix "
                          "are not supported; use a workload without sessions")
    for key, v in given.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            unit = " tokens" if key == "system_prompt_len" else ""
            raise ConfigError(f"{_SHARED_OPTIONS[key]} {v!r} is not valid; use an integer >= 1{unit}")
    base = spec.shared_prefix
    if base is None:
        missing = [_SHARED_OPTIONS[k] for k in ("num_system_prompts", "system_prompt_len") if k not in given]
        if missing:
            named = ", ".join(f"{_SHARED_OPTIONS[k]} {v}" for k, v in given.items())
            raise ConfigError(f"{named}: a shared prefix also needs {' and '.join(missing)} (workload "
                              f"{spec.name!r} has no [shared_prefix]); e.g. --num-system-prompts 9 "
                              "--users-per-system-prompt 5 --system-prompt-len 100")
        base = SharedPrefix(0, 1, 0)
    merged = SharedPrefix(**{k: int(given.get(k, getattr(base, k))) for k in _SHARED_KEYS if k != "question_per"},
                          question_per=question_per if question_per is not None else base.question_per)
    return replace(spec, shared_prefix=merged)


def _length_spec(p: Path, section: str, table: dict, traces: dict, where) -> tuple[LengthSpec, Path | None]:
    kind = table.get("kind")
    if kind is None:
        raise ConfigError(f"{where(section, section)}: [{section}] missing key 'kind'; "
                          f"use one of {', '.join(KINDS)}")
    if kind not in _KIND_KEYS:
        raise ConfigError(f"{where(section, 'kind')}: [{section}] kind = {kind!r} unknown; "
                          f"use one of {', '.join(KINDS)}")
    extra = ("trace", "samples") if kind == "empirical" else ()
    allowed = _COMMON_KEYS + _KIND_KEYS[kind] + extra
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where(section, key)}: [{section}] unknown key {key!r} for kind {kind!r}; "
                              f"allowed: {', '.join(allowed)}")
    for key in _KIND_KEYS[kind]:
        if key not in table:
            raise ConfigError(f"{where(section, section)}: [{section}] missing key {key!r} for kind {kind!r}; "
                              f"it needs {', '.join(_KIND_KEYS[kind])}")
    kwargs = {k: v for k, v in table.items() if k not in ("trace", "samples")}
    trace_path = None
    if kind == "empirical":
        if ("trace" in table) == ("samples" in table):
            raise ConfigError(f"{where(section, section)}: [{section}] empirical needs exactly one of "
                              "'trace' (a CSV under workloads/traces/) or 'samples' (a list of lengths)")
        if "trace" in table:
            trace_path = _resolve_trace(p, table["trace"], where(section, "trace"))
            if trace_path not in traces:
                traces[trace_path] = read_trace(trace_path)
            tr = traces[trace_path]
            kwargs["samples"] = tuple((tr.prompt if section == "prompt" else tr.output).tolist())
        else:
            if not isinstance(table["samples"], list):
                raise ConfigError(f"{where(section, 'samples')}: [{section}] samples must be a list of lengths")
            kwargs["samples"] = tuple(table["samples"])
    try:
        return LengthSpec(**kwargs), trace_path
    except ConfigError as e:
        raise ConfigError(f"{where(section, section)}: [{section}] {e}") from None
    except TypeError as e:
        raise ConfigError(f"{where(section, section)}: [{section}] {e}") from None


def _resolve_trace(p: Path, name, at: str) -> Path:
    """The trace a workload file names: a relative path to a .csv inside the workload's folder or
    workloads/traces/ (no absolute path, no '..', no link leading out), so that a workload file can
    only make servesim read traces, never another file."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{at}: trace = {name!r}; use a CSV file name under workloads/traces/")
    rel = Path(name)
    if rel.is_absolute() or rel.drive or ".." in rel.parts or rel.suffix.lower() != ".csv":
        raise ConfigError(f"{at}: trace = {name!r} is not a .csv file inside the workload's folder or "
                          "workloads/traces/; use a relative path without '..', e.g. trace = \"splitwise_conv.csv\"")
    for base in (p.parent, traces_dir()):
        root = base.resolve()
        cand = (root / rel).resolve()
        if cand.is_file() and cand.is_relative_to(root):
            return cand
    shipped = sorted(q.name for q in traces_dir().glob("*.csv"))
    raise ConfigError(f"{at}: trace {name!r} not found next to {p.name} or in workloads/traces/; "
                      f"shipped traces: {', '.join(shipped)}")


def _line_of(text: str, section: str | None, key: str) -> int | None:
    """1-based line of `key = ...` inside `[section]` (None: top level), or of the `[key]` header."""
    current = None
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        m = re.match(r"^\[\s*([^\]]+?)\s*\]", line)
        if m:
            current = m.group(1)
            if section is None and current == key or section == key == current:
                return i
            continue
        if current == section and re.match(rf'^"?{re.escape(key)}"?\s*=', line):
            return i
    return None


# --------------------------------------------------------------------------- building

def build_requests(spec: WorkloadSpec, n: int | None, seed: int, *, rate=None, process="poisson", cv=1.0,
                   offline=False, isl=None, osl=None, trace_mode="lengths", daily_curve=None,
                   max_len=None, stages=None, question_len=None, window=None) -> Requests:
    """Draw `n` requests from `spec`.

    n           number of requests; None: every row of the trace for `replay`/`scale`, the arrivals
                inside the windows with `stages`, otherwise DEFAULT_NUM_REQUESTS (2000)
    rate        requests/s (default `spec.default_rate`); used by `lengths` and `scale`
    process     arrival process, see `arrival_times` (poisson, gamma, deterministic, bursty, daily)
    offline     every request arrives at t = 0
    stages      open-loop load in stages, '5x600s,10x600s' or ((rate, duration_s), ...): `process`
                at each stage's rate inside its window (see `stage_arrivals`); excludes n and offline
    isl, osl    fixed prompt / output lengths overriding the workload's (with a shared prefix, isl is
                the whole prompt: system prompt + question)
    question_len  fixed question length after the shared system prompt (needs `spec.shared_prefix`)
    window      seconds: instead of n requests, the `process` arrivals inside [0, window) (a daily
                run of `--duration 24h` sends a whole day); excludes n, stages, offline, replay/scale
    trace_mode  lengths: sample lengths from the workload (from a trace, prompt and output are drawn
                         together as rows, keeping their correlation); arrivals from `process`
                replay:  the trace's first n rows as they are, with the trace's arrival times
                scale:   the trace's first n rows, inter-arrival times scaled so the mean rate
                         (n - 1) / span equals `rate`
    max_len     model context: where prompt + output > max_len the prompt is cut first (down to 1
                token), then the output

    With `spec.shared_prefix` (N system prompts of L tokens, M users each) every request is sent by
    one of the N x M users, drawn uniformly at random from its own stream; its prompt is L tokens of
    its group's system prompt plus the question, `prefix_group` = user // M and `prefix_len` = L.
    With `question_per` "user" each user's question length is drawn once (from the workload's prompt
    lengths, its own stream; or `question_len`, or `isl` - L) and `prefix_user` = user: the user
    re-sends one prompt; with "request" every request draws its own question and `prefix_user` is None.

    With `spec.sessions` (T turns per session, mean think time): see `_session_requests`. `n` counts
    requests (turns); `rate` stays requests/s, so sessions start at rate / (mean turns per session);
    `question_len` fixes every turn's question, `osl` every output; stages, window, replay/scale and
    `isl` are refused. Without sessions `session` is -1, `turn` 0, `next_turn` -1 and `think` 0.
    """
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
        raise ConfigError(f"--num-requests {n!r} is not valid; use an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"--seed {seed!r} is not valid; use an integer >= 0")
    if trace_mode not in TRACE_MODES:
        raise ConfigError(f"--trace-mode {trace_mode!r} unknown; use one of {', '.join(TRACE_MODES)}")
    rate = spec.default_rate if rate is None else rate
    arr_ss, prompt_ss, output_ss, joint_ss, user_ss, think_ss, question_ss = \
        np.random.SeedSequence(int(seed)).spawn(7)
    arr_rng, prompt_rng, output_rng, joint_rng = (np.random.default_rng(s)
                                                  for s in (arr_ss, prompt_ss, output_ss, joint_ss))
    curve = DIURNAL_CURVE if daily_curve is None else daily_curve
    if spec.sessions is not None:
        return _session_requests(spec, n, rate, process, cv, offline, isl, osl, trace_mode, curve, max_len,
                                 stages, question_len, window,
                                 (arr_rng, prompt_rng, output_rng, joint_rng, np.random.default_rng(think_ss)))

    if stages is not None:
        stages = parse_stages(stages)
        for bad, given in (("--num-requests", n is not None), ("--offline", offline),
                           (f"--trace-mode {trace_mode}", trace_mode != "lengths")):
            if given:
                raise ConfigError(f"--stages and {bad} contradict: the stages define the arrivals and the "
                                  f"number of requests; drop {bad.split()[0]}")
        arrival = stage_arrivals(stages, arr_ss, process=process, cv=cv, daily_curve=curve)
        n = int(arrival.size)
        if n == 0:
            raise ConfigError(f"--stages {_show_stages(stages)}: no request arrives in any stage; "
                              "use higher rates or longer stages")
        prompt, output = _sample_pair(spec, n, prompt_rng, output_rng, joint_rng)
    elif window is not None:
        if n is not None or offline or trace_mode != "lengths":
            raise ConfigError("an arrival window needs open-loop arrivals without --num-requests, --offline "
                              "or --trace-mode replay/scale")
        arrival = stage_arrivals(((rate, window),), arr_ss, process=process, cv=cv, daily_curve=curve)
        n = int(arrival.size)
        if n == 0:
            raise ConfigError(f"--duration {window:g}s: no request arrives in it at --rate {rate:g}; "
                              "use a higher rate or a longer duration")
        prompt, output = _sample_pair(spec, n, prompt_rng, output_rng, joint_rng)
    elif trace_mode == "lengths":
        n = DEFAULT_NUM_REQUESTS if n is None else int(n)
        prompt, output = _sample_pair(spec, n, prompt_rng, output_rng, joint_rng)
        if offline:
            arrival = np.zeros(n, dtype=np.float64)
        else:
            arrival = arrival_times(n, rate, arr_rng, process=process, cv=cv, daily_curve=curve)
    else:
        tr = _trace_rows(spec, n, trace_mode)
        n = len(tr) if n is None else int(n)
        prompt, output = tr.prompt[:n].copy(), tr.output[:n].copy()
        t = tr.arrival_s[:n] - tr.arrival_s[0]
        if offline:
            arrival = np.zeros(n, dtype=np.float64)
        elif trace_mode == "replay":
            arrival = t.astype(np.float64, copy=True)
        else:
            arrival = _scaled(t, rate, spec.name)

    sp = spec.shared_prefix
    prefix_group = np.full(n, -1, dtype=np.int64)
    prefix_len = np.zeros(n, dtype=np.int64)
    prefix_user = None
    if sp is None:
        if question_len is not None:
            raise ConfigError(f"--question-len {question_len!r} needs a shared prefix (--num-system-prompts N "
                              "--system-prompt-len L, or a workload with [shared_prefix]); for a plain "
                              "fixed prompt length use --isl")
        if isl is not None:
            prompt = np.full(n, _override("--isl", isl), dtype=np.int64)
    else:
        L = int(sp.system_prompt_len)
        if isl is not None and question_len is not None:
            raise ConfigError(f"--isl {isl!r} and --question-len {question_len!r} contradict: with a shared "
                              "prefix --isl is the whole prompt (system prompt + question); give one of them")
        if isl is not None:
            total = _override("--isl", isl)
            if total <= L:
                raise ConfigError(f"--isl {total} is not longer than the shared system prompt "
                                  f"(--system-prompt-len {L}); a prompt is the system prompt plus a question "
                                  f"of >= 1 token: use --isl >= {L + 1}, or --question-len Q")
            prompt = np.full(n, total, dtype=np.int64)
        users = np.random.default_rng(user_ss).integers(0, sp.num_system_prompts * sp.users_per_system_prompt,
                                                        size=n)
        if isl is None:
            if question_len is not None:
                question = np.full(n, _override("--question-len", question_len))
            elif sp.question_per == "user":   # one question per user, drawn once from its own stream
                question = sample_lengths(spec.prompt, sp.num_system_prompts * sp.users_per_system_prompt,
                                          np.random.default_rng(question_ss))[users]
            else:
                question = prompt
            prompt = L + np.asarray(question, dtype=np.int64)
        prefix_group = (users // sp.users_per_system_prompt).astype(np.int64)
        prefix_len = np.full(n, L, dtype=np.int64)
        if sp.question_per == "user":
            prefix_user = users.astype(np.int64)
    if osl is not None:
        output = np.full(n, _override("--osl", osl), dtype=np.int64)
    if max_len is not None:
        prompt, output = clip_to_context(prompt, output, max_len)
        prefix_len = np.minimum(prefix_len, prompt - 1)  # a cut prompt keeps >= 1 token to prefill
        prefix_group = np.where(prefix_len > 0, prefix_group, -1)
        if prefix_user is not None:
            prefix_user = np.where(prefix_group >= 0, prefix_user, -1)
    return Requests(np.ascontiguousarray(arrival, dtype=np.float64),
                    np.ascontiguousarray(prompt, dtype=np.int64),
                    np.ascontiguousarray(output, dtype=np.int64),
                    np.ascontiguousarray(prefix_group, dtype=np.int64),
                    np.ascontiguousarray(prefix_len, dtype=np.int64),
                    np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64),
                    np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.float64),
                    None if prefix_user is None else np.ascontiguousarray(prefix_user, dtype=np.int64))


def _session_requests(spec, n, rate, process, cv, offline, isl, osl, trace_mode, curve, max_len, stages,
                      question_len, window, rngs) -> Requests:
    """Multi-turn sessions (`spec.sessions`: T turns, think time mean m).

    Session s draws T questions q[s, t] (the workload's prompt lengths, or `question_len`) and T outputs
    o[s, t] (or `osl`); turn 0's prompt is q[s, 0] (with `max_len`, turn 0 is fitted like any request:
    `clip_to_context`), turn t's prompt is prompt[t-1] + o[s, t-1] + q[s, t]. With `max_len`, the session
    ends before the first turn whose prompt + output exceeds it (prompt + output grows with t, so it
    never resumes). Sessions are drawn until `n` turns exist; the last one is cut to make exactly `n`.

    Arrivals: the S session starts follow `process` at rate * S / n sessions/s, so requests are offered
    at `rate`/s on average (rate / T when no session is cut short). Follow-up turns have arrival inf,
    `think` ~ Exponential(mean m) from their own stream, and are sent `think` s after their previous
    turn ends (the engine's job, through `next_turn`). Order: the S first turns come first, at indices
    0..S-1 in arrival order (session id = that index), then all follow-up turns grouped by session
    (session 0's turns 1, 2, ..., then session 1's, ...).
    """
    arr_rng, prompt_rng, output_rng, joint_rng, think_rng = rngs
    T, mean_think = spec.sessions.turns_per_session, spec.sessions.think_time_s
    for bad, given in (("--stages", stages is not None), ("--duration (an arrival window)", window is not None),
                       (f"--trace-mode {trace_mode}", trace_mode != "lengths"),
                       (f"--isl {isl!r}", isl is not None)):
        if given:
            hint = ("fix each turn's new question with --question-len Q" if bad.startswith("--isl") else
                    "sessions need --num-requests N open-loop arrivals (or --offline) with --trace-mode lengths")
            raise ConfigError(f"{bad} does not apply to the sessions workload {spec.name!r} "
                              f"({T} turns per session); {hint}")
    if spec.shared_prefix is not None:
        raise ConfigError(f"workload {spec.name!r}: sessions with a shared prefix are not supported; "
                          "drop [shared_prefix] or [sessions]")
    n = DEFAULT_NUM_REQUESTS if n is None else int(n)
    if not offline:
        rate = _rate(rate)
    if max_len is not None:
        clip_to_context(np.ones(1, np.int64), np.ones(1, np.int64), max_len)  # validates max_len

    # every session has >= 1 turn, so n sessions always hold n turns
    q, o = _sample_pair(spec, n * T, prompt_rng, output_rng, joint_rng)
    q, o = q.reshape(n, T).astype(np.int64), o.reshape(n, T).astype(np.int64)
    if question_len is not None:
        q[:] = _override("--question-len", question_len)
    if osl is not None:
        o[:] = _override("--osl", osl)
    if max_len is not None:
        q[:, 0], o[:, 0] = clip_to_context(q[:, 0], o[:, 0], max_len)
    prompt = np.cumsum(q, axis=1) + np.cumsum(o, axis=1) - o
    turns = np.full(n, T, dtype=np.int64)
    if max_len is not None:
        fits = prompt + o <= int(max_len)
        fits[:, 0] = True
        turns = fits.sum(axis=1)       # fits is True up to the first turn that does not fit, then False
    cum = np.cumsum(turns)
    S = int(np.searchsorted(cum, n)) + 1   # first session at which n turns exist
    turns = turns[:S].copy()
    turns[-1] -= int(cum[S - 1]) - n
    prompt, o = prompt[:S], o[:S]
    think = think_rng.exponential(mean_think, size=(n, T))[:S]
    think[:, 0] = 0.0

    if offline:
        starts = np.zeros(S, dtype=np.float64)
    else:
        starts = arrival_times(S, rate * S / n, arr_rng, process=process, cv=cv, daily_curve=curve)
    t_idx = np.arange(T)
    mask = t_idx[None, :] < turns[:, None]
    idx = np.full((S, T), -1, dtype=np.int64)
    idx[:, 0] = np.arange(S)
    idx[:, 1:][mask[:, 1:]] = S + np.arange(n - S)
    nxt = np.full((S, T), -1, dtype=np.int64)
    nxt[:, :-1] = idx[:, 1:]
    arrival = np.full((S, T), np.inf)
    arrival[:, 0] = starts
    where = idx[mask]

    def flat(grid, dtype):
        out = np.empty(n, dtype=dtype)
        out[where] = grid[mask]
        return out

    return Requests(flat(arrival, np.float64), flat(prompt, np.int64), flat(o, np.int64),
                    np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64),
                    flat(np.broadcast_to(np.arange(S)[:, None], (S, T)), np.int64),
                    flat(np.broadcast_to(t_idx[None, :], (S, T)), np.int64),
                    flat(nxt, np.int64), flat(think, np.float64))


def _show_stages(stages) -> str:
    return ",".join(f"{r:g}x{d:g}s" for r, d in stages)


def _paired(spec: WorkloadSpec) -> bool:
    """Prompt and output are both the rows of the workload's trace: sample them as pairs."""
    tr = spec.trace
    return (tr is not None and spec.prompt.kind == "empirical" and spec.output.kind == "empirical"
            and len(spec.prompt.samples) == len(spec.output.samples) == len(tr))


def _sample_pair(spec, n, prompt_rng, output_rng, joint_rng):
    if _paired(spec):
        rows = joint_rng.integers(0, len(spec.trace), size=n)
        return (clip_lengths(spec.trace.prompt[rows], spec.prompt),
                clip_lengths(spec.trace.output[rows], spec.output))
    return sample_lengths(spec.prompt, n, prompt_rng), sample_lengths(spec.output, n, output_rng)


def _trace_rows(spec: WorkloadSpec, n: int, mode: str) -> Trace:
    tr = spec.trace
    if tr is None or tr.arrival_s is None:
        why = "has no trace" if tr is None else f"has no arrival times in its trace {Path(tr.path).name}"
        raise ConfigError(f"--trace-mode {mode} needs a trace with arrival times, but workload "
                          f"{spec.name!r} {why}; pass a timed trace .csv or use --trace-mode lengths")
    if n is not None and n > len(tr):
        raise ConfigError(f"--num-requests {n} exceeds the {len(tr)} rows of trace {Path(tr.path).name}; "
                          f"use --num-requests <= {len(tr)} or --trace-mode lengths")
    return tr


def _scaled(t: np.ndarray, rate, name: str) -> np.ndarray:
    rate = float(rate) if not isinstance(rate, bool) else float("nan")
    if not (rate > 0):
        raise ConfigError(f"--rate {rate!r} is not valid; use a rate > 0 requests/s")
    if t.size == 1 or math.isinf(rate):
        return np.zeros(t.size, dtype=np.float64)
    span = float(t[-1] - t[0])
    if span <= 0:
        raise ConfigError(f"--trace-mode scale: the first {t.size} arrivals of workload {name!r} all share "
                          "one time, so there is no rate to scale; use --trace-mode replay or lengths")
    return (t - t[0]) * (((t.size - 1) / rate) / span)


def _override(flag: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ConfigError(f"{flag} {v!r} is not valid; use an integer >= 1 token")
    return int(v)


def clip_to_context(prompt: np.ndarray, output: np.ndarray, max_len) -> tuple[np.ndarray, np.ndarray]:
    """Fit prompt + output into `max_len` tokens: cut the prompt first (keeping >= 1), then the output."""
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 2:
        raise ConfigError(f"--max-len {max_len!r} is not valid; use a context length >= 2 tokens")
    m = int(max_len)
    output = np.minimum(output, m - 1)
    prompt = np.maximum(np.minimum(prompt, m - output), 1)
    return prompt.astype(np.int64), output.astype(np.int64)
