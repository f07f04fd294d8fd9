"""Calibration against Vidur per-operator timings: readers, fits on synthetic data, input errors, and a
guard that the shipped profiles stay calibrated on the shipped data."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from servesim.calibrate import vidur_dir
from servesim.calibrate.operators import (GEMM_OPS, elementwise_frame, error_summary, layer_sums, fit_collectives, fit_gemm,
                                          predict_collectives, predict_elementwise, predict_gemm,
                                          read_vidur_mlp, read_vidur_network, relative_errors)
from servesim.config import load_hardware
from servesim.costmodel.collectives import AUTO, allreduce_time_nb, p2p_time_nb
from servesim.costmodel.roofline import gemm_time_nb
from servesim.errors import ConfigError

COMPUTE = vidur_dir() / "profiling" / "compute"
NETWORK = vidur_dir() / "profiling" / "network"
LLAMA2_7B_A100 = COMPUTE / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
GPUS = {"a100-sxm-80gb": "a100", "h100-sxm": "h100"}


@pytest.fixture(scope="module")
def a100():
    return load_hardware("a100-sxm-80gb")


# -- readers ------------------------------------------------------------------------------------

def test_shipped_copy_has_licence_readme_and_stays_small():
    assert "MIT" in (vidur_dir() / "LICENSE").read_text()
    assert "Vidur" in (vidur_dir() / "README.md").read_text()
    total = sum(p.stat().st_size for p in vidur_dir().rglob("*") if p.is_file())
    assert total < 10e6
    assert not list(COMPUTE.glob("a40")) and not list(NETWORK.glob("a40*"))


def test_read_vidur_mlp_shapes_and_units():
    df = read_vidur_mlp(LLAMA2_7B_A100)
    assert set(df["gpu"]) == {"a100"} and set(df["model"]) == {"meta-llama/Llama-2-7b-hf"}
    assert set(GEMM_OPS) <= set(df["op"])
    # Row 0 of the file: num_tokens 4096, TP 1, attn_pre_proj median 1.911 ms.
    qkv = df[(df["op"] == "attn_pre_proj") & (df["row"] == 0)].iloc[0]
    assert (qkv["m"], qkv["k"], qkv["n"]) == (4096, 4096, 3 * 4096)
    assert qkv["time_s"] == pytest.approx(1.911e-3)
    up = df[(df["op"] == "mlp_up_proj") & (df["tp"] == 8)].iloc[0]
    assert (up["k"], up["n"]) == (4096, 2 * 11008 / 8)  # gated: gate + up, column-parallel
    down = df[(df["op"] == "mlp_down_proj") & (df["tp"] == 8)].iloc[0]
    assert (down["k"], down["n"]) == (11008 / 8, 4096)  # row-parallel
    assert df["m"][df["op"] == "add"].isna().all()


def test_read_vidur_mlp_gqa_shape():
    df = read_vidur_mlp(COMPUTE / "a100" / "meta-llama" / "Llama-2-70b-hf" / "mlp.csv")
    qkv = df[(df["op"] == "attn_pre_proj") & (df["tp"] == 8)].iloc[0]
    assert qkv["n"] == (64 + 2 * 8) * 128 / 8  # 64 query heads, 8 KV heads, head_dim 128


def test_elementwise_frame_sums_six_kernels():
    df = read_vidur_mlp(LLAMA2_7B_A100)
    el = elementwise_frame(df)
    assert set(el["op"]) == {"input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add"}
    layer = layer_sums(el)
    assert len(layer) == df["row"].nunique()
    row0 = layer[layer["row"] == 0].iloc[0]
    # 0.105 (input norm) + 0.104 (post-attention norm) + 0.149 (rope) + 0.266 (act) + 2 * 0.055 (add), ms
    assert row0["time_s"] == pytest.approx((0.105 + 0.104 + 0.149 + 0.266 + 2 * 0.055) * 1e-3)
    phi = layer_sums(elementwise_frame(read_vidur_mlp(COMPUTE / "a100" / "microsoft" / "phi-2" / "mlp.csv")))
    assert len(phi) > 0 and phi["time_s"].notna().all()  # no post_attention_layernorm column: input norm counted twice


def test_read_vidur_network():
    df = read_vidur_network(NETWORK / "h100_dgx" / "all_reduce.csv")
    assert set(df["system"]) == {"h100_dgx"} and set(df["collective"]) == {"all_reduce"}
    assert sorted(df["num_workers"].unique()) == [2, 4, 8]
    assert df["intra_node"].all()
    assert (df["nbytes"] == df["size"]).all()  # size read as bytes by default
    assert df["time_s"].iloc[0] == pytest.approx(0.037e-3)
    two = read_vidur_network(NETWORK / "h100_dgx" / "all_reduce.csv", bytes_per_size=2.0)
    assert (two["nbytes"] == 2 * two["size"]).all()
    sr = read_vidur_network(NETWORK / "a100_dgx" / "send_recv.csv")
    assert set(sr["collective"]) == {"send_recv"} and (~sr["intra_node"]).any()


# -- bad input ----------------------------------------------------------------------------------

def test_missing_column_names_file_and_column(tmp_path):
    raw = pd.read_csv(LLAMA2_7B_A100).drop(columns=["time_stats.mlp_up_proj.median"])
    path = tmp_path / "mlp.csv"
    raw.to_csv(path, index=False)
    with pytest.raises(ConfigError, match=r"mlp\.csv.*time_stats\.mlp_up_proj\.median"):
        read_vidur_mlp(path)


def test_network_missing_column(tmp_path):
    raw = pd.read_csv(NETWORK / "a100_dgx" / "all_reduce.csv").drop(columns=["num_workers"])
    path = tmp_path / "all_reduce.csv"
    raw.to_csv(path, index=False)
    with pytest.raises(ConfigError, match=r"all_reduce\.csv.*num_workers"):
        read_vidur_network(path)


def test_missing_file_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_vidur_mlp(tmp_path / "nope.csv")


def test_too_few_rows(a100):
    df = read_vidur_mlp(LLAMA2_7B_A100)
    few = df[df["op"] == "attn_pre_proj"].head(5)  # 4 parameters need >= 6 rows
    with pytest.raises(ConfigError, match="5 usable row"):
        fit_gemm(few, a100)
    net = read_vidur_network(NETWORK / "a100_dgx" / "all_reduce.csv").head(3)
    with pytest.raises(ConfigError, match="3 usable row"):
        fit_collectives(net, a100)


# -- fits on synthetic data ---------------------------------------------------------------------

def _synthetic_gemm(hw, gemm_max, half, latency_s, hbm):
    rows = []
    for m in np.unique(np.geomspace(1, 8192, 40).round()):
        for k, n in ((4096, 12288), (4096, 4096), (8192, 3584), (1376, 4096), (8192, 28672)):
            t = gemm_time_nb(m, k, n, 2.0, 2.0, hw.peak_flops["fp16"], hw.hbm_bw, gemm_max, half, hbm, latency_s)
            rows.append({"op_class": "gemm_qkv", "m": m, "k": float(k), "n": float(n), "time_s": t})
    return pd.DataFrame(rows)


def test_fit_gemm_recovers_known_parameters(a100):
    frame = _synthetic_gemm(a100, 0.7, 50.0, 5e-6, 0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no bound warning expected
        fit = fit_gemm(frame, a100)
    assert fit["gemm_max"] == pytest.approx(0.7, rel=0.02)
    assert fit["gemm_half_tokens"] == pytest.approx(50.0, rel=0.03)
    assert fit["kernel_latency_us"] == pytest.approx(5.0, rel=0.03)
    assert fit["hbm_fraction"] == pytest.approx(0.8, rel=0.02)
    pred = predict_gemm(frame, a100, fit)
    assert np.max(np.abs(relative_errors(pred, frame["time_s"]))) < 0.01


def test_fit_gemm_warns_at_bound(a100):
    frame = _synthetic_gemm(a100, 1.0, 50.0, 5e-6, 0.8)
    frame["time_s"] *= np.where(frame["m"] > 1000, 0.9, 1.0)  # faster than the peak allows
    with pytest.warns(UserWarning, match="gemm_max .* upper bound"):
        fit_gemm(frame, a100)


def test_fit_collectives_recovers_known_parameters(a100):
    bw, alpha, base = a100.scaleup_bw * 0.8, 6e-6, 20e-6
    rows = []
    for n in (2, 4, 8):
        for s in np.geomspace(2e3, 6.7e7, 30):
            rows.append({"collective": "all_reduce", "nbytes": s, "num_workers": n,
                         "time_s": base + allreduce_time_nb(s, n, bw, alpha, AUTO)})
    step = a100.efficiency.p2p_large_message_bytes
    p2p_bw, p2p_large_bw, p2p_alpha = a100.scaleup_bw * 0.9, a100.scaleup_bw * 0.7, 12e-6
    for s in np.geomspace(2e3, 1.3e8, 20):
        rows.append({"collective": "send_recv", "nbytes": s, "num_workers": 2,
                     "time_s": p2p_time_nb(s, p2p_bw, p2p_alpha, p2p_large_bw, step)})
    frame = pd.DataFrame(rows)
    fit = fit_collectives(frame, a100)
    assert fit["scaleup_bw_fraction"] == pytest.approx(0.8, rel=0.02)
    assert fit["scaleup_latency_us"] == pytest.approx(6.0, rel=0.03)
    assert fit["collective_base_latency_us"] == pytest.approx(20.0, rel=0.03)
    assert fit["p2p_bw_fraction"] == pytest.approx(0.9, rel=0.02)
    assert fit["p2p_large_bw_fraction"] == pytest.approx(0.7, rel=0.02)
    assert fit["p2p_latency_us"] == pytest.approx(12.0, rel=0.03)
    assert np.max(np.abs(relative_errors(predict_collectives(frame, a100, fit), frame["time_s"]))) < 0.01
    # send-recv rows all below the step say nothing of the rate above it: that one is not fitted
    small = frame[(frame["collective"] == "send_recv") & (frame["nbytes"] <= step)]
    assert set(fit_collectives(small, a100)) == {"p2p_bw_fraction", "p2p_latency_us"}


def test_send_recv_steps_to_the_large_message_rate(a100):
    e = a100.efficiency
    step = e.p2p_large_message_bytes
    frame = pd.DataFrame({"collective": "send_recv", "nbytes": [step, step + 1.0], "num_workers": 2})
    below, above = predict_collectives(frame, a100)
    assert below == pytest.approx(e.p2p_latency_s + step / (a100.scaleup_bw * e.p2p_bw_fraction))
    assert above == pytest.approx(e.p2p_latency_s + (step + 1.0) / (a100.scaleup_bw * e.p2p_large_bw_fraction))


def test_error_summary():
    df = pd.DataFrame({"g": ["a", "a", "a", "b"], "pred_s": [1.1, 0.9, 1.0, 2.0], "time_s": [1.0, 1.0, 1.0, 1.0]})
    s = error_summary(df, ["g"]).set_index("g")
    assert s.loc["a", "n"] == 3 and s.loc["b", "n"] == 1
    assert s.loc["a", "median_rel_err"] == pytest.approx(0.1)
    assert s.loc["b", "median_rel_err"] == pytest.approx(1.0)
    assert s.loc["a", "p90_rel_err"] == pytest.approx(0.1)


# -- the shipped calibration stays valid ---------------------------------------------------------

@pytest.mark.parametrize("profile,gpu", sorted(GPUS.items()))
def test_shipped_profiles_fit_held_out_gemms(profile, gpu):
    hw = load_hardware(profile)
    assert "fit_costmodel.py" in hw.efficiency.fit_source
    files = [f for f in sorted((COMPUTE / gpu).glob("*/*/mlp.csv")) if f.parent.parent.name != "meta-llama"]
    assert len(files) == 4  # Qwen-72B, CodeLlama-34b, internlm-20b, phi-2
    df = pd.concat([read_vidur_mlp(f) for f in files], ignore_index=True)
    gemm = df[df["op_class"].str.startswith("gemm_")].copy()
    gemm["pred_s"] = predict_gemm(gemm, hw)
    summary = error_summary(gemm, ["op_class"]).set_index("op_class")
    assert set(summary.index) == set(GEMM_OPS.values())
    assert (summary["median_rel_err"] < 0.15).all(), summary
    el = elementwise_frame(df)
    assert np.isfinite(predict_elementwise(el, hw)).all()


@pytest.mark.parametrize("profile,gpu", sorted(GPUS.items()))
def test_shipped_profiles_fit_dgx_all_reduce(profile, gpu):
    hw = load_hardware(profile)
    net = read_vidur_network(NETWORK / f"{gpu}_dgx" / "all_reduce.csv")
    net = net[net["intra_node"]].copy()
    net["pred_s"] = predict_collectives(net, hw)
    assert error_summary(net, ["collective"])["median_rel_err"].iloc[0] < 0.25


def test_predict_collectives_routes_groups_beyond_the_domain_over_pcie(a100):
    import dataclasses
    pairs = dataclasses.replace(a100, scaleup_domain=2, gpus_per_node=4)
    e = a100.efficiency
    frame = pd.DataFrame({"collective": ["all_reduce", "all_reduce", "send_recv"], "nbytes": [8e6, 8e6, 8e6],
                          "num_workers": [2, 4, 2]})
    got = predict_collectives(frame, pairs)
    base = e.collective_base_latency_s
    assert got[0] == pytest.approx(allreduce_time_nb(8e6, 2, a100.scaleup_bw * e.scaleup_bw_fraction,
                                                     e.scaleup_latency_s, AUTO) + base)
    assert got[1] == pytest.approx(allreduce_time_nb(8e6, 4, a100.pcie_bw * e.pcie_bw_fraction,
                                                     e.pcie_latency_s, AUTO) + base)
    assert got[2] == pytest.approx(e.p2p_latency_s + 8e6 / (a100.scaleup_bw * e.p2p_bw_fraction))
    assert got[1] > 3 * got[0]  # PCIe Gen4 (32 GB/s) against NVLink (300 GB/s)
