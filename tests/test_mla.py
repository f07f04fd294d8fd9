"""MLA attention (DeepSeek-V2/V3): the kernel formulas against hand derivations, the step's routing of
prefill chunks, the engine keys, and the fit against AIConfigurator's measured MLA rows."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from servesim.calibrate import mla_fit
from servesim.config import load_hardware, load_model
from servesim.config.engine import MLA_FIT_KEYS, load_engine, provenance
from servesim.costmodel import Layout, lower
from servesim.costmodel.features import FULL
from servesim.costmodel.fields import table
from servesim.costmodel.iteration import attention_nb
from servesim.costmodel.kernels import MLA_HEAD_TILE, mla_decode_time_nb, mla_prefill_time_nb, prefill_attention_compute_nb
from servesim.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_decode_bandwidth_bound_by_hand():
    # 4 sequences x 8,192 cached tokens, 16 heads, DeepSeek widths: the latent (512 + 64) x 2 bytes per
    # token once, q (576) in and o (512) out per head in 16 bits; one 64-row tile per sequence
    seqs, kv, heads = 4.0, 4 * 8192.0, 16.0
    nbytes = kv * 576 * 2 + seqs * heads * 1088 * 2
    flops = kv * 2 * 64 * 1088
    peak, bw, sms, cf, hf, block, lat = 1e15, 3e12, 132.0, 0.5, 0.8, 3e-6, 10e-6
    assert flops / (peak * cf) < nbytes / (bw * hf)          # memory-bound case
    want = lat + seqs * 1 * block / sms + nbytes / (bw * hf)
    got = mla_decode_time_nb(seqs, 1.0, kv, heads, 512.0, 64.0, 2.0, peak, bw, sms, cf, hf, block, lat)
    assert got == pytest.approx(want, rel=1e-12)


def test_decode_pads_query_rows_to_the_tile():
    # compute-bound (bandwidth huge): 16 and 64 heads run one 64-row tile and cost the same tensor-core
    # time; 65 heads run two tiles and cost twice as much; a 4-token verification of 16 heads is one tile
    def compute(heads, q_rows=1.0):
        return mla_decode_time_nb(1.0, q_rows, 1e6, heads, 512.0, 64.0, 2.0, 1e15, 1e30, 132.0, 1.0, 1.0, 0.0, 0.0)
    assert MLA_HEAD_TILE == 64.0
    assert compute(16.0) == pytest.approx(compute(64.0), rel=1e-9)
    assert compute(65.0) == pytest.approx(2 * compute(64.0), rel=1e-9)
    assert compute(16.0, 4.0) == pytest.approx(compute(64.0), rel=1e-9)
    assert compute(16.0) == pytest.approx(1e6 * 2 * 64 * 1088 / 1e15, rel=1e-9)


def test_prefill_is_flash_attention_at_the_mean_head_width():
    # compute: FlashAttention's key blocks at (192 + 128) / 2; bytes: q, o, k, v per head (16-bit), the
    # latent written; with a cached prefix its decompressed k and v read
    peak, bw, sms = 1e15, 3e12, 132.0
    t = mla_prefill_time_nb(2.0, 1024.0, 512.0, 16.0, 192.0, 128.0, 1152.0, peak, bw, sms, 0.7, 0.5, 0.3, 5e-6)
    comp = prefill_attention_compute_nb(2.0, 1024.0, 512.0, 16.0, 160.0, peak, sms, 0.7, 0.3)
    width = 16 * 320 * 2.0
    nbytes = 2 * (1024 * (2 * width + 1152) + 512 * width)
    assert t == pytest.approx(5e-6 + comp + nbytes / (bw * 0.5), rel=1e-12)


def _params(engine="vllm", hw="h200-sxm", tp=8, kv_dtype="auto"):
    return lower(load_model("deepseek-v3"), load_hardware(hw), Layout(tp=tp, dtype="fp8", kv_dtype=kv_dtype),
                 load_engine(engine), max_tokens=2048)


def _decode(p, seqs, q_rows, kv):
    return mla_decode_time_nb(seqs, q_rows, kv, p.heads, 512.0, 64.0, p.kv_elem_bytes, p.attn_peak, p.hbm_bw, p.sms,
                              p.attn_dec_max, p.attn_dec_hbm, p.attn_dec_block, p.attn_dec_latency)


def test_step_prices_decodes_absorbed_and_short_chunks_as_the_faster_kernel():
    p = _params()
    assert p.mla == 1.0 and p.heads == 16.0 and p.kv_elem_bytes == 2.0
    # 32 decodes at 2,048 tokens each
    assert attention_nb(table(p), FULL.mla, 0.0, 0.0, 0.0, 0.0, 32.0, 32 * 2048.0) == pytest.approx(
        _decode(p, 32.0, 1.0, 32 * 2048.0))
    # 8 verifications of 4 tokens over 4,096 cached: the absorbed kernel, 4 query rows each
    tok, n, kv = 32.0, 8.0, 8 * (4096.0 + 4)
    a = attention_nb(table(p), FULL.mla, tok, n, 0.0, kv, 0.0, 0.0)
    pf = mla_prefill_time_nb(n, 4.0, 4096.0, 16.0, 192.0, 128.0, 1152.0, p.attn_peak, p.hbm_bw, p.sms, p.attn_pf_max,
                             p.attn_pf_hbm, p.attn_pf_block, p.attn_pf_latency)
    assert a == pytest.approx(_decode(p, n, 4.0, kv)) and a < pf
    # one 2,048-token prompt: the prefill kernel
    a = attention_nb(table(p), FULL.mla, 2048.0, 1.0, 0.0, 2048.0, 0.0, 0.0)
    pf = mla_prefill_time_nb(1.0, 2048.0, 0.0, 16.0, 192.0, 128.0, 1152.0, p.attn_peak, p.hbm_bw, p.sms, p.attn_pf_max,
                             p.attn_pf_hbm, p.attn_pf_block, p.attn_pf_latency)
    assert a == pytest.approx(pf) and a < _decode(p, 1.0, 2048.0, 2048.0)


def test_lowering_takes_the_engines_mla_keys():
    fit = load_engine("sglang").fit_for(load_hardware("h100-sxm"))
    keep = 1.0 - fit.graph_overlap
    p = _params("sglang", "h100-sxm")
    assert (p.attn_dec_max, p.attn_dec_hbm, p.attn_dec_block) == (fit.mla_decode_max, fit.mla_decode_hbm_fraction,
                                                                 fit.mla_decode_block_s)
    assert p.attn_dec_latency == pytest.approx(keep * fit.mla_decode_latency_s)
    assert (p.attn_pf_max, p.attn_pf_hbm) == (fit.mla_prefill_max, fit.mla_prefill_hbm_fraction)
    p8 = _params("sglang", "h100-sxm", kv_dtype="fp8")
    assert (p8.attn_dec_max, p8.attn_dec_hbm) == (fit.mla_decode_fp8_max, fit.mla_decode_fp8_hbm_fraction)
    # a dense model keeps the generic attention keys
    d = lower(load_model("llama-3.1-8b"), load_hardware("h100-sxm"), Layout(), load_engine("sglang"), max_tokens=512)
    assert (d.attn_dec_hbm, d.attn_pf_max) == (fit.attn_decode_hbm_fraction, fit.attn_prefill_max)


def test_every_shipped_table_has_the_mla_keys():
    for name in ("vllm", "sglang", "trtllm"):
        for hw, fit in load_engine(name).fits.items():
            assert fit.mla_decode_hbm_fraction > 0.0 and fit.mla_prefill_max > 0.0, (name, hw)


def test_mla_keys_come_together(tmp_path):
    src = (REPO / "engines" / "trtllm.toml").read_text()
    bad = src.replace("mla_decode_block_us", "# mla_decode_block_us", 1)
    path = tmp_path / "trtllm.toml"
    path.write_text(bad)
    with pytest.raises(ConfigError, match="mla_decode_block_us.*come together"):
        load_engine(str(path))


def test_a_table_without_mla_keys_prices_mla_generically_and_says_so(tmp_path):
    lines = [ln for ln in (REPO / "engines" / "trtllm.toml").read_text().splitlines()
             if not any(ln.startswith(k + " ") for k in MLA_FIT_KEYS)]
    path = tmp_path / "trtllm.toml"
    path.write_text("\n".join(lines) + "\n")
    eng = load_engine(str(path))
    hw = load_hardware("h100-sxm")
    fit = eng.fit_for(hw)
    p = lower(load_model("deepseek-v3"), hw, Layout(tp=8, dtype="fp8"), eng, max_tokens=512)
    assert (p.attn_dec_hbm, p.attn_dec_max, p.attn_pf_max) == (fit.attn_decode_hbm_fraction, fit.attn_prefill_max,
                                                             fit.attn_prefill_max)
    assert "generic attention keys" in provenance(eng, hw, mla=True)["carried"]
    assert "generic" not in provenance(eng, hw, mla=False)["carried"]


def test_shipped_rows_against_the_profile_keys():
    # measured rows (AIConfigurator, TensorRT-LLM on H100, 16-bit cache) against the profile's keys
    hw = load_hardware("h100-sxm")
    fit = load_engine("trtllm").fit_for(hw)
    keys = {k: getattr(fit, k.replace("_us", "_s")) * (1e6 if k.endswith("_us") else 1.0) for k in MLA_FIT_KEYS}
    for frame, predict, limit in ((mla_fit.decode_frame("h100_sxm", "trtllm"), mla_fit.predict_decode, 0.08),
                                  (mla_fit.prefill_frame("h100_sxm", "trtllm"), mla_fit.predict_prefill, 0.08)):
        f = frame[frame["kv_dtype"] == "bf16"]
        err = predict(f, hw, keys) / f["time_s"].to_numpy() - 1.0
        assert np.median(np.abs(err)) < limit
        assert abs(np.median(err)) < 0.03


def test_eager_floor_is_a_max():
    f = mla_fit.decode_frame("h100_sxm", "vllm").head(3)
    hw = load_hardware("h100-sxm")
    p = {"mla_decode_max": 0.6, "mla_decode_hbm_fraction": 0.8, "mla_decode_block_us": 3.0, "mla_decode_latency_us": 10.0}
    raw = mla_fit.predict_decode(f, hw, p)
    assert np.all(mla_fit.predict_decode(f, hw, {**p, "eager_floor_us": 1e4}) == 1e-2)
    assert np.all(mla_fit.predict_decode(f, hw, {**p, "eager_floor_us": 0.0}) == raw)


def test_unknown_source_is_refused():
    with pytest.raises(ConfigError, match="no MLA tables shipped for b200_sxm/vllm"):
        mla_fit.decode_frame("b200_sxm", "vllm")


@pytest.mark.slow
def test_fit_mla_script_held_out_errors():
    out = subprocess.run([sys.executable, "experiments/fit_mla.py", "--no-write"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("Hopper (H100, H200)"))
    held = [float(x.rstrip("%")) for x in line.replace(",", "").replace(";", "").split()
            if x.endswith("%")]
    # decode before / held out, prefill before / held out
    assert len(held) == 4 and held[1] < 10.0 and held[3] < 15.0
    assert held[0] > 2 * held[1] and held[2] > 2 * held[3]       # the previous roofline was further off

