"""`servesim` command line: thin click commands over the library."""
from __future__ import annotations

import atexit
import contextlib
import gc
import json
import sys
import warnings
from collections.abc import MutableMapping
from dataclasses import fields
from pathlib import Path

import click

from ..version import __version__
from .options import click_option as sim_option
from .options import simulate_options as _simulate_options
from ..errors import ServesimError, ServesimWarning
from ..outputs import Terminated, exit_status, signal_handlers, signal_name


# At exit, every object goes to the permanent generation, so the interpreter's last collection skips
# the hundreds of thousands that numba and the run leave (a quarter of a second of a cached
# `servesim simulate`'s ~1.4 s of CPU on 2 cores, experiments/startup.py). Outputs are written and
# closed before the command returns; nothing waits on a finaliser.
atexit.register(gc.freeze)


class Group(click.Group):
    """One line on stderr instead of a traceback or a usage block: domain errors and bad option values
    exit 2; SIGINT / SIGTERM exit 130 / 143 saying what was left on disk (`servesim.outputs`).
    Warnings of options that do nothing (`ServesimWarning`) are one line each."""

    def invoke(self, ctx):
        with contextlib.ExitStack() as stack:
            if ctx.parent is None:
                stack.enter_context(signal_handlers())
                stack.enter_context(_one_line_warnings())
            try:
                return super().invoke(ctx)
            except ServesimError as e:
                click.echo(f"servesim: error: {e}", err=True)
                sys.exit(2)
            except click.exceptions.NoArgsIsHelpError:
                raise
            except click.UsageError as e:
                where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
                click.echo(f"servesim: error: {e.format_message()}{where}", err=True)
                sys.exit(2)
            except (KeyboardInterrupt, Terminated) as e:
                notes = getattr(e, "servesim_notes", [])
                click.echo(f"servesim: interrupted by {signal_name(e)}" + "".join(f"; {n}" for n in notes),
                           err=True)
                sys.exit(exit_status(e))


@contextlib.contextmanager
def _one_line_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("always", ServesimWarning)
        show, shown = warnings.showwarning, set()

        def one_line(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, ServesimWarning):
                if str(message) not in shown:     # once per message, from whichever check found it
                    shown.add(str(message))
                    click.echo(f"servesim: warning: {message}", err=True)
            else:
                show(message, category, filename, lineno, file, line)
        warnings.showwarning = one_line
        yield


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="servesim")
def main():
    """servesim: simulate LLM serving deployments and price them.

    \b
    Examples:
      servesim simulate
      servesim simulate --model llama-3.1-70b --tp 4 --rate 8 --slo ttft_p99=1s,tpot_p99=60ms
      servesim cost --model llama-3.1-8b --hardware h100-sxm --decode-seqs 64 --context 2048
      servesim profiles list
    """


def _dump(obj) -> str:
    return json.dumps(obj, indent=2)


# ---------------------------------------------------------------- profiles
@main.group(cls=Group)
def profiles():
    """List and show hardware profiles and model architectures.

    \b
    Examples:
      servesim profiles list
      servesim profiles show h100-sxm --format json
      servesim profiles show llama-3.1-70b
    """


@profiles.command("list")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def profiles_list(fmt):
    """List shipped hardware profiles and models (TOMLs, then HF config.json files marked "hf")."""
    from ..config import list_hardware, list_models, load_hardware, load_model
    from ..config.model import list_hf_models
    hw = [load_hardware(n) for n in list_hardware()]
    models = [load_model(n) for n in list_models() + list_hf_models()]
    if fmt == "json":
        click.echo(_dump({
            "hardware": [{"name": h.name, "bf16_tflops": h.peak_flops["bf16"] / 1e12, "hbm_gb": h.hbm_bytes / 1e9,
                          "hbm_tbps": h.hbm_bw / 1e12, "usd_per_gpu_hour": h.usd_per_hour} for h in hw],
            "models": [{"name": m.name, "params_b": m.param_count() / 1e9,
                        "active_params_b": m.active_param_count() / 1e9, "layers": m.num_layers,
                        "config": "hf" if m.path.suffix == ".json" else "toml"} for m in models],
        }))
        return
    click.echo("hardware")
    click.echo(f"  {'name':<16}{'bf16 TFLOP/s':>14}{'HBM GB':>9}{'HBM TB/s':>10}{'$/GPU-h':>9}")
    for h in hw:
        click.echo(f"  {h.name:<16}{h.peak_flops['bf16'] / 1e12:>14.0f}{h.hbm_bytes / 1e9:>9.0f}"
                   f"{h.hbm_bw / 1e12:>10.2f}{h.usd_per_hour:>9.2f}")
    click.echo("models")
    w = max(16, 2 + max(len(m.name) for m in models))
    click.echo(f"  {'name':<{w}}{'params (B)':>12}{'active (B)':>12}{'layers':>8}{'context':>9}  config")
    for m in models:
        click.echo(f"  {m.name:<{w}}{m.param_count() / 1e9:>12.2f}{m.active_param_count() / 1e9:>12.2f}"
                   f"{m.num_layers:>8}{m.max_context:>9}  {'hf' if m.path.suffix == '.json' else 'toml'}")


