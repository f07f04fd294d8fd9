"""Model architectures: shipped TOMLs, parameter counts against published totals and hand
arithmetic, HuggingFace config.json parsing, and errors that name the file and key."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from servesim.config import ModelConfig, list_models, load_model
from servesim.errors import ConfigError
from servesim.paths import models_dir

HF_DIR = Path(__file__).parent / "data" / "hf"

SHIPPED = ["deepseek-v3", "gpt3-175b", "llama-2-70b", "llama-2-7b", "llama-3.1-405b",
           "llama-3.1-70b", "llama-3.1-8b", "llama-3.3-70b", "mixtral-8x22b", "mixtral-8x7b",
           "qwen2.5-72b", "qwen2.5-7b"]

# Published totals in billions (sources cited in each TOML): HF safetensors counts for Llama,
# Mixtral 8x22B; Mistral AI for Mixtral 8x7B; Qwen model cards; DeepSeek-V3 report (main model,
# no MTP); GPT-3 Table 2.1.
PUBLISHED_B = {"llama-2-7b": 6.74, "llama-2-70b": 68.98, "llama-3.1-8b": 8.03,
               "llama-3.1-70b": 70.6, "llama-3.1-405b": 405.9, "llama-3.3-70b": 70.6,
               "mixtral-8x7b": 46.7, "mixtral-8x22b": 140.6, "qwen2.5-7b": 7.61,
               "qwen2.5-72b": 72.7, "deepseek-v3": 671.0, "gpt3-175b": 175.0}


def test_list_models_is_exactly_the_shipped_set():
    assert list_models() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_param_count_matches_published_within_1_percent(name):
    m = load_model(name)
    assert isinstance(m, ModelConfig)
    assert m.name == name == m.path.stem
    assert m.published_params == pytest.approx(PUBLISHED_B[name] * 1e9)
    assert m.param_count() == pytest.approx(m.published_params, rel=0.01)


@pytest.mark.parametrize("name", SHIPPED)
def test_structure_is_consistent(name):
    m = load_model(name)
    assert m.num_moe_layers + m.num_dense_layers == m.num_layers
    assert m.active_param_count() <= m.param_count()
    if m.moe is None:
        assert m.active_param_count() == m.param_count() and m.num_moe_layers == 0
    assert m.q_dim > 0 and m.kv_dim > 0


def test_moe_active_counts_match_published():
    # Mixtral: "12.9B active" (mistral.ai/news/mixtral-of-experts); 8x22B: "39B active"
    # (mistral.ai/news/mixtral-8x22b); DeepSeek-V3: "37B activated" (arXiv:2412.19437).
    assert load_model("mixtral-8x7b").active_param_count() == pytest.approx(12.9e9, rel=0.01)
    assert load_model("mixtral-8x22b").active_param_count() == pytest.approx(39e9, rel=0.01)
    assert load_model("deepseek-v3").active_param_count() == pytest.approx(37e9, rel=0.02)


def test_deepseek_v3_layer_split_and_mla_shapes():
    m = load_model("deepseek-v3")
    assert [m.is_moe_layer(i) for i in range(4)] == [False, False, False, True]
    assert m.num_dense_layers == 3 and m.num_moe_layers == 58
    assert m.q_dim == 128 * 192
    assert m.kv_dim == 512 + 64 and m.kv_cache_width == 576  # latent + shared RoPE key
    # HF README: 685B = 671B main + 14B MTP; main model counted here.
    assert m.param_count() < 680e9


def test_gqa_shapes():
    m = load_model("llama-3.1-70b")
    assert m.q_dim == 8192 and m.kv_dim == 1024 and m.kv_cache_width == 2048


def test_gpt3_matches_kaplan_approximation():
    # Kaplan et al. 2020 (arXiv:2001.08361) Eq. 2.1: non-embedding N ~= 12 n_layer d_model^2.
    m = load_model("gpt3-175b")
    non_embedding = m.param_count() - m.embedding_params() - m.lm_head_params()
    assert non_embedding == pytest.approx(12 * 96 * 12288**2, rel=0.001)
    assert m.lm_head_params() == 0  # tied


# -- hand-derived tiny models ------------------------------------------------------------------

TINY_DENSE = """
name = "{name}"
source = "test"
published_params_b = 0
num_layers = 2
hidden_size = 8
num_attention_heads = 2
num_kv_heads = 1
head_dim = 4
ffn_hidden_size = 16
activation = "silu"
gated_mlp = true
vocab_size = 10
tied_embeddings = false
max_context = 32
rope_theta = 10000.0
position_embedding = "rope"
norm = "rmsnorm"
linear_bias = false
qkv_bias = false
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text.replace("{name}", name))
    return path


