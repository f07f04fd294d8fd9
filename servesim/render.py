"""Plain-text rendering of a simulation summary."""
from __future__ import annotations


def _f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def _load(s: dict, c: dict) -> str:
    """What arrived: offline, closed loop, stages, a replayed or rescaled trace, or a rate."""
    n = f", {s['num_requests']} requests"
    tr = c.get("trace")
    if c["offline"]:
        return "offline (all at t=0)" + n
    if c["concurrency"]:
        k, n_req = c["concurrency"], s["num_requests"]
        offline = "" if k < n_req else (f" ({'more clients than' if k > n_req else 'as many clients as'} the "
                                        f"{n_req} requests: in effect offline)")
        return f"closed loop, {c['concurrency']} clients" + offline + n
    if c.get("stages"):
        parts = ", ".join(f"{r:g} req/s x {d:g} s" for r, d in c["stages"])
        return f"{c['arrival']} arrivals in {len(c['stages'])} stage(s): {parts}" + n
    if tr and tr["mode"] == "replay":
        rate = "-" if c["rate"] is None else f"{c['rate']:.3g}"
        return (f"replay of trace {tr['file']}: {tr['num_requests']} requests over {tr['span_s']:.1f} s at the "
                f"trace's own arrival times, delivered {rate} req/s")
    if tr:
        return f"trace {tr['file']} rescaled to {c['rate']:.3g} req/s" + n
    if c.get("daily"):
        return _daily(c["daily"]) + n
    return f"{c['arrival']} arrivals at {c['rate']:.3g} req/s" + n


def _daily(d: dict) -> str:
    """A daily run: the window of the day it sent and the rate it delivered, against the day's mean."""
    there = "" if d["window_rate"] is None else f", curve mean there {d['window_rate']:.3g} req/s"
    got = "-" if d["delivered_rate"] is None else f"{d['delivered_rate']:.3g}"
    return (f"daily arrivals over {d['window']} of the day: delivered {got} req/s{there} "
            f"(--rate {d['day_mean_rate']:.3g} req/s is the mean over a whole day)")


def _workload(c: dict) -> str:
    if not c.get("system_prompt_len"):
        return f"workload {c['workload']}"
    per = {"user": ", one question per user", "request": ", a question per request"}.get(c.get("question_per"), "")
    return (f"workload {c['workload']} with {c['num_system_prompts']} shared system prompts of "
            f"{c['system_prompt_len']} tokens x {c['users_per_system_prompt']} users{per}")


def _stage_lines(stages: list) -> list[str]:
    lines = ["", f"{'stage':<7}{'req/s':>7}{'window (s)':>14}{'requests':>10}{'E2E mean/p90/p99 (ms)':>26}"
                 f"{'TTFT mean/p90/p99 (ms)':>26}  status"]
    for st in stages:
        e, t = st["e2e_ms"], st["ttft_ms"]
        window = f"{st['start_s']:g}-{st['start_s'] + st['duration_s']:g}"
        lines.append(f"{st['stage']:<7}{st['rate']:>7.3g}{window:>14}{st['num_requests']:>10}"
                     + f"{' / '.join(_f(e[k], '{:.0f}') for k in ('mean', 'p90', 'p99')):>26}"
                     + f"{' / '.join(_f(t[k]) for k in ('mean', 'p90', 'p99')):>26}"
                     + f"  {_verdict(st)}")
    return lines


def _stages_busy(u: dict) -> str:
    """Pipeline stages' compute share, first / each later stage (PP only)."""
    later = u.get("later_stage_busy_fraction")
    if later is None:
        return ""
    return f", stages computing {100 * u['first_stage_busy_fraction']:.0f}% / {100 * later:.0f}%"


def _capacity_line(c: dict) -> str:
    """simulate --capacity: the simulated maximum sustainable rate and the headroom left."""
    if c["max_sustainable_rate"] is None:
        return f"capacity    no sustainable rate found ({c['limited_by']})"
    return (f"capacity    max sustainable {c['max_sustainable_rate']:.3g} req/s (simulated, "
            f"{c['simulations']} runs), headroom {100 * c['capacity_headroom']:.0f}% at {c['offered_rate']:.3g} req/s")


def _ci(bounds) -> str:
    """[lo, hi] of a 95% interval, 3-4 significant digits; '?' for a bound the run cannot give, '-' for none."""
    if not bounds or bounds == [None, None]:
        return "-"
    return f"[{_num(bounds[0])}, {_num(bounds[1])}]"


def _num(v) -> str:
    return "?" if v is None else f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _tci(t: dict, key: str) -> str:
    """' [lo, hi]' of a throughput figure (summaries written before intervals have none)."""
    b = t.get("ci95", {}).get(key)
    return " " + _ci(b) if b else ""


