"""MBU from the bytes each step actually reads (issue #25, item 4): the weights of the experts the
batch touches (not only the active parameters), the KV cache, activations; the same bytes the cost
model prices, so a run's MBU never exceeds 1."""
from __future__ import annotations

import json

import pytest

import servesim
from servesim.config import load_hardware, load_model
from servesim.costmodel import Batch, Layout, build_replica
from test_config_model import QWEN3_30B_A3B

H100 = load_hardware("h100-sxm")


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "qwen3-30b-a3b.json"
    path.write_text(json.dumps(QWEN3_30B_A3B))
    return str(path)


def _kv_bytes(m, tokens: float) -> float:
    """K and V of every layer, 16-bit: 2 x kv_heads x head_dim x 2 bytes per token per layer."""
    return m.num_layers * 2 * m.num_kv_heads * m.head_dim * 2.0 * tokens


def test_moe_decode_reads_the_experts_the_batch_touches(qwen3_moe):
    m = load_model(qwen3_moe)
    rc = build_replica(m, H100, Layout(tp=1, dtype="bf16"))
    batch, ctx = 53, 1024
    got = rc.iteration(Batch(decode=(ctx,) * batch)).bytes
    E, k = m.moe.num_experts, m.moe.experts_per_token
    touched = E * (1 - (1 - k / E) ** batch)           # occupancy of E bins by 53 x 8 picks (Feller IV)
    assert 121 < touched < 125                          # the "~122 of 128"
    per_layer = m.attn_params_per_layer() + m.norm_params_per_layer() + m.router_params() \
        + touched * m.expert_params()
    weights = m.num_layers * per_layer + m.final_norm_params() + m.vocab_size * m.hidden_size   # LM head
    want = 2.0 * weights + _kv_bytes(m, batch * ctx)
    assert got == pytest.approx(want, rel=0.03)
    assert got > 5 * 2.0 * m.active_param_count()      # what MBU used to count: active parameters only
    one = rc.iteration(Batch(decode=(ctx,))).bytes     # one token: its top-8 experts only
    want_one = 2.0 * (m.num_layers * (per_layer - (touched - k) * m.expert_params())
                      + m.final_norm_params() + m.vocab_size * m.hidden_size) + _kv_bytes(m, ctx)
    assert one == pytest.approx(want_one, rel=0.03)


def test_dense_decode_reads_every_weight_once():
    m = load_model("llama-3.1-8b")
    rc = build_replica(m, H100, Layout(tp=2, dtype="bf16"))
    got = rc.iteration(Batch(decode=(2048,))).bytes
    want = 2.0 * (m.param_count() - m.embedding_params()) + _kv_bytes(m, 2048)   # the LM head is read, the table not
    assert got == pytest.approx(want, rel=0.02)


def test_mbu_is_physical_and_counts_the_experts(qwen3_moe):
    dense = servesim.simulate(num_requests=300, seed=0).summary["utilization"]["mbu"]
    moe = servesim.simulate(model=qwen3_moe, concurrency=53, isl=256, osl=512, num_requests=400,
                            seed=0).summary["utilization"]
    assert 0 < dense <= 1 and 0 < moe["mbu"] <= 1
    assert moe["mean_batch_size"] > 40
    assert moe["mbu"] > 0.3     # ~122 experts x 48 layers a step; active parameters alone gave ~0.12