def test_tiny_dense_gqa_by_hand(tmp_path):
    m = load_model(str(_write(tmp_path, "tiny-dense", TINY_DENSE)))
    # attention: W_q 8x8 = 64, W_k 8x4 = 32, W_v 8x4 = 32, W_o 8x8 = 64        -> 192
    assert m.attn_params_per_layer() == 192
    # gated MLP: 3 x 8 x 16                                                    -> 384
    assert m.dense_mlp_params() == 384
    # two RMSNorm gains of 8                                                   -> 16
    assert m.norm_params_per_layer() == 16
    # embedding 10x8 = 80, untied head 80, final norm 8
    assert (m.embedding_params(), m.lm_head_params(), m.final_norm_params()) == (80, 80, 8)
    # total: 2 x (192 + 384 + 16) + 80 + 80 + 8 = 1352
    assert m.param_count() == 1352
    assert m.active_param_count() == 1352
    assert m.q_dim == 8 and m.kv_dim == 4 and m.published_params == 0.0


def test_tiny_gpt_style_by_hand(tmp_path):
    text = (TINY_DENSE.replace("num_layers = 2", "num_layers = 1")
            .replace("hidden_size = 8", "hidden_size = 4")
            .replace("num_kv_heads = 1", "num_kv_heads = 2")
            .replace("head_dim = 4", "head_dim = 2")
            .replace('activation = "silu"', 'activation = "gelu"')
            .replace("gated_mlp = true", "gated_mlp = false")
            .replace("tied_embeddings = false", "tied_embeddings = true")
            .replace("max_context = 32", "max_context = 6")
            .replace("rope_theta = 10000.0", "rope_theta = 0.0")
            .replace('position_embedding = "rope"', 'position_embedding = "learned"')
            .replace('norm = "rmsnorm"', 'norm = "layernorm"')
            .replace("linear_bias = false", "linear_bias = true"))
    m = load_model(str(_write(tmp_path, "tiny-gpt", text)))
    # attention: 4 matrices 4x4 = 64; biases q, k, v 4 each = 12, o 4        -> 80
    assert m.attn_params_per_layer() == 80
    # plain MLP: 2 x 4 x 16 = 128; biases 16 + 4                             -> 148
    assert m.dense_mlp_params() == 148
    # two LayerNorms, gain + bias: 2 x 2 x 4                                 -> 16
    assert m.norm_params_per_layer() == 16
    # token embedding 10x4 = 40 + learned positions 6x4 = 24; tied head 0; final LN 8
    assert (m.embedding_params(), m.lm_head_params(), m.final_norm_params()) == (64, 0, 8)
    # total: 80 + 148 + 16 + 64 + 0 + 8 = 316
    assert m.param_count() == 316


TINY_MOE_MLA = TINY_DENSE.replace("num_layers = 2", "num_layers = 4").replace(
    "num_kv_heads = 1", "num_kv_heads = 2").replace("head_dim = 4", "head_dim = 6") + """
[moe]
num_experts = 4
experts_per_token = 2
num_shared_experts = 1
expert_ffn_hidden_size = 4
shared_expert_ffn_hidden_size = 4
first_moe_layer = 1
moe_layer_freq = 2

[mla]
kv_lora_rank = 3
q_lora_rank = 5
qk_rope_head_dim = 2
qk_nope_head_dim = 4
v_head_dim = 3
"""


def test_tiny_moe_mla_by_hand(tmp_path):
    m = load_model(str(_write(tmp_path, "tiny-moe", TINY_MOE_MLA)))
    # MoE iff i >= 1 and i % 2 == 0: only layer 2 of 0..3
    assert [m.is_moe_layer(i) for i in range(4)] == [False, False, True, False]
    assert (m.num_dense_layers, m.num_moe_layers) == (3, 1)
    # MLA: q_a 8x5 = 40, q_a_norm 5, q_b 5 x 2 x (4+2) = 60                   -> 105
    #      kv_a 8 x (3+2) = 40, kv_a_norm 3, kv_b 3 x 2 x (4+3) = 42          -> 85
    #      o 2 x 3 x 8 = 48                                                    -> 238 in all
    assert m.attn_params_per_layer() == 238
    assert m.q_dim == 12 and m.kv_dim == 5 and m.kv_cache_width == 5
    # dense MLP 3 x 8 x 16 = 384; routed expert 3 x 8 x 4 = 96; one shared 96; router 4 x 8 = 32
    assert (m.dense_mlp_params(), m.expert_params(), m.shared_expert_params(), m.router_params()) == (
        384, 96, 96, 32)
    # per layer attention + norms = 238 + 16 = 254, x 4 = 1016
    # FFN: 3 dense x 384 = 1152; MoE layer 4 x 96 + 96 + 32 = 512; embed 80 + head 80 + norm 8 = 168
    assert m.param_count() == 1016 + 1152 + 512 + 168 == 2848
    # active: MoE layer counts 2 x 96 + 96 + 32 = 320
    assert m.active_param_count() == 1016 + 1152 + 320 + 168 == 2656