def _model_error_lines(m: dict) -> list[str]:
    """The model-error block: its class, its source and, with --capacity, the capacity interval."""
    from .model_error import class_text
    c = m["class"]
    where = class_text(c["used"]) + ("" if c["kernel_tables"] else ", + kernel efficiencies carried over to this GPU")
    out = [f"model error 80% intervals of the means from {m['count']} held-out runs/stages ({where}); "
           f"a statement about the model, not the simulation (its intervals are the CI rows)"]
    if m.get("output_tokens_per_s"):
        lo, hi = m["output_tokens_per_s"]
        out.append(f"            output throughput {lo:.4g}-{hi:.4g} tok/s (from {m['throughput_count']} held-out "
                   "TensorRT-LLM maximum-throughput rows)")
    if m.get("capacity"):
        cap = m["capacity"]
        lo, hi = cap["max_sustainable_rate"]
        h_lo, h_hi = cap["capacity_headroom"]
        out.append(f"            max sustainable rate {lo:.3g}-{hi:.3g} req/s, headroom {100 * h_lo:.0f}% to "
                   f"{100 * h_hi:.0f}%" + (", NEAR CAPACITY: the offered load is inside the band"
                                           if m.get("near_capacity") else ""))
    return out


def _fit_lines(s: dict) -> list[str]:
    """Where the efficiencies come from (`config.engine.provenance`): one line, or one per pool whose
    hardware or engine differs; summaries written before it have none."""
    c = s["config"]
    fits = [c["fit"]] if c.get("fit") else []
    for p in s.get("pools") or ():
        if p.get("fit") and p["fit"] not in fits:
            fits.append(p["fit"])
    return [f"{'fit' if k == 0 else '':<10}{f['text']}" + ("" if f["measured"] else "  [BORROWED]")
            for k, f in enumerate(fits)]


def _offered(t: dict) -> str:
    """' delivered of X offered' for a run with an offered load (summaries written before it have none)."""
    return "" if t.get("offered_requests_per_s") is None else f" delivered of {t['offered_requests_per_s']:.2f} offered"


def _window_lines(s: dict) -> list[str]:
    """The window the rates and latencies cover, the drain after it, and a sessions run's turns."""
    t, out = s["throughput"], []
    if s.get("drain") and t.get("window_s"):
        lo, hi = t["window_s"]
        d = s["drain"]
        out.append(f"            over the offered load, {lo:.1f}-{hi:.1f} s (the latencies' window); drain after it "
                   f"{d['duration_s']:.1f} s, {d['requests']} completions"
                   + (f", {d['arrivals']} later turns" if s.get("sessions") else ""))
    if s.get("sessions"):
        x = s["sessions"]
        out.append(f"sessions    {x['sessions_started']} started ({x['sessions_per_s']:.2f}/s, "
                   f"{x['turns_per_session']:.2f} turns each); turns offered {x['offered_turns_per_s']:.2f}/s, "
                   f"completed {x['completed_turns_per_s']:.2f}/s")
    return out


def _verdict(s: dict) -> str:
    """SATURATED, stable or undetermined (`saturated` alone in summaries written before the verdict)."""
    v = s.get("saturation_verdict") or ("saturated" if s["saturated"] else "stable")
    return "SATURATED" if v == "saturated" else v


def _wide_ep(c: dict) -> str:
    """' EP=8 attn-DP=8' for a run with expert parallelism or DP attention (their keys are in the config
    only when given)."""
    ep, dp = c.get("ep", 1), c.get("attn_dp", 1)
    return (f" EP={ep}" if ep != 1 else "") + (f" attn-DP={dp}" if dp != 1 else "")


def _pool_ep(p: dict) -> str:
    """A pool's EP / attn-DP, from its canonical spec (``name``)."""
    from .pools import parse_pool
    if not p.get("name"):
        return ""
    spec = parse_pool(p["name"])
    return _wide_ep({"ep": spec.ep, "attn_dp": spec.attn_dp})


def _speculative_line(sp: dict) -> str:
    """The run's speculative decoding: the acceptance model, what the steps yielded, where the time went."""
    def pct(v):
        return "-" if v is None else f"{100 * v:.0f}%"
    acc = sp.get("mean_accepted_per_step")
    got = "no verification step" if acc is None else f"{acc:.2f} drafts accepted per step"
    return (f"speculative {sp['method']} k={sp['k']} A={sp['acceptance']:.3f}: {got} "
            f"({sp['expected_tokens_per_step']:.2f} tokens per step expected), busy time drafting "
            f"{pct(sp['draft_time_share'])}, in verifying steps {pct(sp['verify_time_share'])}")