def _profile_dict(obj) -> dict:
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if hasattr(v, "__dataclass_fields__"):
            v = _profile_dict(v)
        elif isinstance(v, Path):
            v = str(v)
        out[f.name] = v
    return out


@profiles.command("show")
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def profiles_show(name, fmt):
    """Show one hardware profile or model (SI units)."""
    from ..config import list_hardware, list_models, load_hardware, load_model
    from ..config.model import list_hf_models
    from ..errors import ConfigError
    if name in list_hardware() or name.endswith(".toml") and "models" not in name:
        try:
            obj = load_hardware(name)
        except ConfigError:
            obj = load_model(name)
    elif name in list_models() or name in list_hf_models() or name.endswith((".toml", ".json")):
        obj = load_model(name)
    else:
        raise ConfigError(f"unknown profile {name!r}; hardware: {', '.join(list_hardware())}; "
                          f"models: {', '.join(list_models())}; HF configs: {', '.join(list_hf_models())}")
    d = _profile_dict(obj)
    if hasattr(obj, "param_count"):
        d["param_count"] = obj.param_count()
        d["active_param_count"] = obj.active_param_count()
    if fmt == "json":
        click.echo(_dump(d))
        return
    _print_tree(d)


def _print_tree(d: dict, indent: int = 0):
    for k, v in d.items():
        if isinstance(v, dict):
            click.echo(" " * indent + f"{k}:")
            _print_tree(v, indent + 2)
        else:
            click.echo(" " * indent + f"{k}: {v}")


# ---------------------------------------------------------------- cost
@main.command()
@sim_option("model")
@sim_option("hardware")
@sim_option("tp")
@sim_option("pp")
@click.option("--dtype", default="bf16", show_default=True, help="Weight dtype: those of simulate's --dtype but auto.")
@sim_option("kv_dtype")
@sim_option("allreduce")
@click.option("--prefill-tokens", default=0, show_default=True, type=int, help="Prefill tokens in the batch.")
@click.option("--prefill-seqs", default=1, show_default=True, type=int, help="Sequences the prefill tokens are split over.")
@click.option("--cached", default=0, show_default=True, type=int, help="Tokens already cached per prefill sequence.")
@click.option("--decode-seqs", default=0, show_default=True, type=int)
@click.option("--context", default=1024, show_default=True, type=int, help="Context length of each decode sequence.")
@sim_option("engine")
@sim_option("max_num_seqs", default=256, show_default=True, help="Sets the engine's largest captured CUDA-graph batch.")
@sim_option("ep")
@sim_option("attn_dp")
@sim_option("expert_skew")
@sim_option("speculative")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def cost(model, hardware, tp, pp, dtype, kv_dtype, allreduce, prefill_tokens, prefill_seqs, cached, decode_seqs,
         context, engine, max_num_seqs, ep, attn_dp, expert_skew, speculative, fmt):
    """Time of one engine iteration with a breakdown per operator class.

    \b
    Examples:
      servesim cost --decode-seqs 64 --context 2048
      servesim cost --model llama-3.1-70b --tp 4 --prefill-tokens 8192 --prefill-seqs 4
      servesim cost --model deepseek-v3 --hardware h200-sxm --dtype fp8 --tp 1 --attn-dp 8 --ep 8 --decode-seqs 512
      servesim cost --model llama-3.1-70b --tp 4 --decode-seqs 8 --speculative draft:k=4:acceptance=0.8:draft=llama-3.1-8b
    """
    from ..workflows import cost as run
    res = run(model, hardware, tp=tp, pp=pp, dtype=dtype, kv_dtype=kv_dtype, allreduce=allreduce,
              prefill_tokens=prefill_tokens, prefill_seqs=prefill_seqs, cached=cached, decode_seqs=decode_seqs,
              context=context, engine=engine, max_num_seqs=max_num_seqs, ep=ep, attn_dp=attn_dp,
              expert_skew=expert_skew, speculative=speculative)
    if fmt == "json":
        click.echo(res.to_json())
        return
    d, mem = res.summary, res.summary["memory"]
    par = f"  EP={ep} attn-DP={attn_dp} ({d['num_gpus']} GPUs)" if ep > 1 or attn_dp > 1 else ""
    click.echo(f"{d['model']} on {d['hardware']}  TP={tp} PP={pp}{par} {dtype}  batch: {prefill_tokens} prefill tokens "
               f"in {d['prefill_seqs']} seqs, {decode_seqs} decodes at context {context}")
    click.echo(f"  iteration time  {d['time_ms']:9.3f} ms   (pipeline interval {d['interval_ms']:.3f} ms)")
    for r in res.breakdown.itertuples():
        click.echo(f"  {r.part:<14}  {r.time_ms:9.3f} ms  {100 * r.share:5.1f}%  {r.bound}")
    click.echo(f"  bottleneck      {d['bottleneck']}")
    if "moe" in d:
        mo = d["moe"]
        skew = "" if mo["expert_skew"] is None else \
            f", routing {'balanced' if mo['expert_skew'] == 0 else 'power law ' + format(mo['expert_skew'], 'g')}"
        click.echo(f"  MoE             routed experts {mo['experts_ms']:.3f} ms (in gemm), dispatch + combine "
                   f"{mo['alltoall_ms']:.3f} ms (in communication){skew}")
    if "speculative" in d:
        sp = d["speculative"]
        click.echo(f"  speculative     {sp['method']} k={sp['k']} A={sp['acceptance']:.3f}: draft {sp['draft_ms']:.3f} ms + "
                   f"verify {sp['verify_ms']:.3f} ms per step, {sp['expected_tokens']:.2f} tokens per step -> "
                   f"{sp['per_token_ms']:.3f} ms per token vs {sp['plain_step_ms']:.3f} ms plain "
                   f"({sp['speedup']:.2f}x)")
    click.echo(f"  memory/GPU      weights {mem['weights_gib']:.1f} GiB, KV {mem['kv_bytes_per_token'] / 1024:.1f} "
               f"KiB/token, KV capacity {mem['kv_capacity_tokens']:,} tokens at 90% utilisation")


