"""`servesim calibrate` engine side: AIConfigurator-layout tables -> a fitted engine profile that loads
and simulates; the hardware-profile keys that moved to the engine profile; every bad combination of
inputs and outputs is one line."""
import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from servesim.calibrate import engine_kernels as ek
from servesim.cli import main
from servesim.config import load_hardware
from servesim.config.engine import load_engine

H100 = load_hardware("h100-sxm")
NATIVE = Path(__file__).parent / "data" / "calibrate" / "native_h100.csv"
KNOWN = {"gemm_max": 0.83, "gemm_hbm_fraction": 0.78, "gemm_latency_us": 2.4, "gemm_splitk_latency_us": 3.1,
         "gemm_tile_overhead_k": 180.0, "gemm_mem_latency_us": 1.5}
TRUE_GEMM = {k: KNOWN[k] for k in ek.GEMM_PARAMS}
TRUE_FP8 = {"gemm_fp8_max": 0.55, "gemm_fp8_latency_us": 6.0}
TRUE_PREFILL = {"attn_prefill_max": 0.58, "attn_prefill_hbm_fraction": 0.45, "attn_prefill_block_overhead": 0.8,
                "attn_prefill_latency_us": 11.0}
TRUE_DECODE = {"attn_decode_hbm_fraction": 0.9, "attn_decode_block_us": 3.0, "attn_decode_latency_us": 11.0}
TRUE_AR = {"allreduce_latency_us": 4.5, "allreduce_bw_fraction": 0.7, "allreduce_step_latency_us": 6.0,
           "allreduce_eager_launch_us": 16.0}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(r) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("servesim: error")]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    return lines[0]


def _write(frame: pd.DataFrame, folder: Path, table: str, gz: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / f"{table}.csv{'.gz' if gz else ''}", index=False)


def make_tables(folder: Path, gz=("context_attention_perf", "custom_allreduce_perf"), skip=()) -> Path:
    """One <engine>-<version> folder in AIConfigurator's columns (latency in ms), generated from the
    TRUE_* parameters with the predict functions; tables in ``gz`` written as .csv.gz, the rest as .csv."""
    shapes = [(128, 8192), (256, 4096), (1024, 1024), (4096, 4096), (8192, 1024), (5120, 12288), (14336, 4096),
              (65536, 8192), (384, 16384)]
    g = pd.DataFrame([{"m": float(m), "n": float(n), "k": float(k), "dtype": d}
                      for d in ("bf16", "fp8") for m in (1, 8, 64, 129, 256, 512, 1024, 2048, 4096, 8192)
                      for n, k in shapes])
    g["time_s"] = ek.predict_gemm(g, H100, TRUE_GEMM, TRUE_FP8)
    gemm = pd.DataFrame({"gemm_dtype": g["dtype"].map({"bf16": "bfloat16", "fp8": "fp8"}), "m": g["m"].astype(int),
                         "n": g["n"].astype(int), "k": g["k"].astype(int), "latency": g["time_s"] * 1e3})
    heads = ((8, 1), (32, 8), (64, 8), (40, 8), (16, 16))
    p = pd.DataFrame([{"seqs": float(b), "chunk": float(s), "ctx": 0.0, "heads": float(h), "kv_heads": float(kv),
                       "kv_bytes": 2.0} for b in (1, 4, 32) for s in (16, 256, 2048, 8192) for h, kv in heads])
    p["time_s"] = ek.predict_prefill(p, H100, TRUE_PREFILL)
    ctx = pd.DataFrame({"batch_size": p["seqs"].astype(int), "isl": p["chunk"].astype(int),
                        "num_heads": p["heads"].astype(int), "num_key_value_heads": p["kv_heads"].astype(int),
                        "kv_cache_dtype": "bfloat16", "latency": p["time_s"] * 1e3})
    d = pd.DataFrame([{"seqs": float(b), "step": float(t - 1), "heads": float(h), "kv_heads": float(kv), "kv_bytes": 2.0}
                      for b in (1, 16, 256, 2048) for t in (2, 128, 4096, 65536) for h, kv in heads])
    d["kv_tokens"] = d["seqs"] * (d["step"] + 1.0)
    d["time_s"] = ek.predict_decode(d, H100, TRUE_DECODE)
    gen = pd.DataFrame({"batch_size": d["seqs"].astype(int), "num_heads": d["heads"].astype(int),
                        "num_key_value_heads": d["kv_heads"].astype(int), "kv_cache_dtype": "bfloat16",
                        "step": d["step"].astype(int), "latency": d["time_s"] * 1e3})
    a = pd.DataFrame([{"n": float(n), "nbytes": 2.0 * 2 ** e, "eager": eager}
                      for n in (2, 4, 8) for e in range(7, 30, 2) for eager in (False, True)])
    a["time_s"] = ek.predict_allreduce(a, H100, TRUE_AR, TRUE_GEMM["gemm_hbm_fraction"])
    ar = pd.DataFrame({"kernel_source": a["eager"].map({False: "vLLM_custom_graph", True: "vLLM_custom_eager"}),
                       "num_gpus": a["n"].astype(int), "message_size": (a["nbytes"] / 2).astype(int),
                       "latency": a["time_s"] * 1e3})
    for table, frame in (("gemm_perf", gemm), ("context_attention_perf", ctx), ("generation_attention_perf", gen),
                         ("custom_allreduce_perf", ar)):
        if table not in skip:
            _write(frame, folder, table, table in gz)
    return folder


