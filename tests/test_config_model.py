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
                  "qkv_bias", "moe", "mla", "qk_norm", "qk_norm_gain", "checkpoint_dtype"):
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


# -- shipped HF configs of deployed models (workloads/models/hf) -------------------------------

from servesim.config.model import hf_models_dir, list_hf_models  # noqa: E402

SCOUT = "llama-4-scout-17b-16e-instruct-fp8-dynamic"
HF_SHIPPED = ["codellama-34b-hf", "llama-2-7b-hf", "llama-3.1-70b-instruct", SCOUT,
              "mistral-nemo-instruct-2407", "qwen2.5-7b-instruct", "qwen3-14b", "yi-34b"]

# Published totals in billions, from the HuggingFace model cards / safetensors parameter counts:
# meta-llama/Llama-2-7b-hf (6.74B), meta-llama/Llama-3.1-70B-Instruct (70.6B),
# mistralai/Mistral-Nemo-Instruct-2407 (12.2B), Qwen/Qwen2.5-7B-Instruct ("Number of Parameters:
# 7.61B"), 01-ai/Yi-34B (34.4B), codellama/CodeLlama-34b-hf (33.7B), Qwen/Qwen3-14B ("Number of
# Parameters: 14.8B"). Llama-4-Scout is checked separately (its 109B includes the vision encoder).
HF_PUBLISHED_B = {"llama-2-7b-hf": 6.74, "llama-3.1-70b-instruct": 70.6,
                  "mistral-nemo-instruct-2407": 12.2, "qwen2.5-7b-instruct": 7.61, "yi-34b": 34.4,
                  "codellama-34b-hf": 33.7, "qwen3-14b": 14.8}


def test_list_hf_models_is_exactly_the_shipped_set():
    assert list_hf_models() == HF_SHIPPED
    assert not set(HF_SHIPPED) & set(list_models())  # no clash with a shipped TOML
    folder = hf_models_dir()
    assert (folder / "LICENSE-configs").is_file() and (folder / "README.md").is_file()


@pytest.mark.parametrize("name", HF_SHIPPED)
def test_shipped_hf_config_loads_by_name(name):
    m = load_model(name)
    assert m.name == name and m.path == (hf_models_dir() / f"{name}.json").resolve()
    assert m.source == f"workloads/models/hf/{name}.json" and m.published_params == 0.0
    assert m is load_model(str(hf_models_dir() / f"{name}.json"))
    assert m.num_moe_layers + m.num_dense_layers == m.num_layers
    assert m.active_param_count() <= m.param_count()


@pytest.mark.parametrize("name", sorted(HF_PUBLISHED_B))
def test_shipped_hf_param_count_matches_published_within_1_percent(name):
    assert load_model(name).param_count() == pytest.approx(HF_PUBLISHED_B[name] * 1e9, rel=0.01)


def test_shipped_toml_wins_over_hf_config_of_the_same_name(tmp_path, monkeypatch):
    import servesim.config.model as model_mod
    models = tmp_path / "models"
    (models / "hf").mkdir(parents=True)
    (models / "llama-3.1-8b.toml").write_text(LLAMA_TEXT)
    (models / "hf" / "llama-3.1-8b.json").write_text((HF_DIR / "llama-3.1-8b" / "config.json").read_text())
    (models / "hf" / "only-hf.json").write_text((HF_DIR / "qwen2.5-7b" / "config.json").read_text())
    monkeypatch.setattr(model_mod, "models_dir", lambda: models)
    assert load_model("llama-3.1-8b").path.suffix == ".toml"
    assert load_model("only-hf").path.suffix == ".json" and load_model("only-hf").qkv_bias