# ---------------------------------------------------------------- simulate
@main.command()
@_simulate_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-o", "--output", "outdir", default=None, type=click.Path(file_okay=False),
              help="Write requests.csv(.parquet), summary.json and figures here.")
@click.option("--capacity", is_flag=True,
              help="Also find the maximum sustainable rate by simulation (5-8 more runs) and report "
                   "capacity_headroom = 1 - rate / that rate.")
def simulate(fmt, outdir, capacity, **kw):
    """Simulate a serving deployment request by request.

    With no options: llama-3.1-8b on one h100-sxm, vLLM preset, chat workload at its default rate.

    \b
    Examples:
      servesim simulate
      servesim simulate --model llama-3.1-70b --tp 4 --replicas 2 --rate 10 --format json
      servesim simulate --isl 1024 --osl 128 --offline --num-requests 1000 --engine trtllm
      servesim simulate --rate 4 --capacity
      servesim simulate --pool h100-sxm:tp1:x2:prefill --pool h100-sxm:tp1:x2:decode --format json
      servesim simulate --workload sessions --cpu-kv-gib 64 --router prefix-aware
    """
    from ..api import simulate as run
    from .options import sim_config
    from ..outputs import output_dir
    from ..outputs.results import write_outputs
    cfg = sim_config(kw)
    if capacity:
        from ..planning.capacity import check_open_loop
        check_open_loop(cfg)
    with output_dir(outdir, "-o", "servesim simulate") as out:
        res = run(cfg, records=None if out is None else out.stage / "requests.csv")
        if capacity:
            from ..planning.capacity import capacity as find_capacity
            res.summary["capacity"] = find_capacity(cfg, res.summary["config"]["rate"])
            from ..model_error import with_capacity
            res.summary["model_error"] = with_capacity(res.summary.get("model_error"), res.summary,
                                                       res.summary["capacity"])
        if out is not None:
            out.write(lambda d: write_outputs(res, d))
    if fmt == "json":
        click.echo(res.to_json())
    else:
        from ..render import summary_table
        click.echo(summary_table(res.summary))


@main.command()
def warmup():
    """Compile the simulator for every feature set now (for CI and container images).

    Fills numba's cache (NUMBA_CACHE_DIR, else the package's __pycache__) with one small simulation
    of each feature set the kernel is compiled for, so that no later run waits for a compile.

    \b
    Examples:
      servesim warmup
      NUMBA_CACHE_DIR=/opt/numba-cache servesim warmup
    """
    from ..api import warmup as run

    run(each=lambda name, s: click.echo(f"{name}: {s:.1f} s"))


# The commands defined in the other modules of servesim.cli are loaded when first looked up (to run
# one, for --help, or read from `main.commands`): `servesim simulate` does not load their modules.
ELSEWHERE = ("sweep", "plan", "train", "compare", "report", "calibrate", "validate")


def _command_elsewhere(name: str) -> click.Command:
    if name in ("sweep", "plan"):
        from . import plan as module
    elif name in ("train", "compare"):
        from . import train as module
    elif name == "report":
        from . import report as module
    else:
        from . import calibrate as module
    return getattr(module, name)


class Commands(MutableMapping):
    """A group's commands by name, those of `ELSEWHERE` loaded on first look-up (click reads a group's
    commands only through this mapping)."""

    def __init__(self, here):
        self._got = dict(here)

    def __getitem__(self, name):
        if name not in self._got and name in ELSEWHERE:
            self._got[name] = _command_elsewhere(name)
        return self._got[name]

    def __setitem__(self, name, command):
        self._got[name] = command

    def __delitem__(self, name):
        del self._got[name]

    def __iter__(self):
        return iter(list(self._got) + [n for n in ELSEWHERE if n not in self._got])

    def __len__(self):
        return len(set(self._got) | set(ELSEWHERE))


main.commands = Commands(main.commands)


if __name__ == "__main__":
    main()