@pytest.fixture(scope="module")
def aic(tmp_path_factory) -> Path:
    """A <gpu>/ folder: vllm-0.99 with four tables (no moe_perf), and an sglang folder beside it."""
    root = tmp_path_factory.mktemp("aic") / "h100_sxm"
    make_tables(root / "vllm-0.99")
    make_tables(root / "sglang-0.1", skip=("context_attention_perf", "generation_attention_perf",
                                           "custom_allreduce_perf"))
    return root


def close(fit, true: dict, rel=0.03):
    for key, value in true.items():
        assert fit[key] == pytest.approx(value, rel=rel, abs=1e-3), (key, fit[key], value)


def test_aiconfigurator_fit_recovers_parameters_and_simulates(aic, tmp_path):
    out = tmp_path / "my-vllm.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--aiconfigurator", aic, "--engine", "vllm", "--engine-output", out)
    assert r.exit_code == 0, r.output
    eng = load_engine(str(out))
    assert eng.name == "my-vllm" and set(eng.fits) == set(load_engine("vllm").fits)
    raw = __import__("tomllib").loads(out.read_text())["hardware"]["h100-sxm"]
    close(raw, {**TRUE_GEMM, **TRUE_FP8, **TRUE_PREFILL, **TRUE_DECODE, **TRUE_AR})
    base = load_engine("vllm").fit_for(H100)
    fit = eng.fit_for(H100)
    for kept in ("moe_efficiency", "moe_fp8_latency_s", "moe_pair_s", "launch_s", "host_step_s", "frontend_s",
                 "graph_overlap"):
        assert getattr(fit, kept) == pytest.approx(getattr(base, kept), rel=1e-3), kept   # no table: the base value
    assert "fused MoE: no moe_perf table" in fit.fit_source and "vllm-0.99" in fit.fit_source
    rep = tmp_path / "my-vllm-fit"
    hold = pd.read_csv(rep / "holdout.csv")
    assert set(hold["kind"]) == {"GEMM bf16", "GEMM fp8", "prefill attention", "decode attention", "all-reduce"}
    assert (hold["median_rel_err"] < 0.02).all()        # noise-free rows: held-out groups predicted closely
    assert "5-fold by (n, k) shape" in set(hold["held_out"]) and "one GPU count at a time" in set(hold["held_out"])
    assert "k-fold by group" in (rep / "report.md").read_text()
    sim = run("simulate", "--engine", out, "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--isl", 256,
              "--osl", 16, "--num-requests", 20, "--offline", "--format", "json")
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.output)["config"]["engine_fit"] == "fitted on h100-sxm"


def test_engine_folder_itself_and_plain_or_gz_tables_read_alike(aic, tmp_path):
    plain = make_tables(tmp_path / "plain" / "vllm-0.99", gz=())
    zipped = make_tables(tmp_path / "gz" / "vllm-0.99", gz=ek.TABLES)
    for table in ("gemm_perf", "context_attention_perf", "generation_attention_perf", "custom_allreduce_perf"):
        assert ek.table_file(plain, table).name == f"{table}.csv"
        assert ek.table_file(zipped, table).name == f"{table}.csv.gz"
        assert ek.read_folder_table(plain, table).equals(ek.read_folder_table(zipped, table))
    assert ek.prefill_frame("h100_sxm", "vllm", folder=plain).equals(ek.prefill_frame("h100_sxm", "vllm", folder=zipped))
    out = tmp_path / "e.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--aiconfigurator", zipped, "--engine-output", out, "--no-holdout")
    assert r.exit_code == 0, r.output
    close(__import__("tomllib").loads(out.read_text())["hardware"]["h100-sxm"], TRUE_DECODE)


def test_missing_tables_keep_the_base_values(aic, tmp_path):
    # the sglang folder has gemm_perf only: attention and all-reduce keep sglang's h100-sxm values
    out = tmp_path / "my-sglang.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--aiconfigurator", aic, "--engine", "sglang", "--engine-output",
            out, "--no-holdout")
    assert r.exit_code == 0, r.output
    fit, base = load_engine(str(out)).fit_for(H100), load_engine("sglang").fit_for(H100)
    assert fit.gemm_max == pytest.approx(TRUE_GEMM["gemm_max"], rel=0.03)
    for name in ("attn_prefill_max", "attn_decode_hbm_fraction", "allreduce_bw_fraction", "moe_efficiency"):
        assert getattr(fit, name) == pytest.approx(getattr(base, name), rel=1e-3), name
    for why in ("prefill attention: no context_attention_perf table", "decode attention: no generation_attention_perf",
                "all-reduce: no custom_allreduce_perf table"):
        assert why in fit.fit_source and why in r.output