def test_q_dim_differs_from_hidden():
    # Mistral-Nemo: hidden 5120, 32 heads x head_dim 128 = 4096; W_q 5120x4096, W_o 4096x5120.
    nemo = load_model("mistral-nemo-instruct-2407")
    assert (nemo.hidden_size, nemo.q_dim, nemo.kv_dim) == (5120, 4096, 1024)
    assert nemo.attn_params_per_layer() == 2 * 5120 * 4096 + 2 * 5120 * 1024
    assert nemo.checkpoint_dtype == "bf16" and not nemo.qk_norm
    code = load_model("codellama-34b-hf")
    assert (code.num_layers, code.hidden_size, code.num_kv_heads, code.ffn_hidden_size) == (48, 8192, 8, 22016)
    assert (code.vocab_size, code.rope_theta) == (32000, 1e6)


def test_q_dim_not_hidden_in_lowered_gemm_shapes():
    # QKV GEMM: k = hidden, n = (heads + 2 kv heads) x head_dim / TP; output GEMM: k = heads x
    # head_dim / TP, n = hidden. Mistral-Nemo at TP=2: 16 q + 4 kv heads of 128 per GPU.
    from servesim.config import load_hardware
    from servesim.costmodel import Layout, build_replica
    p = build_replica(load_model("mistral-nemo-instruct-2407"), load_hardware("h100-sxm"), Layout(tp=2)).params
    assert list(p.attn_k) == [5120, 16 * 128] and list(p.attn_n) == [(16 + 2 * 4) * 128, 5120]
    assert p.q_bytes_tok_layer == 2 * 2 * 16 * 128


# -- Qwen3: q/k norms ---------------------------------------------------------------------------

def test_qwen3_14b_shapes_and_qk_norm_params(tmp_path):
    m = load_model("qwen3-14b")
    assert (m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (5120, 40, 8, 128)
    assert m.qk_norm and m.qk_norm_gain and not m.qkv_bias and m.moe is None
    assert m.checkpoint_dtype == "bf16"
    # the same shapes as a llama config: no q/k norms, 2 x head_dim fewer parameters per layer
    data = json.loads((hf_models_dir() / "qwen3-14b.json").read_text())
    data["model_type"] = "llama"
    path = tmp_path / "as-llama.json"
    path.write_text(json.dumps(data))
    plain = load_model(str(path))
    assert not plain.qk_norm and plain.head_dim == 128
    assert m.attn_params_per_layer() - plain.attn_params_per_layer() == 2 * 128
    assert m.param_count() - plain.param_count() == 40 * 2 * 128
    # Qwen3-14B model card: "Number of Parameters (Non-Embedding): 13.2B"
    assert m.param_count() - m.embedding_params() - m.lm_head_params() == pytest.approx(13.2e9, rel=0.01)


def test_qwen3_default_head_dim_is_128(tmp_path):
    data = json.loads((hf_models_dir() / "qwen3-14b.json").read_text())
    del data["head_dim"]  # Qwen3Config default head_dim = 128, not hidden / heads
    data["num_attention_heads"] = 64
    path = tmp_path / "qwen3-nohd.json"
    path.write_text(json.dumps(data))
    assert load_model(str(path)).head_dim == 128


def test_qk_norm_adds_two_norm_kernels_hand_derived():
    from servesim.costmodel import elementwise as el
    # Qwen3-14B at TP=2: 20 q heads and 4 kv heads of 128 per GPU; each norm reads and writes its
    # 16-bit input once: q 4 x 20 x 128 = 10240 bytes, k 4 x 4 x 128 = 2048 bytes per token.
    k = el.layer_kernels(5120, (20 + 4) * 128, 17408 / 2, True, (), (20 * 128, 4 * 128))
    assert [kind for kind, _ in k] == ["norm", "norm", "norm", "norm", "rope", "activation", "stream", "stream"]
    assert [b for _, b in k][2:4] == [10240, 2048]
    assert sum(b for _, b in k) - sum(b for _, b in el.layer_kernels(5120, 24 * 128, 8704, True)) == 12288


def test_qk_norm_in_lowering(tmp_path):
    from servesim.config import load_hardware
    from servesim.costmodel import Layout, build_replica
    hw = load_hardware("h100-sxm")
    data = json.loads((hf_models_dir() / "qwen3-14b.json").read_text())
    data["model_type"] = "llama"
    path = tmp_path / "qwen3-as-llama.json"
    path.write_text(json.dumps(data))
    qk = build_replica(load_model("qwen3-14b"), hw, Layout(tp=2)).params
    plain = build_replica(load_model(str(path)), hw, Layout(tp=2)).params
    assert qk.elem_kernels == plain.elem_kernels + 2
    # 12288 bytes per token per layer (above) at the norms' achieved bandwidth
    extra = 12288 / (hw.hbm_bw * hw.efficiency.norm_hbm_fraction)
    assert qk.elem_s_tok_layer - plain.elem_s_tok_layer == pytest.approx(extra)
    assert list(qk.attn_k) == list(plain.attn_k) and list(qk.attn_n) == list(plain.attn_n)


QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B config.json (architecture keys)
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 151936}