def test_mla_without_q_compression(tmp_path):
    m = load_model(str(_write(tmp_path, "tiny-noq", TINY_MOE_MLA.replace("q_lora_rank = 5", "q_lora_rank = 0"))))
    # q_proj 8 x 2 x 6 = 96 replaces 105; 96 + 85 + 48 = 229
    assert m.attn_params_per_layer() == 229


# -- HuggingFace config.json -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "qwen2.5-7b", "deepseek-v3"])
def test_hf_config_matches_shipped_toml(name):
    hf = load_model(str(HF_DIR / name / "config.json"))
    shipped = load_model(name)
    assert hf.name == name  # parent folder name
    assert hf.published_params == 0.0
    assert hf.param_count() == shipped.param_count()
    assert hf.active_param_count() == shipped.active_param_count()
    for field in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                  "ffn_hidden_size", "activation", "gated_mlp", "vocab_size", "tied_embeddings",
                  "max_context", "rope_theta", "position_embedding", "norm", "linear_bias",
                  "qkv_bias", "moe", "mla"):
        assert getattr(hf, field) == getattr(shipped, field), field


def test_hf_family_specifics():
    llama = load_model(str(HF_DIR / "llama-3.1-8b" / "config.json"))
    assert llama.num_kv_heads == 8 and llama.head_dim == 128 and llama.rope_theta == 500000.0
    assert llama.moe is None and not llama.qkv_bias
    mixtral = load_model(str(HF_DIR / "mixtral-8x7b"))  # a folder holding config.json
    assert mixtral.moe.num_experts == 8 and mixtral.moe.experts_per_token == 2
    assert mixtral.moe.expert_ffn_hidden_size == 14336 and mixtral.num_moe_layers == 32
    qwen = load_model(str(HF_DIR / "qwen2.5-7b" / "config.json"))
    assert qwen.qkv_bias and not qwen.linear_bias
    ds = load_model(str(HF_DIR / "deepseek-v3" / "config.json"))
    assert ds.mla.kv_lora_rank == 512 and ds.mla.q_lora_rank == 1536
    assert ds.moe.first_moe_layer == 3 and ds.moe.num_shared_experts == 1
    assert ds.moe.shared_expert_ffn_hidden_size == 2048 and ds.head_dim == 192


def _hf_variant(tmp_path: Path, name: str, filename: str = "config.json", drop=(), **changes) -> Path:
    data = json.loads((HF_DIR / name / "config.json").read_text())
    for key in drop:
        del data[key]
    data.update(changes)
    folder = tmp_path / f"v-{name}"
    folder.mkdir(exist_ok=True)
    path = folder / filename
    path.write_text(json.dumps(data))
    return path


def test_hf_defaults_and_stem_naming(tmp_path):
    # No head_dim, num_key_value_heads, rope_theta or tie_word_embeddings: transformers defaults.
    path = _hf_variant(tmp_path, "llama-3.1-8b", filename="my-llama.json",
                       drop=("num_key_value_heads", "rope_theta", "tie_word_embeddings"))
    m = load_model(str(path))
    assert m.name == "my-llama"
    assert m.num_kv_heads == 32 and m.head_dim == 128 and m.rope_theta == 10000.0
    assert not m.tied_embeddings


def test_hf_null_q_lora_rank_means_no_compression(tmp_path):
    m = load_model(str(_hf_variant(tmp_path, "deepseek-v3", q_lora_rank=None)))
    assert m.mla.q_lora_rank == 0


def test_hf_unsupported_model_type(tmp_path):
    path = _hf_variant(tmp_path, "llama-3.1-8b", model_type="gpt_neox")
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    msg = str(info.value)
    assert "config.json" in msg and "key 'model_type'" in msg and "'gpt_neox'" in msg and "'llama'" in msg


