"""`servesim train` and `servesim compare`: thin click commands over servesim.workflows.training (the
functions behind `servesim.train` and `servesim.compare`)."""
from __future__ import annotations

import click

from ..training.framework import FP8_RECIPES, REMAT_POLICIES, RESHARD
from ..training.layout import CP_COMM
from .options import SLO


def _offload_text(n: int) -> str:
    """' offload=all layers' for --offload-activations all (stored as 2**30), ' offload=N layers/chunk'."""
    if not n:
        return ""
    return " offload=all layers" if n >= 1 << 30 else f" offload={n} layers/chunk"


def _train_options(f):
    opts = [
        click.option("--model", default="llama-3.1-8b", show_default=True, help="Model name or path."),
        click.option("--hardware", default="h100-sxm", show_default=True, help="Hardware profile."),
        click.option("--framework", default="megatron", show_default=True,
                     help="Training framework profile: megatron, megatron-bridge, nemo, torchtitan, maxtext, deepspeed, hf, composer, or a "
                          "TOML file (servesim/training/data/frameworks)."),
        click.option("--gpus", default="8", show_default=True,
                     help="Total GPUs, or a list (64,128,...) for a scaling table."),
        click.option("--tp", default=1, show_default=True, type=int, help="Tensor-parallel degree."),
        click.option("--pp", default=1, show_default=True, type=int, help="Pipeline stages."),
        click.option("--dp", default=None, type=int, help="Data-parallel degree [default: GPUs/(tp*pp*cp)]."),
        click.option("--cp", default=1, show_default=True, type=int, help="Context-parallel degree."),
        click.option("--cp-comm", default="ring", show_default=True, type=click.Choice(list(CP_COMM)),
                     help="Context parallelism: ring attention (KV blocks passed around, overlapped; Megatron "
                          "p2p), all-to-all (Ulysses: heads re-split) or allgather (the whole sequence's K, V "
                          "gathered before attention: the Llama 3 report's CP, Megatron all_gather, torchtitan's "
                          "default rotate method)."),
        click.option("--ep", default=1, show_default=True, type=int, help="Expert-parallel degree (inside DP)."),
        click.option("--ep-overlap", is_flag=True,
                     help="Run the expert-parallel all-to-alls beside another micro-batch's compute (Megatron "
                          "--overlap-moe-expert-parallel-comm); what the compute cannot cover stays exposed."),
        click.option("--vp", default=1, show_default=True, type=int, help="Virtual stages per pipeline rank (interleaved 1F1B)."),
        click.option("--first-stage-layers", default=None, type=int,
                     help="Layers of the first pipeline stage (Megatron --decoder-first-pipeline-num-layers); "
                          "the middle stages share the rest."),
        click.option("--last-stage-layers", default=None, type=int,
                     help="Layers of the last pipeline stage (Megatron --decoder-last-pipeline-num-layers)."),
        click.option("--account-for-embedding", is_flag=True,
                     help="Count the embedding as a layer in the pipeline split (Megatron's option of that name)."),
        click.option("--account-for-loss", is_flag=True,
                     help="Count the LM head and loss as a layer in the pipeline split (Megatron's option)."),
        click.option("--pipeline-layout", default=None,
                     help="Place the embedding (E), layers (t), MTP layers (m) and loss (L) stage by stage in "
                          "Megatron-Core's syntax, stages in virtual-stage order separated by | (e.g. "
                          "'Et|(tt|)*30mL' for DeepSeek-V3 on pp x vp = 32 stages), or 'auto' for the most "
                          "balanced split."),
        click.option("--sp/--no-sp", default=None,
                     help="Sequence parallelism with TP [default: the framework's: on with TP for nemo, "
                          "megatron-bridge and torchtitan]."),
        click.option("--tp-overlap/--no-tp-overlap", default=None,
                     help="Overlap SP's all-gather/reduce-scatter with the GEMMs (Megatron --tp-comm-overlap, "
                          "torchtitan async TP; needs --sp) [default: the framework's]."),
        click.option("--zero", default=None, type=int,
                     help="ZeRO stage 0-3 (1 = distributed optimizer, 3 = FSDP) [default: the framework's].") ,
        click.option("--dp-overlap/--no-dp-overlap", default=None,
                     help="Overlap gradient reduction / parameter gathers with compute [default: the framework's]."),
        click.option("--dp-shard", default=None, type=int,
                     help="Hybrid sharding: ZeRO / FSDP shard the model states over this many data-parallel ranks "
                          "and replicate them over the rest (torchtitan data_parallel_shard_degree, MaxText "
                          "ici_fsdp x dcn_data) [default: every data-parallel rank]."),
        click.option("--fsdp-prefetch", default=None, type=int,
                     help="ZeRO-3/FSDP: layers whose parameters are gathered ahead [default: the framework's]."),
        click.option("--fsdp-param-bytes", default=None, type=click.Choice(["2", "4"]),
                     help="ZeRO-3/FSDP: bytes per gathered parameter (4: fp32 gathers) [default: the framework's]."),
        click.option("--recompute", default=None, type=click.Choice(["none", "selective", "full", "auto"]),
                     help="Activation recomputation; auto = the least recomputation that fits in memory; selective "
                          "in the framework's sense (Megatron modules, torchtitan --selective-ac) [default: the "
                          "framework's]."),
        click.option("--selective-ac", default=None,
                     help="torchtitan: what --recompute selective recomputes: op (per-op: every second matmul and "
                          "the elementwise kernels) or N (every N-th layer) [default: the framework's]."),
        click.option("--remat-policy", default=None, type=click.Choice(list(REMAT_POLICIES)),
                     help="MaxText: the remat policy (full, minimal, save_dot_except_mlp, ...) [default: the "
                          "framework's]."),
        click.option("--reshard-after-forward", default=None, type=click.Choice(list(RESHARD)),
                     help="FSDP / ZeRO-3: gather the parameters again in the backward (always), keep them gathered "
                          "(never), or torchtitan's default (never under PP) [default: the framework's]."),
        click.option("--fp8-all-gather/--no-fp8-all-gather", default=None,
                     help="FSDP / ZeRO-3 with --dtype fp8: gather the weights in fp8 (torchao "
                          "enable_fsdp_float8_all_gather, Megatron --fp8-param-gather) [default: the framework's]."),
        click.option("--recompute-layers", default=None, type=int,
                     help="With --recompute full: recompute only N layers of each model chunk (Megatron "
                          "--recompute-method block --recompute-num-layers N)."),
        click.option("--recompute-modules", default=None,
                     help="With --recompute selective: modules to recompute, comma-separated: core_attn (default), "
                          "mlp, moe, moe_act, shared_experts, layernorm, mla_up_proj."),
        click.option("--offload-activations", default=None,
                     help="Move the saved activations of N layers per model chunk (or 'all') to host memory over "
                          "PCIe / NVLink-C2C, overlapped with compute."),
        click.option("--dtype", default="bf16", show_default=True, type=click.Choice(["bf16", "fp8"])),
        click.option("--fp8-recipe", default=None, type=click.Choice(list(FP8_RECIPES)),
                     help="fp8 scaling: delayed (per-tensor amax history), current (per-tensor, this step), block "
                          "(1x128 tiles, software), mxfp8 (Blackwell hardware blocks), tensorwise / rowwise "
                          "(torchao.float8) [default: the framework's for the architecture]."),
        click.option("--attention", default=None, type=click.Choice(["flash", "fa2", "unfused"]),
                     help="Attention kernel [default: the framework's]."),
        click.option("--dropout", is_flag=True, help="Attention and hidden dropout on (GPT-3 style recipes): masks kept."),
        click.option("--seq-len", default=4096, show_default=True, type=int),
        click.option("--micro-batch", default=1, show_default=True, type=int, help="Sequences per micro-batch."),
        click.option("--global-batch", default=256, show_default=True, type=int, help="Sequences per step."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _profile_values(taken: dict) -> str:
    def shown(v):
        if v is True:
            return "on"
        if v is False:
            return "off"
        return str(v)
    return ", ".join(f"{k} {shown(v)}" for k, v in taken.items())


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def _render_result(d: dict) -> str:
    lay = d["layout"]
    rc = lay["recompute"]
    if lay.get("remat_policy"):
        rc += f" (remat policy {lay['remat_policy']})"
    elif lay.get("recompute_layers"):
        rc += f" ({lay['recompute_layers']} layers per chunk)"
    elif lay["recompute"] == "selective" and lay.get("selective_ac"):
        rc += " (per-op)" if lay["selective_ac"] == "op" else f" (every {lay['selective_ac']} layers)"
    elif lay["recompute"] == "selective":
        rc += f" ({','.join(lay.get('recompute_modules') or ['core_attn'])})"
    if d.get("recompute_asked") == "auto":
        rc += " [auto]"
    stages = ""
    if lay.get("first_stage_layers") or lay.get("last_stage_layers") or lay.get("account_for_embedding") \
            or lay.get("account_for_loss") or lay.get("pipeline_layout"):
        stages = f" stages={'/'.join(str(n) for n in d.get('layers_per_rank', []))}"
    if d.get("pipeline_layout"):
        asked = lay.get("pipeline_layout")
        stages += f" layout={d['pipeline_layout']}" + (" (auto)" if str(asked).lower() == "auto" else "")
    lines = [
        f"{d['model']} on {d['gpus']} x {d['hardware']} ({d['framework']}): tp={lay['tp']} pp={lay['pp']} "
        f"dp={lay['dp']} cp={lay['cp']}{' (' + lay['cp_comm'] + ')' if lay['cp'] > 1 else ''} ep={lay['ep']} "
        f"vp={lay['vp']}{stages} sp={'on' if lay['sp'] else 'off'}"
        f"{' tp-overlap' if lay['tp_overlap'] else ''} zero={lay['zero']} recompute={rc} dtype={lay['dtype']}"
        f"{' (' + lay['fp8_recipe'] + ')' if lay['dtype'] == 'fp8' else ''} attention={lay['attention']}"
        f"{_offload_text(lay['offload_layers'])}",
        f"seq {lay['seq_len']}, micro-batch {lay['micro_batch']}, global batch {lay['global_batch']} "
        f"({d['global_batch_microbatches']} micro-batches per DP rank)",
        "",
        f"step time            {_fmt_s(d['step_time_s'])}",
        f"tokens/s             {d['tokens_per_s']:,.0f}",
        f"tokens/s/GPU         {d['tokens_per_s_per_gpu']:,.1f}",
        f"MFU (bf16 peak)      {d['mfu'] * 100:.1f}%   (6N + 12 L s d_attn per token, non-causal, no recompute, / bf16 dense peak)",
    ]
    if d.get("mfu_fp8_peak") is not None:
        lines.append(f"MFU (fp8 peak)       {d['mfu_fp8_peak'] * 100:.1f}%   (the same FLOPs / fp8 dense peak)")
    lines += [
        f"HFU                  {d['hfu'] * 100:.1f}%   (FLOPs executed: causal attention halved, + recomputed, / bf16 peak)",
        f"pipeline bubble      {d['bubble_fraction'] * 100:.1f}% of pipeline time",
        f"bottleneck           {d['bottleneck']}",
    ]
    if d.get("from_profile"):
        lines.append(f"from the profile     {_profile_values(d['from_profile'])}   (the {d['framework']} framework's "
                     f"defaults; an option given on the command line wins)")
    if d.get("extrapolation"):
        lines.append(f"extrapolation        {d['extrapolation']}")
    lines += ["", "time per step:"]
    total = d["step_time_s"]
    for k, v in d["breakdown_s"].items():
        note = " (inside compute)" if k == "recompute" else ""
        lines.append(f"  {k:<18} {_fmt_s(v):>12}  {v / total * 100:5.1f}%{note}")
    mem = d["memory_gib_per_gpu"]
    lines += ["", f"memory per GPU: {mem['total']:.1f} GiB of {mem['device']:.1f} GiB "
                  f"(fullest pipeline rank: {mem['pipeline_rank']})"]
    for k, v in mem["parts"].items():
        if k == "activations_offloaded_host":
            if v > 0:
                lines.append(f"  {'activations (host)':<18} {v:8.2f} GiB  (not on the GPU)")
            continue
        lines.append(f"  {k:<18} {v:8.2f} GiB")
    return "\n".join(lines)


@click.command()
@_train_options
@click.option("--search", is_flag=True, help="Find the fastest layout that fits (ignores the layout options).")
@click.option("--top", default=10, show_default=True, type=int, help="Alternatives shown by --search.")
@click.option("--scaling", default="weak", show_default=True, type=click.Choice(["weak", "strong"]),
              help="With a --gpus list: weak (batch grows with GPUs) or strong (fixed batch) scaling.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-o", "--output", "outdir", default=None, type=click.Path(file_okay=False),
              help="Write train.json (one layout), search.csv (--search) or scaling.csv and scaling.png "
                   "(a --gpus list) here.")
def train(search, top, scaling, fmt, outdir, **kw):
    """Step time, throughput, MFU and memory of one training layout.

    MFU counts 6N FLOPs per token (N = active parameters in matmuls, LM head included, input
    embedding excluded) plus 12 L s d_attn for attention (non-causal), without recomputation,
    against the bf16 dense peak (fp8 runs also print it against the fp8 peak); HFU counts the FLOPs
    executed (causal attention halved) plus the recomputed ones. --framework sets how the run is executed (attention kernel, gradient precision, DP
    overlap, ZeRO-3 gathers, fp8 recipe): servesim/training/data/frameworks.

    \b
    Examples:
      servesim train --model llama-3.1-8b --gpus 8 --global-batch 128 --seq-len 8192
      servesim train --model llama-3.1-70b --gpus 64 --tp 4 --pp 4 --cp 2 --vp 5 --sp --seq-len 8192 --global-batch 128
      servesim train --model llama-3.1-70b --gpus 256 --search --global-batch 512
      servesim train --model llama-3.1-8b --gpus 8,16,32,64 --tp 1 --global-batch 64 -o scaling/
      servesim train --model llama-3.1-405b --gpus 512 --tp 8 --pp 8 --vp 8 --cp 2 --sp --framework nemo --account-for-embedding --account-for-loss --seq-len 8192 --global-batch 256 --recompute auto
      servesim train --model llama-3.1-70b --hardware gb200-nvl72 --gpus 64 --zero 3 --micro-batch 2 --seq-len 8192 --global-batch 128 --dtype fp8 --offload-activations all
    """
    from ..figures import training_scaling_figure
    from ..outputs import output_dir
    from ..workflows.training import execute_train, prepare_train
    spec = prepare_train(search=search, top=top, scaling=scaling, **kw)
    model, hw = spec.model, spec.hardware
    with output_dir(outdir, "-o", "servesim train") as out:
        res = execute_train(spec)
        if out is not None and res.mode == "scaling":
            out.write(lambda d: res.table.to_csv(d / "scaling.csv", index=False))
            out.write(lambda d: training_scaling_figure(res.table, d / "scaling.png",
                                                        f"{model.name} on {hw.name}, {scaling} scaling"))
        elif out is not None and res.mode == "search":
            out.write(lambda d: res.table.to_csv(d / "search.csv", index=False))
        elif out is not None:
            out.write(lambda folder: (folder / "train.json").write_text(res.to_json() + "\n"))
    if fmt == "json":
        click.echo(res.to_json())
    elif res.mode == "scaling":
        click.echo(f"{model.name} on {hw.name}: {scaling} scaling (efficiency = tokens/s/GPU vs {spec.gpus[0]} GPUs)")
        click.echo(res.table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    else:
        click.echo(_render_result(res.summary))
        if res.mode == "search":
            from ..training.search import SEARCH_MEMORY_FRACTION
            click.echo(f"\nfastest layouts that fit in {100 * SEARCH_MEMORY_FRACTION:.0f}% of device memory "
                       "(a margin for the memory model's error and the allocator's peaks):")
            click.echo(res.table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


@click.command()
@click.option("--model", default="llama-3.1-8b", show_default=True, help="Model name or path.")
@click.option("--hardware", default="h100-sxm", show_default=True,
              help="Hardware profile, or a comma-separated list to compare side by side.")
@click.option("--train-tokens", default=15e12, show_default=True, type=float, help="Training tokens.")
@click.option("--gpus", default=1024, show_default=True, type=int, help="GPUs for training.")
@click.option("--seq-len", default=8192, show_default=True, type=int)
@click.option("--global-batch", default=1024, show_default=True, type=int, help="Sequences per step.")
@click.option("--dtype", default="bf16", show_default=True, type=click.Choice(["bf16", "fp8"]),
              help="Training precision (bf16 where the chip has no fp8).")
@click.option("--serve-tp", default=None, type=int,
              help="Serving TP [default: the cheapest of 1, 2, 4, 8 meeting the SLO, as servesim plan finds].")
@click.option("--workload", default="chat", show_default=True, help="Serving workload.")
@click.option("--rate", default=None, type=float, help="Serving request rate (req/s).")
@click.option("--slo", default="ttft_p99=1s,tpot_p99=60ms", show_default=True, type=SLO, help="Serving SLO.")
@click.option("--num-requests", default=500, show_default=True, type=int)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-o", "--output", "outdir", default=None, type=click.Path(file_okay=False),
              help="Write compare.csv and compare.png here.")
def compare(model, hardware, train_tokens, gpus, seq_len, global_batch, dtype, serve_tp, workload, rate, slo,
            num_requests, fmt, outdir):
    """Training GPU-hours and $ against serving $ per million tokens, and the break-even.

    Serving is priced on each hardware's cheapest deployment that meets --slo at --rate (servesim
    plan: TP and replicas searched, checked on a second seed); each row says which deployment.

    \b
    Examples:
      servesim compare --model llama-3.1-8b --train-tokens 15e12 --gpus 1024
      servesim compare --model llama-3.1-8b --hardware h100-sxm,a100-sxm-80gb,h200-sxm --rate 4 -o cmp/
    """
    from ..figures import training_compare_figure
    from ..outputs import output_dir
    from ..workflows.training import check_compare, compare as run
    args = dict(train_tokens=train_tokens, gpus=gpus, seq_len=seq_len, global_batch=global_batch, dtype=dtype,
                serve_tp=serve_tp, workload=workload, rate=rate, slo=slo, num_requests=num_requests)
    check_compare(model, hardware, **args)
    with output_dir(outdir, "-o", "servesim compare") as out:
        res = run(model, hardware, **args)
        df = res.rows
        if out is not None:
            out.write(lambda d: df.to_csv(d / "compare.csv", index=False))
            out.write(lambda d: training_compare_figure(df, d / "compare.png", f"{model}: {train_tokens:.3g} training tokens"))
    if fmt == "json":
        click.echo(res.to_json())
        return
    load = f"{rate:g} req/s" if rate is not None else "the workload's rate"
    click.echo(f"{model}: train on {train_tokens:.3g} tokens with {gpus} GPUs; serve {workload} at {load} "
               f"within SLO {slo}, on the cheapest deployment meeting it (servesim plan)")
    for _, r in df.iterrows():
        click.echo(f"\n{r['hardware']}  ({r['usd_per_gpu_hour']:.2f} $/GPU-h)\n"
                   f"  training   {r['train_layout']}, MFU {r['train_mfu'] * 100:.1f}%, {r['train_days']:.1f} days, "
                   f"{r['train_gpu_hours']:,.0f} GPU-h, ${r['train_usd']:,.0f}\n"
                   f"  serving    {_serving_line(r)}\n"
                   f"  break-even {_break_even(r['break_even_output_tokens'])}")


def _serving_line(r) -> str:
    """The cheapest deployment meeting the SLO on this hardware, or why there is none."""
    if not r["serve_meets_slo"]:
        return r["serve_config"]
    head = r["serve_capacity_headroom"]
    return (f"{r['serve_config']}, ${r['serve_usd_per_m_output']:.3f} per M output tokens (the cheapest "
            f"meeting the SLO" + ("" if head is None or head != head else f"; capacity headroom {100 * head:.0f}%")
            + ")")


def _break_even(v) -> str:
    return "-" if v is None or v != v else f"{v:.3g} served output tokens"