def _json(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_qwen3_moe_counts_and_layer_set(tmp_path):
    m = load_model(str(_json(tmp_path, "qwen3-30b-a3b", QWEN3_30B_A3B)))
    assert m.qk_norm and m.qk_norm_gain and m.num_moe_layers == 48 and m.moe.moe_layers == ()
    assert m.moe.num_shared_experts == 0 and m.moe.expert_ffn_hidden_size == 768
    # Qwen3-30B-A3B model card: "Number of Parameters: 30.5B in total and 3.3B activated"
    assert m.param_count() == pytest.approx(30.5e9, rel=0.01)
    assert m.active_param_count() == pytest.approx(3.3e9, rel=0.02)
    # HF Qwen3MoeDecoderLayer: MoE iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    m = load_model(str(_json(tmp_path, "sparse2", dict(QWEN3_30B_A3B, decoder_sparse_step=2,
                                                         mlp_only_layers=[3, 1]))))
    assert m.moe.moe_layers == tuple(range(5, 48, 2))
    assert [m.is_moe_layer(i) for i in range(6)] == [False, False, False, False, False, True]
    assert m.num_moe_layers == 22 and m.dense_mlp_params() == 3 * 2048 * 6144
    assert load_model(str(_json(tmp_path, "no-experts", dict(QWEN3_30B_A3B, num_experts=0)))).moe is None


# -- Llama-4-Scout ------------------------------------------------------------------------------

