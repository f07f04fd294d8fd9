"""`cost`: one engine iteration priced by the cost model, as ``servesim cost``."""
from __future__ import annotations

from ..errors import ConfigError
from .results import CostResult

INT32_MAX = 2**31 - 1
STEP_MAX = 2**20   # one engine step: at most this many tokens or sequences


def cost(model="llama-3.1-8b", hardware="h100-sxm", *, tp=1, pp=1, dtype="bf16", kv_dtype="auto", allreduce="auto",
         prefill_tokens=0, prefill_seqs=1, cached=0, decode_seqs=0, context=1024, engine="vllm",
         max_num_seqs=256, ep=1, attn_dp=1, expert_skew=None, speculative=None) -> CostResult:
    """Time of one engine iteration, per operator class, with memory per GPU.

    Parameters
    ----------
    model, hardware : str
        A model name or ``.toml`` / HF ``config.json`` path; a hardware profile name or path.
    tp, pp : int
        Tensor- and pipeline-parallel degrees.
    dtype, kv_dtype : str
        Weight dtype (bf16, fp16, fp8, int8, int4, fp4) and KV-cache dtype (auto: 16-bit).
    allreduce : {"auto", "ring", "tree"}
        All-reduce algorithm of TP.
    prefill_tokens, prefill_seqs, cached : int
        Prefill tokens in the batch, the sequences they are split over, tokens already cached per
        prefill sequence.
    decode_seqs, context : int
        Decoding sequences and the context length of each.
    engine : str
        Engine profile: vllm, sglang, trtllm or a ``.toml`` path.
    max_num_seqs : int
        Sets the engine's largest captured CUDA-graph batch.
    ep, attn_dp, expert_skew
        Expert parallelism, data-parallel attention ranks (the batch split evenly over them) and the
        routing model of a MoE model (``servesim/costmodel/ep.py``); the summary's ``moe`` block says
        where the MoE time goes.
    speculative : str
        ``METHOD:k=K[:acceptance=A]...`` (``servesim/costmodel/speculative.py``): the summary's
        ``speculative`` block prices one step of the decodes (draft, verification, expected tokens).

    Returns
    -------
    CostResult
        ``summary`` (iteration and pipeline-interval time, parts, bounds, bottleneck, FLOPs, bytes,
        memory, tokens/s) and ``breakdown`` (one row per operator class).

    Examples
    --------
    >>> import servesim
    >>> res = servesim.cost(decode_seqs=64, context=2048)
    >>> res.summary["bottleneck"]
    'attention (memory)'
    >>> res.breakdown[["part", "bound"]].head(2).values.tolist()
    [['gemm', 'memory'], ['attention', 'decode: memory']]
    """
    import pandas as pd
    from ..checks import check_choice, check_int
    from ..config import load_hardware, load_model
    from ..config.engine import load_engine
    from ..costmodel import Batch, Layout, build_replica
    check_int(tp, "--tp")
    check_int(pp, "--pp")
    check_int(prefill_tokens, "--prefill-tokens", ge=0, le=STEP_MAX)
    check_int(prefill_seqs, "--prefill-seqs", ge=1, le=STEP_MAX)
    check_int(cached, "--cached", ge=0, le=INT32_MAX)
    check_int(decode_seqs, "--decode-seqs", ge=0, le=STEP_MAX)
    check_int(context, "--context", ge=0, le=INT32_MAX)
    check_int(max_num_seqs, "--max-num-seqs", ge=1, le=STEP_MAX)
    check_choice(allreduce, "--allreduce", ("auto", "ring", "tree"))
    check_int(ep, "--ep", ge=1, le=STEP_MAX)
    check_int(attn_dp, "--attn-dp", ge=1, le=STEP_MAX)
    if expert_skew is not None:
        from ..checks import check_float
        check_float(expert_skew, "--expert-skew", ge=0.0)
    from ..costmodel.speculative import parse_speculative
    spec = parse_speculative(speculative)
    if spec is not None and decode_seqs == 0:
        raise ConfigError("--speculative prices decode steps: give --decode-seqs N")
    if prefill_tokens == 0 and decode_seqs == 0:
        raise ConfigError("empty batch: give --prefill-tokens N and/or --decode-seqs N")
    m, h, eng = load_model(model), load_hardware(hardware), load_engine(engine)
    longest = cached + -(-prefill_tokens // prefill_seqs)
    for what, n in ((f"--context {context:,}", context), (f"--cached {cached:,} + a prefill chunk of "
                                                          f"{longest - cached:,} tokens", longest)):
        if n > m.max_context:
            raise ConfigError(f"{what} exceeds {m.name}'s context of {m.max_context:,} tokens (max_context); "
                              "use a shorter context or more --prefill-seqs")
    layout = Layout(tp=tp, pp=pp, dtype=dtype, kv_dtype=kv_dtype, allreduce=allreduce, ep=ep, attn_dp=attn_dp,
                    expert_skew=expert_skew)
    rc = build_replica(m, h, layout, max_tokens=max(prefill_tokens + decode_seqs, 1), max_seqs=max_num_seqs,
                       engine=eng)
    chunks = []
    if prefill_tokens:
        base, extra = divmod(prefill_tokens, prefill_seqs)
        chunks = [(base + (1 if i < extra else 0), cached) for i in range(prefill_seqs) if base + (i < extra) > 0]
    b = rc.iteration(Batch(prefill=tuple(chunks), decode=tuple([context] * decode_seqs)))
    d = {"model": m.name, "hardware": h.name, "engine": eng.name, "engine_fit": eng.fit_for(h).note,
         "tp": tp, "pp": pp, "dtype": dtype,
         "prefill_tokens": prefill_tokens, "prefill_seqs": len(chunks), "decode_seqs": decode_seqs,
         "context": context, **b.as_dict(), "memory": rc.memory.as_dict()}
    d["tokens_per_s"] = (prefill_tokens + decode_seqs) / b.interval_s if b.interval_s > 0 else 0.0
    d["num_gpus"] = layout.gpus
    if m.moe is not None:
        from ..costmodel import ep as ep_model
        from ..costmodel.features import features
        from ..costmodel.fields import table
        from ..costmodel.iteration import moe_parts_nb
        t = table(rc.params)
        experts, a2a = moe_parts_nb(t, features(t).ep, float(prefill_tokens), float(len(chunks)), float(decode_seqs))
        d["moe"] = {"ep": ep, "attn_dp": attn_dp,
                    "expert_skew": (None if ep == 1 else expert_skew if expert_skew is not None
                                    else ep_model.default_skew(m)),
                    "experts_ms": experts * 1e3, "alltoall_ms": a2a * 1e3,
                    "alltoall_fit": h.alltoall_source or "not fitted: the profile's collective figures"}
    if spec is not None:
        from ..costmodel.speculative import price_step
        sp = price_step(rc, spec, decode_seqs, context)
        d["speculative"] = {k: (v * 1e3 if k.endswith("_s") else v) for k, v in sp.items()}
        d["speculative"] = {(k[:-2] + "_ms" if k.endswith("_s") else k): v for k, v in d["speculative"].items()}
    rows = []
    for part, t in b.parts_s.items():
        bound = b.bound.get(part, "")
        if part == "attention":
            bound = ", ".join(f"{k.split('_')[1]}: {v}" for k, v in b.bound.items() if k.startswith("attention"))
        rows.append({"part": part, "time_ms": t * 1e3, "share": t / b.time_s if b.time_s > 0 else 0.0,
                     "bound": bound})
    return CostResult(d, pd.DataFrame(rows, columns=["part", "time_ms", "share", "bound"]))