def test_constant_columns_restored_from_the_tree_index(tmp_path):
    # the shared/ copies keep one-valued columns in INDEX.csv (two levels up), not in the table
    folder = make_tables(tmp_path / "tree" / "h100_sxm" / "vllm-0.99", gz=())
    t = pd.read_csv(folder / "context_attention_perf.csv").drop(columns=["kv_cache_dtype"])
    t.to_csv(folder / "context_attention_perf.csv", index=False)
    with pytest.raises(Exception, match="kv_cache_dtype"):
        ek.prefill_frame("h100_sxm", "vllm", folder=folder)
    pd.DataFrame([{"gpu": "h100_sxm", "framework": "vllm-0.99", "table": "context_attention_perf.csv",
                   "constant_columns": "head_dim=128;kv_cache_dtype=bfloat16"}]).to_csv(tmp_path / "tree" / "INDEX.csv",
                                                                                       index=False)
    f = ek.prefill_frame("h100_sxm", "vllm", folder=folder)
    assert len(f) == len(t) and (f["kv_dtype"] == "bf16").all()


def test_both_profiles_in_one_call_key_the_engine_table_by_the_new_hardware(aic, tmp_path):
    hw_out, eng_out = tmp_path / "my-h100.toml", tmp_path / "my-vllm.toml"
    r = run("calibrate", "--profile", "h100-sxm", "--operators", NATIVE, "-o", hw_out,
            "--aiconfigurator", aic / "vllm-0.99", "--engine-output", eng_out, "--no-holdout")
    assert r.exit_code == 0, r.output
    hw = load_hardware(str(hw_out))
    eng = load_engine(str(eng_out))
    assert "my-h100" in eng.fits and eng.fit_for(hw).note == "fitted on my-h100"
    assert "native_h100.csv" in hw.efficiency.fit_source and "vllm-0.99" not in hw.efficiency.fit_source
    res = pd.read_csv(tmp_path / "my-h100-fit" / "residuals.csv")
    assert {"hardware", "engine"} == set(res["profile"])
    sim = run("simulate", "--engine", eng_out, "--hardware", hw_out, "--model", "llama-3.1-8b", "--isl", 128,
              "--osl", 8, "--num-requests", 10, "--offline")
    assert sim.exit_code == 0, sim.output


def test_bad_inputs_are_one_line(aic, tmp_path):
    out = tmp_path / "e.toml"
    empty = tmp_path / "empty"
    (empty / "vllm-0.1").mkdir(parents=True)
    (empty / "vllm-0.1" / "notes.csv").write_text("a\n1\n")
    cases = [
        (["--aiconfigurator", tmp_path / "nope", "--engine-output", out], "no such folder"),
        (["--aiconfigurator", empty, "--engine-output", out], "no AIConfigurator tables"),
        (["--aiconfigurator", aic], "--engine-output is required"),
        (["--aiconfigurator", aic, "--engine", "vllmm", "--engine-output", out], "unknown engine 'vllmm'"),
        (["--aiconfigurator", aic, "--engine", "trtllm", "--engine-output", out], "sglang-0.1, vllm-0.99"),
        (["--aiconfigurator", aic / "sglang-0.1", "--engine", "vllm", "--engine-output", out], "--engine sglang"),
        (["--aiconfigurator", aic, "--engine-output", tmp_path / "vllm.toml"], "shipped engine name"),
        (["--aiconfigurator", aic, "--engine-output", tmp_path / "e.json"], "must end in .toml"),
        (["--aiconfigurator", aic, "--engine-output", out, "-o", tmp_path / "hw.toml"], "--operators / --training"),
        (["--operators", NATIVE, "--engine-output", out, "-o", tmp_path / "hw.toml"], "--aiconfigurator / --serving"),
        (["--operators", NATIVE, "--engine", "vllm", "-o", tmp_path / "hw.toml"], "--engine vllm"),
        (["--operators", NATIVE], "-o/--output is required"),
        ([], "at least one input"),
    ]
    for args, expect in cases:
        msg = one_line_error(run("calibrate", "--profile", "h100-sxm", *args))
        assert expect in msg, (args, msg)
    assert not out.exists() and not (tmp_path / "e-fit").exists() and not (tmp_path / "hw.toml").exists()
    out.write_text("keep me")
    msg = one_line_error(run("calibrate", "--profile", "h100-sxm", "--aiconfigurator", aic, "--engine-output", out))
    assert "--force" in msg and out.read_text() == "keep me"