def _llama4_vision_params(v: dict, text_hidden: int) -> int:
    """Vision encoder + adapter + projector of Llama4ForConditionalGeneration, which the text
    model ignores (HF modeling_llama4: Llama4VisionModel, Llama4VisionPixelShuffleMLP,
    Llama4MultiModalProjector)."""
    h, f = v["hidden_size"], v["intermediate_size"]
    positions = (v["image_size"] // v["patch_size"]) ** 2 + 1  # patches + class token
    embed = v["num_channels"] * v["patch_size"] ** 2 * h + h + positions * h  # unfold conv, class, positions
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h  # q,k,v,o + fc1, fc2 (biased), 2 LayerNorms
    pre_post = 2 * 2 * h  # layernorm_pre, layernorm_post
    adapter = f * v["projector_input_dim"] + v["projector_output_dim"] ** 2  # fc1, fc2 without bias
    projector = v["vision_output_dim"] * text_hidden
    return embed + v["num_hidden_layers"] * layer + pre_post + adapter + projector


def test_llama4_scout_counts_match_published():
    m = load_model(SCOUT)
    data = json.loads(m.path.read_text())
    vision = _llama4_vision_params(data["vision_config"], m.hidden_size)
    assert 0.8e9 < vision < 0.95e9
    # meta-llama/Llama-4-Scout-17B-16E-Instruct model card: 17B active, 109B total parameters
    # (text + vision); the text model alone, which is all servesim models, is 1.1% short of that.
    assert m.param_count() + vision == pytest.approx(109e9, rel=0.01)
    assert 0.98 * 109e9 < m.param_count() < 109e9
    assert m.active_param_count() == pytest.approx(17e9, rel=0.02)  # "17B" is rounded


def test_llama4_scout_structure():
    m = load_model(SCOUT)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (48, 5120, 40, 8, 128)
    assert m.vocab_size == 202048 and m.rope_theta == 500000.0 and not m.tied_embeddings
    # interleave_moe_layer_step = 1: moe_layers = range(0, 48, 1), every layer MoE
    assert m.num_moe_layers == 48 and m.moe.moe_layers == ()
    assert (m.moe.num_experts, m.moe.experts_per_token) == (16, 1)
    # one shared expert of width intermediate_size on every MoE layer; dense width intermediate_size_mlp
    assert (m.moe.num_shared_experts, m.moe.shared_expert_ffn_hidden_size, m.moe.expert_ffn_hidden_size) == (1, 8192, 8192)
    assert m.shared_expert_params() == m.expert_params() == 3 * 5120 * 8192
    assert m.router_params() == 16 * 5120 and m.ffn_hidden_size == 16384
    # active MoE layer: top-1 routed + shared + router
    assert m.ffn_params_of_layer(0, active=True) == 2 * 3 * 5120 * 8192 + 16 * 5120
    # L2 qk norm without weights: costed, no parameters
    assert m.qk_norm and not m.qk_norm_gain
    assert m.attn_params_per_layer() == 2 * 5120 * 5120 + 2 * 5120 * 1024


def _scout_variant(tmp_path: Path, name: str, top=None, **text) -> Path:
    data = json.loads((hf_models_dir() / f"{SCOUT}.json").read_text())
    for key, value in text.items():
        if value is None:
            data["text_config"].pop(key, None)
        else:
            data["text_config"][key] = value
    data.update(top or {})
    return _json(tmp_path, name, data)


def test_llama4_moe_layer_sets(tmp_path):
    # interleave_moe_layer_step = 2 (as Llama-4-Maverick): moe_layers = range(1, 48, 2), odd layers,
    # which first_moe_layer + moe_layer_freq cannot express: an explicit list.
    m = load_model(str(_scout_variant(tmp_path, "step2", interleave_moe_layer_step=2)))
    assert m.moe.moe_layers == tuple(range(1, 48, 2))
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert (m.num_dense_layers, m.num_moe_layers) == (24, 24)
    scout = load_model(SCOUT)
    dense_minus_moe = 3 * 5120 * 16384 - (17 * 3 * 5120 * 8192 + 16 * 5120)
    assert m.param_count() - scout.param_count() == 24 * dense_minus_moe
    # an explicit moe_layers list wins over the step
    m = load_model(str(_scout_variant(tmp_path, "explicit", moe_layers=[0, 5], interleave_moe_layer_step=2)))
    assert m.moe.moe_layers == (0, 5) and m.num_moe_layers == 2
    # a rule-shaped list is stored as the rule
    m = load_model(str(_scout_variant(tmp_path, "every2", moe_layers=list(range(0, 48, 2)))))
    assert m.moe.moe_layers == () and (m.moe.first_moe_layer, m.moe.moe_layer_freq) == (0, 2)
    assert m.num_moe_layers == 24
    assert load_model(str(_scout_variant(tmp_path, "dense", moe_layers=[]))).moe is None
    assert not load_model(str(_scout_variant(tmp_path, "noqk", use_qk_norm=False))).qk_norm


def test_llama4_errors(tmp_path):
    path = _scout_variant(tmp_path, "no-mlp", intermediate_size_mlp=None)
    msg = _model_error(path)
    assert "key 'text_config.intermediate_size_mlp' is missing; it is required for model_type 'llama4'" in msg
    data = json.loads((hf_models_dir() / f"{SCOUT}.json").read_text())
    del data["text_config"]
    assert "key 'text_config' must be an object" in _model_error(_json(tmp_path, "no-text", data))
    assert "key 'text_config.moe_layers' must hold indices < num_layers (48), got [0, 48]" in _model_error(
        _scout_variant(tmp_path, "bad-layers", moe_layers=[0, 48]))
    assert "key 'text_config.moe_layers' must be ascending without repeats" in _model_error(
        _scout_variant(tmp_path, "unsorted", moe_layers=[5, 0]))


# -- checkpoint dtype ---------------------------------------------------------------------------

def test_checkpoint_dtype_of_shipped_configs():
    assert load_model(SCOUT).checkpoint_dtype == "fp8"  # compressed-tensors, float 8-bit weights
    assert load_model("qwen3-14b").checkpoint_dtype == "bf16"  # torch_dtype bfloat16
    assert load_model("llama-2-7b-hf").checkpoint_dtype == "fp16"  # torch_dtype float16
    assert all(load_model(n).checkpoint_dtype == "bf16" for n in list_models())  # TOML default


def _dtype_of(tmp_path: Path, name: str, drop=(), **top) -> str:
    data = json.loads((hf_models_dir() / "qwen3-14b.json").read_text())
    for key in drop:
        del data[key]
    data.update(top)
    return load_model(str(_json(tmp_path, name, data))).checkpoint_dtype


def test_checkpoint_dtype_from_hf_keys(tmp_path):
    assert _dtype_of(tmp_path, "f32", torch_dtype="float32") == "bf16"
    assert _dtype_of(tmp_path, "none", drop=("torch_dtype",)) == "bf16"
    assert _dtype_of(tmp_path, "new-key", drop=("torch_dtype",), dtype="float16") == "fp16"
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    assert _dtype_of(tmp_path, "fp8", quantization_config=fp8) == "fp8"
    assert _dtype_of(tmp_path, "awq", quantization_config={"quant_method": "awq", "bits": 4}) == "int4"
    assert _dtype_of(tmp_path, "gptq", quantization_config={"quant_method": "gptq"}) == "int4"
    assert _dtype_of(tmp_path, "gptq8", quantization_config={"quant_method": "gptq", "bits": 8}) == "int8"
    w4 = {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "int"}, "targets": ["Linear"]}}}
    assert _dtype_of(tmp_path, "w4a16", quantization_config=w4) == "int4"
    w8 = {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "int"}}, "group_1": {"weights": None}}}
    assert _dtype_of(tmp_path, "w8a8", quantization_config=w8) == "int8"