def summary_table(s: dict) -> str:
    c = s["config"]
    if s.get("pools"):      # a deployment of pools: list them
        where = ", ".join(f"{p['replicas']} x TP={p['tp']} PP={p['pp']}{_pool_ep(p)} on {p['hardware']} ({p['role']})"
                          for p in s["pools"])
        head = f"servesim  {c['model']} on {c['num_gpus']} GPUs in {len(s['pools'])} pool(s): {where}, "
    else:
        head = (f"servesim  {c['model']} ({c['dtype']}) on {c['num_gpus']} x {c['hardware']}: {c['replicas']} "
                f"replica(s) of TP={c['tp']} PP={c['pp']}" + _wide_ep(c) + ", ")
    lines = [
        head + f"engine {c['engine']}/{c['scheduler']}, {_workload(c)}",
        "load      " + _load(s, c) + f", seed {c['seed']}",
        f"status    {s['num_completed']} completed, {s['num_rejected']} rejected, "
        f"{_verdict(s)}, simulated {s['duration_s']:.1f} s, "
        f"{s['iterations']} iterations, {s['preemptions']} preemptions",
    ]
    if s.get("saturation_verdict", "stable") != "stable" and s.get("saturation_reason"):
        lines.append(f"          {_verdict(s)}: {s['saturation_reason']}")
    lines += _fit_lines(s)
    lines += [
        "",
        f"{'latency (ms)':<14}{'mean':>14}{'p50':>14}{'p90':>14}{'p95':>14}{'p99':>14}",
    ]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"),
                       ("queue_ms", "queueing")):
        d = s[key]
        stats = ("mean", "p50", "p90", "p95", "p99")
        lines.append(f"{label:<14}" + "".join(f"{_f(d.get(k)):>14}" for k in stats))
        if d.get("ci95"):
            lines.append(f"{'  95% CI':<14}" + "".join(f"{_ci(d['ci95'].get(k)):>14}" for k in stats))
        me = (s.get("model_error") or {}).get(f"{key}_mean")
        if me:
            lines.append(f"{'  model 80%':<14}{_ci(me):>14}")
    if any("?" in line for line in lines if line.startswith("  95% CI")):
        lines.append("  (? : a bound too few requests can give; run more requests for it)")
    if s.get("stream"):     # a streamed run: percentiles from log-binned histograms (metrics_stream.py)
        st = s["stream"]
        lines.append(f"  (streamed: percentiles within {100 * st['quantile_relative_error']:.1f}% of the exact ones, "
                     f"from log-binned histograms; records: {st['records'] or 'not kept'})")
        lines.append(f"  (95% CI: {st['ci']})")
    if s.get("stages"):
        lines += _stage_lines(s["stages"])
    t, u, cost = s["throughput"], s["utilization"], s["cost"]
    lines += [
        "",
        f"throughput  {t['requests_per_s']:.2f} req/s{_tci(t, 'requests_per_s')}{_offered(t)}, "
        f"{t['input_tokens_per_s']:.0f} input tok/s, {t['output_tokens_per_s']:.0f} output tok/s"
        f"{_tci(t, 'output_tokens_per_s')} ({t['output_tokens_per_s_per_gpu']:.0f} per GPU)",
    ]
    lines += _window_lines(s)
    lines += [
        f"utilisation batch {u['mean_batch_size']:.1f} seqs, busy {100 * u['busy_fraction']:.0f}% (a batch in flight)"
        + _stages_busy(u) + ", "
        f"KV mean {100 * u['kv_cache_mean']:.0f}% / max {100 * u['kv_cache_max']:.0f}%, "
        f"MFU {100 * u['mfu']:.1f}%, MBU {100 * u['mbu']:.1f}%",
        f"cost        ${cost['usd_per_hour']:.2f}/h, ${_f(cost['usd_per_million_output_tokens'], '{:.3f}')} per M output tokens, "
        f"${_f(cost['usd_per_million_input_tokens'], '{:.3f}')} per M input tokens",
    ]
    for p in s.get("pools") or ():
        lines.append(f"pool        {p['name']}: busy {100 * p['busy_fraction']:.0f}%, batch "
                     f"{p['mean_batch_size']:.1f} seqs, KV mean {100 * p['kv_utilisation']:.0f}% / max "
                     f"{100 * p['kv_max']:.0f}%, ${p['usd_per_hour']:.2f}/h")
    if s.get("speculative"):
        lines.append(_speculative_line(s["speculative"]))
    if s.get("kv_transfer_ms"):
        x = s["kv_transfer_ms"]
        lines.append(f"KV transfer p50 {_f(x.get('p50'))} ms, p99 {_f(x.get('p99'))} ms ({x.get('count')} transfers)")
    if s.get("prefix_cache"):
        pc = s["prefix_cache"]
        lines.append(f"prefix cache hit rate {100 * pc['hit_rate']:.1f}% of prompt tokens "
                     f"({pc['gpu_hits']} from GPU, {pc['cpu_hits']} from the CPU tier), evictions "
                     f"{pc['evictions']['gpu']} GPU / {pc['evictions']['cpu']} CPU blocks")
    if s.get("capacity"):
        lines.append(_capacity_line(s["capacity"]))
    if s.get("model_error"):
        lines += _model_error_lines(s["model_error"])
    if s.get("slo"):
        lines.append("")
        for k, v in s["slo"].items():
            lines.append(f"SLO {k:<10} target {v['target_ms']:.1f} ms, got {_f(v['value_ms'])} ms: "
                         f"{'met' if v['met'] else 'MISSED'}")
        lines.append(f"SLO attainment {100 * s['slo_attainment']:.1f}% of requests, "
                     f"goodput {s['goodput_requests_per_s']:.2f} req/s")
    return "\n".join(lines)
