"""Options shared by the commands that describe a deployment and its load (simulate, sweep, plan)."""
from __future__ import annotations

import click


def sim_config(kw: dict):
    """The simulate options as a checked SimConfig (durations parsed; every field and contradiction
    checked by `checks.check_sim_config` before any work)."""
    from ..api import SimConfig
    from ..checks import check_sim_config
    from ..metrics import parse_duration
    kw = dict(kw)
    kw["duration"] = parse_duration(kw["duration"], "--duration") if kw["duration"] is not None else None
    kw["warmup"] = parse_duration(kw["warmup"], "--warmup")
    return check_sim_config(SimConfig(**kw))


def simulate_options(f):
    opts = [
        click.option("--model", default="llama-3.1-8b", show_default=True, help="Model name, or a .toml / HF config.json path."),
        click.option("--hardware", default="h100-sxm", show_default=True),
        click.option("--tp", default=1, show_default=True, type=int),
        click.option("--pp", default=1, show_default=True, type=int),
        click.option("--replicas", default=1, show_default=True, type=int),
        click.option("--router", default="round-robin", show_default=True,
                     type=click.Choice(["round-robin", "random", "least-requests", "least-kv", "power-of-two"])),
        click.option("--dtype", default="auto", show_default=True,
                     help="Weights: bf16, fp16, fp8, int8, int4, fp4, or auto (the checkpoint's: its "
                          "quantization_config or torch_dtype; bf16 for shipped models)."),
        click.option("--kv-dtype", default="auto", show_default=True,
                     help="KV cache: bf16, fp16, fp8, int8, or auto (16-bit, the model's activation dtype, "
                          "as vLLM's kv_cache_dtype auto)."),
        click.option("--engine", default="vllm", show_default=True,
                     help="Engine profile: vllm, sglang, trtllm (engines/*.toml), or a path to your own .toml."),
        click.option("--scheduler", default=None, type=click.Choice(["vllm", "vllm-v0", "sarathi", "orca", "static"]),
                     help="Default: the engine profile's."),
        click.option("--max-num-seqs", default=None, type=int),
        click.option("--max-num-batched-tokens", default=None, type=int),
        click.option("--chunk-size", default=None, type=int, help="sarathi chunk size."),
        click.option("--block-size", default=None, type=int),
        click.option("--gpu-memory-utilization", default=None, type=float),
        click.option("--preemption", default=None, type=click.Choice(["recompute", "swap"])),
        click.option("--iteration-overhead-us", default=None, type=float,
                     help="Replace the engine profile's host time per step (us)."),
        click.option("--num-gpu-blocks", default=None, type=int,
                     help="KV-cache blocks per replica, as the real engine reported them (default: computed "
                          "from memory the way the engine does)."),
        click.option("--workload", default="chat", show_default=True, help="chat, code, summarization, long-context, or a .toml / trace .csv."),
        click.option("--isl", default=None, type=int, help="Fixed input length (overrides the workload)."),
        click.option("--osl", default=None, type=int, help="Fixed output length (overrides the workload)."),
        click.option("--num-system-prompts", default=None, type=int,
                     help="Shared prefix: N system prompts (with --system-prompt-len); each request's user is drawn at random."),
        click.option("--users-per-system-prompt", default=None, type=int, help="Users sharing each system prompt (default 1)."),
        click.option("--system-prompt-len", default=None, type=int, help="Tokens of each shared system prompt."),
        click.option("--question-len", default=None, type=int,
                     help="Fixed question tokens after the system prompt (default: the workload's prompt lengths)."),
        click.option("--rate", default=None, type=float, help="Requests/s (default: the workload's, times replicas)."),
        click.option("--stages", default=None,
                     help="Open-loop load in stages, RATExDURATION each, e.g. 5x600s,10x600s (sets the rate and the number of requests)."),
        click.option("--arrival", default=None, type=click.Choice(["poisson", "gamma", "deterministic", "bursty", "daily"]),
                     help="Open-loop arrival process [default: poisson]."),
        click.option("--cv", default=None, type=float,
                     help="Coefficient of variation of --arrival gamma [default: 1, as Poisson]."),
        click.option("--concurrency", default=None, type=int,
                     help="Closed loop with N >= 1 clients [default: open loop at --rate]."),
        click.option("--offline", is_flag=True, help="All requests at time zero."),
        click.option("--trace-mode", default="lengths", show_default=True, type=click.Choice(["lengths", "replay", "scale"])),
        click.option("--num-requests", default=None, type=int,
                     help="Default 2000; every row with --trace-mode replay/scale; not with --stages."),
        click.option("--duration", default=None, help="Stop the clock after this long (e.g. 600s)."),
        click.option("--warmup", default="0s", show_default=True, help="Exclude requests arriving before this."),
        click.option("--slo", default=None, help="e.g. ttft_p99=500ms,tpot_p99=50ms"),
        click.option("--seed", default=0, show_default=True, type=int),
        click.option("--price", default=None, type=float, help="Override $ per GPU-hour."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f