def test_checkpoint_dtype_errors(tmp_path):
    msg = _model_error(_json(tmp_path, "bnb", dict(json.loads((hf_models_dir() / "qwen3-14b.json").read_text()),
                                                   quantization_config={"quant_method": "bitsandbytes"})))
    assert "key 'quantization_config.quant_method' must be one of 'compressed-tensors', 'fp8'" in msg
    assert "got 'bitsandbytes'" in msg and "\n" not in msg
    data = json.loads((hf_models_dir() / "qwen3-14b.json").read_text())
    assert "key 'torch_dtype' must be one of 'bfloat16', 'float16', 'float32', got 'float64'" in _model_error(
        _json(tmp_path, "f64", dict(data, torch_dtype="float64")))
    w2 = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 2, "type": "int"}}}}
    assert "key 'quantization_config.config_groups.g.weights.num_bits' 2 with type 'int' is not" in _model_error(
        _json(tmp_path, "w2", dict(data, quantization_config=w2)))


def test_toml_optional_keys(tmp_path):
    m = load_model(str(_toml_variant(tmp_path, "ok-opt", text=LLAMA_TEXT + 'checkpoint_dtype = "fp8"\nqk_norm = true\n')))
    assert m.checkpoint_dtype == "fp8" and m.qk_norm and m.qk_norm_gain  # gain defaults to qk_norm
    assert m.param_count() - load_model("llama-3.1-8b").param_count() == 32 * 2 * 128
    m = load_model(str(_toml_variant(tmp_path, "ok-l2", text=LLAMA_TEXT + "qk_norm = true\nqk_norm_gain = false\n")))
    assert m.qk_norm and not m.qk_norm_gain and m.param_count() == load_model("llama-3.1-8b").param_count()
    assert "key 'checkpoint_dtype' must be one of 'bf16', 'fp16', 'fp8', 'int8', 'int4', 'fp4', got 'fp32'" in \
        _model_error(_toml_variant(tmp_path, "bad-ckpt", text=LLAMA_TEXT + 'checkpoint_dtype = "fp32"\n'))
    assert "key 'qk_norm_gain' = true needs qk_norm = true" in _model_error(
        _toml_variant(tmp_path, "bad-gain", text=LLAMA_TEXT + "qk_norm_gain = true\n"))
    text = (models_dir() / "deepseek-v3.toml").read_text()
    text = text.replace("[moe]", "qk_norm = true\n\n[moe]", 1)
    assert "key 'qk_norm' = true is not supported with MLA" in _model_error(
        _toml_variant(tmp_path, "bad-mla-qk", text=text))