def test_hf_missing_key(tmp_path):
    path = _hf_variant(tmp_path, "mixtral-8x7b", drop=("num_local_experts",))
    with pytest.raises(ConfigError, match=r"config\.json: key 'num_local_experts' is missing; "
                                          r"it is required for model_type 'mixtral'"):
        load_model(str(path))
    path = _hf_variant(tmp_path, "qwen2.5-7b", drop=("hidden_size",))
    with pytest.raises(ConfigError, match="key 'hidden_size' is missing"):
        load_model(str(path))


def test_hf_bad_value_and_bad_json(tmp_path):
    path = _hf_variant(tmp_path, "llama-3.1-8b", num_hidden_layers="32")
    with pytest.raises(ConfigError, match="key 'num_hidden_layers' must be an integer"):
        load_model(str(path))
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json: not valid JSON"):
        load_model(str(bad))


# -- TOML errors -------------------------------------------------------------------------------

LLAMA_TEXT = (models_dir() / "llama-3.1-8b.toml").read_text()


def _toml_variant(tmp_path: Path, stem: str, text: str = LLAMA_TEXT, rename=True, **set_) -> Path:
    if rename:
        text = re.sub(r'^name = ".*"$', f'name = "{stem}"', text, count=1, flags=re.M)
    for key, value in set_.items():
        text = re.sub(rf"^{key}\s*=.*$", f"{key} = {value}", text, flags=re.M)
    path = tmp_path / f"{stem}.toml"
    path.write_text(text)
    return path


def _model_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_model(str(path))
    msg = str(info.value)
    assert path.name in msg, msg
    return msg


def test_toml_copy_loads(tmp_path):
    m = load_model(str(_toml_variant(tmp_path, "ok-copy")))
    assert m.param_count() == load_model("llama-3.1-8b").param_count()


def test_toml_unknown_key(tmp_path):
    path = _toml_variant(tmp_path, "bad-unknown")
    path.write_text(path.read_text().replace("vocab_size =", "vocab_sise = 1\nvocab_size ="))
    assert "key 'vocab_sise' is not a known key; did you mean 'vocab_size'?" in _model_error(path)


def test_toml_missing_key(tmp_path):
    path = _toml_variant(tmp_path, "bad-missing")
    path.write_text(re.sub(r"^qkv_bias.*\n", "", path.read_text(), flags=re.M))
    assert "key 'qkv_bias' is missing" in _model_error(path)


def test_toml_bad_values(tmp_path):
    assert "key 'num_layers' must be >= 1, got 0" in _model_error(
        _toml_variant(tmp_path, "bad-layers", num_layers="0"))
    assert "key 'activation' must be one of" in _model_error(
        _toml_variant(tmp_path, "bad-act", activation='"swish"'))
    assert "key 'gated_mlp' must be true or false" in _model_error(
        _toml_variant(tmp_path, "bad-bool", gated_mlp='"yes"'))
    assert "key 'num_kv_heads' must divide num_attention_heads (32), got 5" in _model_error(
        _toml_variant(tmp_path, "bad-gqa", num_kv_heads="5"))
    assert "key 'name' must equal the file stem 'bad-name'" in _model_error(
        _toml_variant(tmp_path, "bad-name", rename=False))


def test_toml_bad_moe(tmp_path):
    text = (models_dir() / "mixtral-8x7b.toml").read_text()
    assert "key 'moe.experts_per_token' must be <= moe.num_experts (8), got 9" in _model_error(
        _toml_variant(tmp_path, "bad-topk", text=text, experts_per_token="9"))
    assert "key 'moe.shared_expert_ffn_hidden_size' must be > 0 exactly when" in _model_error(
        _toml_variant(tmp_path, "bad-shared", text=text, num_shared_experts="1"))
    assert "key 'moe.first_moe_layer' must be < num_layers (32), got 32" in _model_error(
        _toml_variant(tmp_path, "bad-first", text=text, first_moe_layer="32"))


def test_toml_mla_head_dim_must_match(tmp_path):
    text = (models_dir() / "deepseek-v3.toml").read_text()
    assert "key 'head_dim' must equal mla.qk_nope_head_dim + mla.qk_rope_head_dim (192)" in _model_error(
        _toml_variant(tmp_path, "bad-mla", text=text, head_dim="128"))


def test_unknown_model_name():
    with pytest.raises(ConfigError, match=r"unknown model 'foo'; available: deepseek-v3, .*; "
                                          r"or pass a path to a \.toml or HF config\.json"):
        load_model("foo")
    with pytest.raises(ConfigError, match="not found"):
        load_model("/nonexistent/model.toml")


def test_loads_are_cached():
    assert load_model("llama-3.1-8b") is load_model("llama-3.1-8b")
    assert load_model("llama-3.1-8b") is load_model(str(models_dir() / "llama-3.1-8b.toml"))