def test_toml_explicit_moe_layers(tmp_path):
    text = TINY_MOE_MLA.replace("first_moe_layer = 1\nmoe_layer_freq = 2", "moe_layers = [1, 3]")
    m = load_model(str(_write(tmp_path, "tiny-list", text)))
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert m.moe.moe_layers == (1, 3) and m.moe.first_moe_layer == 1
    # two MoE layers of 512 instead of one, one dense layer of 384 fewer (test_tiny_moe_mla_by_hand)
    assert m.param_count() == 2848 + 512 - 384
    both = TINY_MOE_MLA.replace("moe_layer_freq = 2", "moe_layer_freq = 2\nmoe_layers = [1]")
    assert "key 'moe.first_moe_layer' is not a known key" in _model_error(_write(tmp_path, "tiny-both", both))
    bad = TINY_MOE_MLA.replace("first_moe_layer = 1\nmoe_layer_freq = 2", "moe_layers = [1, 4]")
    assert "key 'moe.moe_layers' must hold indices < num_layers (4), got [1, 4]" in _model_error(
        _write(tmp_path, "tiny-bad", bad))


def test_hf_unsupported_model_type_lists_new_families(tmp_path):
    msg = _model_error(_hf_variant(tmp_path, "llama-3.1-8b", model_type="gemma3"))
    assert "key 'model_type' must be one of" in msg and "got 'gemma3'" in msg and "\n" not in msg
    for family in ("'llama'", "'qwen3'", "'qwen3_moe'", "'llama4'", "'deepseek_v3'"):
        assert family in msg


def test_unknown_model_name_lists_hf_configs():
    with pytest.raises(ConfigError, match=r"unknown model 'foo'; available: .*; HF configs: codellama-34b-hf, "
                                          r".*qwen3-14b, yi-34b; or pass a path"):
        load_model("foo")


@pytest.mark.parametrize("name", HF_SHIPPED)
def test_shipped_hf_config_is_priced(name):
    from servesim.config import load_hardware
    from servesim.costmodel import Batch, Layout, build_replica
    m = load_model(name)
    layout = Layout(tp=4 if m.param_count() > 30e9 else 1, dtype="fp8" if m.checkpoint_dtype == "fp8" else "bf16")
    rc = build_replica(m, load_hardware("h100-sxm"), layout)
    b = rc.iteration(Batch(prefill=((512, 0),), decode=(1024,) * 8))
    assert b.time_s > 0 and rc.memory.kv_capacity_tokens > 0


def test_profiles_list_marks_hf_configs():
    from click.testing import CliRunner
    from servesim.cli import main
    out = CliRunner().invoke(main, ["profiles", "list", "--format", "json"], catch_exceptions=False).output
    models = {m["name"]: m for m in json.loads(out)["models"]}
    assert models["qwen3-14b"]["config"] == "hf" and models["llama-3.1-8b"]["config"] == "toml"
    assert 107 < models[SCOUT]["params_b"] < 109
    table = CliRunner().invoke(main, ["profiles", "list"], catch_exceptions=False).output
    assert any(line.split()[0] == SCOUT and line.split()[-1] == "hf" for line in table.splitlines() if line.strip())
    shown = CliRunner().invoke(main, ["profiles", "show", "qwen3-14b", "--format", "json"], catch_exceptions=False)
    assert json.loads(shown.output)["qk_norm"] is True
