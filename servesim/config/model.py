"""Model architectures: ``workloads/models/<name>.toml`` or a HuggingFace ``config.json`` ->
validated, frozen dataclasses, with parameter counts derived from the shapes.

Parameter counting follows the module structure of the HuggingFace ``transformers``
implementations (``modeling_llama.py``, ``modeling_mixtral.py``, ``modeling_qwen2.py``,
``modeling_qwen3.py``, ``modeling_qwen3_moe.py``, ``modeling_llama4.py``, ``modeling_deepseek_v3.py``)
and, for GPT-3, Brown et al. 2020 ("Language Models are Few-Shot
Learners", arXiv:2005.14165, Table 2.1; architecture as GPT-2: Radford et al. 2019) — every
formula below names what it counts. Counts are in parameters (not bytes).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.config._toml import Table, did_you_mean, display_path, read_json, read_toml
from servesim.errors import ConfigError
from servesim.paths import models_dir

ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
POSITION_EMBEDDINGS = ("rope", "learned")
NORMS = ("rmsnorm", "layernorm")
HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "llama4", "deepseek_v3")
# Weight formats of a checkpoint (the names of servesim.costmodel.dtypes.WEIGHT_DTYPES).
CHECKPOINT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")

_TOP_KEYS = ("name", "source", "published_params_b", "num_layers", "hidden_size",
             "num_attention_heads", "num_kv_heads", "head_dim", "ffn_hidden_size", "activation",
             "gated_mlp", "vocab_size", "tied_embeddings", "max_context", "rope_theta",
             "position_embedding", "norm", "linear_bias", "qkv_bias")
_TOP_OPTIONAL = ("qk_norm", "qk_norm_gain", "checkpoint_dtype", "moe", "mla")
_MOE_KEYS = ("num_experts", "experts_per_token", "num_shared_experts", "expert_ffn_hidden_size",
             "shared_expert_ffn_hidden_size")
_MOE_LAYER_RULE = ("first_moe_layer", "moe_layer_freq")  # or an explicit list: moe_layers
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts FFN (Mixtral: Jiang et al. 2024; DeepSeekMoE: Dai et al. 2024)."""

    num_experts: int  # routed experts per MoE layer
    experts_per_token: int  # top-k routed experts per token
    num_shared_experts: int  # always-active experts (DeepSeek), 0 for Mixtral
    expert_ffn_hidden_size: int  # FFN width of one routed expert
    shared_expert_ffn_hidden_size: int  # FFN width of one shared expert (0 when none)
    first_moe_layer: int  # layers [0, first_moe_layer) are dense (DeepSeek first_k_dense_replace)
    moe_layer_freq: int  # layer i >= first_moe_layer is MoE when i % moe_layer_freq == 0
    # Explicit MoE layer indices, ascending (HF Llama4TextConfig.moe_layers, Qwen3-MoE's
    # decoder_sparse_step / mlp_only_layers); when given, first_moe_layer is its first entry,
    # moe_layer_freq is 1 and both are unused.
    moe_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1; DeepSeek-V3)."""

    kv_lora_rank: int  # d_c, width of the compressed KV latent c_t^KV
    q_lora_rank: int  # d_c', width of the compressed query latent; 0 = no query compression
    qk_rope_head_dim: int  # d_h^R, decoupled RoPE part of each query/key head
    qk_nope_head_dim: int  # d_h, non-RoPE part of each query/key head
    v_head_dim: int  # value head width


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer's shapes; parameter counts are derived, never stored."""

    name: str
    source: str
    published_params: float  # published total parameter count (0.0 = unknown)
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int  # FFN width of the dense layers
    activation: str
    gated_mlp: bool  # SwiGLU-style gate/up/down (3 matrices) vs up/down (2)
    vocab_size: int
    tied_embeddings: bool
    max_context: int
    rope_theta: float
    position_embedding: str
    norm: str
    linear_bias: bool  # bias on every linear layer (GPT-2/3)
    qkv_bias: bool  # bias on Q, K, V projections only (Qwen2)
    moe: MoEConfig | None
    mla: MLAConfig | None
    path: Path
    # A per-head norm of q and of k before attention: Qwen3's RMSNorm q_norm / k_norm (gain of
    # head_dim each), Llama-4's weightless L2 norm (use_qk_norm). Costed as two norm kernels.
    qk_norm: bool = False
    qk_norm_gain: bool = False  # those norms carry a learned gain (Qwen3); False for Llama-4
    checkpoint_dtype: str = "bf16"  # weight format of the published checkpoint (CHECKPOINT_DTYPES)

    # -- attention shapes -------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the query projection output: heads x head_dim; MLA: heads x (d_h + d_h^R)."""
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (equal to that of V) per token and layer: kv_heads x head_dim (GQA,
        Ainslie et al. 2023). MLA: the cached latent width d_c + d_h^R (DeepSeek-V2 Sec. 2.1.2:
        only c_t^KV and the shared RoPE key k_t^R are cached)."""
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return self.num_kv_heads * self.head_dim

    @property
    def kv_cache_width(self) -> int:
        """Elements cached per token per layer: 2 x kv_dim (K and V); MLA: kv_dim (one latent)."""
        if self.mla is not None:
            return self.kv_dim
        return 2 * self.kv_dim

    # -- layer kinds ------------------------------------------------------------------------
    def is_moe_layer(self, i: int) -> bool:
        """HF DeepseekV3DecoderLayer rule: MoE iff i >= first_k_dense_replace and
        i % moe_layer_freq == 0; Mixtral (first 0, freq 1) makes every layer MoE. An explicit
        moe.moe_layers list wins (HF Llama4TextDecoderLayer: ``layer_idx in config.moe_layers``)."""
        if self.moe is None:
            return False
        if self.moe.moe_layers:
            return i in self.moe.moe_layers
        return i >= self.moe.first_moe_layer and i % self.moe.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # -- parameter counts, per component ---------------------------------------------------
    def attn_params_per_layer(self) -> int:
        """Attention weights (and biases) of one layer.

        Standard / GQA: W_q (h x q_dim) + W_k, W_v (h x kv_dim each) + W_o (q_dim x h);
        biases: Q, K, V (q_dim + 2 kv_dim) when qkv_bias or linear_bias, plus O (h) when linear_bias;
        q/k norm gains (HF Qwen3Attention q_norm, k_norm: RMSNorm(head_dim) each) 2 head_dim
        when qk_norm_gain (Llama-4's L2 qk norm has no weights).
        MLA (HF modeling_deepseek_v3.DeepseekV3Attention): q_a_proj (h x d_c') + q_a_layernorm
        (d_c') + q_b_proj (d_c' x heads (d_h + d_h^R)), or q_proj (h x heads (d_h + d_h^R)) when
        q_lora_rank = 0; kv_a_proj_with_mqa (h x (d_c + d_h^R)) + kv_a_layernorm (d_c) +
        kv_b_proj (d_c x heads (d_h + d_v)); o_proj (heads d_v x h). No biases.
        """
        h = self.hidden_size
        if self.mla is not None:
            m = self.mla
            qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank > 0:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * self.num_attention_heads * qk_head
            else:
                q = h * self.num_attention_heads * qk_head
            kv = (h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
                  + m.kv_lora_rank * self.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim))
            o = self.num_attention_heads * m.v_head_dim * h
            return q + kv + o
        q_dim, kv_dim = self.q_dim, self.kv_dim
        params = h * q_dim + 2 * h * kv_dim + q_dim * h
        if self.qkv_bias or self.linear_bias:
            params += q_dim + 2 * kv_dim
        if self.linear_bias:
            params += h
        if self.qk_norm_gain:
            params += 2 * self.head_dim
        return params

    def _mlp_params(self, ffn: int) -> int:
        """One FFN of width ``ffn``: gated (SwiGLU, Shazeer 2020): gate, up (h x ffn) and down
        (ffn x h) = 3 h ffn; plain (GPT-2/3): up and down = 2 h ffn; biases ffn + h (linear_bias)."""
        h = self.hidden_size
        params = (3 if self.gated_mlp else 2) * h * ffn
        if self.linear_bias:
            params += ffn + h
        return params

    def dense_mlp_params(self) -> int:
        """FFN of one dense (non-MoE) layer, width ffn_hidden_size."""
        return self._mlp_params(self.ffn_hidden_size)

    def expert_params(self) -> int:
        """One routed expert (an FFN of width expert_ffn_hidden_size); 0 for a dense model."""
        if self.moe is None:
            return 0
        return self._mlp_params(self.moe.expert_ffn_hidden_size)

    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer: num_shared x FFN(shared_expert_ffn_hidden_size)
        (HF DeepseekV3MoE builds them as one MLP of width n_shared x moe_intermediate_size,
        which has the same count)."""
        if self.moe is None or self.moe.num_shared_experts == 0:
            return 0
        return self.moe.num_shared_experts * self._mlp_params(self.moe.shared_expert_ffn_hidden_size)

    def router_params(self) -> int:
        """Router of one MoE layer: a linear h -> num_experts without bias (Mixtral ``gate``,
        DeepSeek ``gate.weight``; DeepSeek-V3's 256-entry e_score_correction_bias is omitted)."""
        if self.moe is None:
            return 0
        return self.moe.num_experts * self.hidden_size

    def norm_params_per_layer(self) -> int:
        """Two norms per layer (pre-attention, pre-FFN): RMSNorm has a gain (h), LayerNorm a gain
        and a bias (2h). MLA's latent norms are counted in attn_params_per_layer."""
        return 2 * self._norm_params()

    def final_norm_params(self) -> int:
        """The norm after the last layer (HF ``model.norm``, GPT-2 ``ln_f``)."""
        return self._norm_params()

    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def embedding_params(self) -> int:
        """Token embedding (vocab x h) plus learned absolute positions (max_context x h) when
        position_embedding = "learned" (GPT-2/3 ``wpe``)."""
        params = self.vocab_size * self.hidden_size
        if self.position_embedding == "learned":
            params += self.max_context * self.hidden_size
        return params

    def lm_head_params(self) -> int:
        """Output projection h x vocab; 0 when tied to the token embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def ffn_params_of_layer(self, i: int, active: bool = False) -> int:
        """FFN block of layer i. MoE: routed experts (all, or top-k when ``active``) + shared
        experts + router; dense: dense_mlp_params()."""
        if not self.is_moe_layer(i):
            return self.dense_mlp_params()
        routed = self.moe.experts_per_token if active else self.moe.num_experts
        return routed * self.expert_params() + self.shared_expert_params() + self.router_params()

    def param_count(self) -> int:
        """Total parameters: embeddings + lm head + final norm
        + sum over layers of (attention + two norms + FFN block)."""
        return self._count(active=False)

    def active_param_count(self) -> int:
        """Parameters touched per token: as param_count() with only the top-k routed experts of
        each MoE layer (shared experts and the router always count). Equal to param_count() for
        dense models. (DeepSeek-V3 report: 37B activated of 671B.)"""
        return self._count(active=True)

    def _count(self, active: bool) -> int:
        per_layer = self.attn_params_per_layer() + self.norm_params_per_layer()
        layers = sum(per_layer + self.ffn_params_of_layer(i, active) for i in range(self.num_layers))
        return layers + self.embedding_params() + self.lm_head_params() + self.final_norm_params()


# -- public loaders ------------------------------------------------------------------------

def list_models() -> list[str]:
    """Names (file stems) of the shipped model TOMLs, sorted."""
    return sorted(p.stem for p in models_dir().glob("*.toml"))


def hf_models_dir() -> Path:
    """The shipped HuggingFace config.json files of deployed models (``workloads/models/hf``)."""
    return models_dir() / "hf"


def list_hf_models() -> list[str]:
    """Names (file stems) of the shipped HF config.json files, sorted; ``load_model`` takes them."""
    return sorted(p.stem for p in hf_models_dir().glob("*.json"))


def load_model(name_or_path: str) -> ModelConfig:
    """A shipped name (``"llama-3.1-8b"``; a shipped HF config such as ``"qwen3-14b"``, where a
    shipped TOML of the same name wins), a path to a ``.toml``, or a path to a HuggingFace
    ``config.json`` (or a folder holding one)."""
    text = str(name_or_path)
    path = Path(text)
    looks_like_path = text.endswith((".toml", ".json")) or "/" in text or "\\" in text
    if looks_like_path or (path.exists() and not (models_dir() / f"{text}.toml").is_file()):
        if path.is_dir() and (path / "config.json").is_file():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{text}: model file not found; pass a shipped name, a .toml or an HF config.json")
        if path.suffix == ".toml":
            return _load_toml(path.resolve())
        if path.suffix == ".json":
            return _load_hf(path.resolve())
        raise ConfigError(f"{text}: model file must end in .toml or .json, got '{path.suffix}'")
    shipped = models_dir() / f"{text}.toml"
    if shipped.is_file():
        return _load_toml(shipped.resolve())
    shipped_hf = hf_models_dir() / f"{text}.json"
    if shipped_hf.is_file():
        return _load_hf(shipped_hf.resolve())
    raise ConfigError(f"unknown model '{text}'; {did_you_mean(text, list_models() + list_hf_models())}"
                      f"available: {', '.join(list_models())}; "
                      f"HF configs: {', '.join(list_hf_models())}; "
                      "or pass a path to a .toml or HF config.json")


# -- TOML ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _load_toml(path: Path) -> ModelConfig:
    top = Table(read_toml(path), path)
    top.expect_keys(_TOP_KEYS, optional=_TOP_OPTIONAL)
    name = top.str("name", nonempty=True)
    if name != path.stem:
        raise top.error("name", f"must equal the file stem '{path.stem}', got {name!r}")
    moe = _read_moe(top.table("moe")) if top.has("moe") else None
    mla = _read_mla(top.table("mla")) if top.has("mla") else None
    qk_norm = top.bool("qk_norm") if top.has("qk_norm") else False
    config = ModelConfig(
        name=name,
        source=top.str("source", nonempty=True),
        published_params=top.float("published_params_b", ge=0.0) * 1e9,
        num_layers=top.int("num_layers", ge=1),
        hidden_size=top.int("hidden_size", ge=1),
        num_attention_heads=top.int("num_attention_heads", ge=1),
        num_kv_heads=top.int("num_kv_heads", ge=1),
        head_dim=top.int("head_dim", ge=1),
        ffn_hidden_size=top.int("ffn_hidden_size", ge=1),
        activation=top.str("activation", choices=ACTIVATIONS),
        gated_mlp=top.bool("gated_mlp"),
        vocab_size=top.int("vocab_size", ge=1),
        tied_embeddings=top.bool("tied_embeddings"),
        max_context=top.int("max_context", ge=1),
        rope_theta=top.float("rope_theta", ge=0.0),
        position_embedding=top.str("position_embedding", choices=POSITION_EMBEDDINGS),
        norm=top.str("norm", choices=NORMS),
        linear_bias=top.bool("linear_bias"),
        qkv_bias=top.bool("qkv_bias"),
        moe=moe,
        mla=mla,
        path=path,
        qk_norm=qk_norm,
        qk_norm_gain=top.bool("qk_norm_gain") if top.has("qk_norm_gain") else qk_norm,
        checkpoint_dtype=(top.str("checkpoint_dtype", choices=CHECKPOINT_DTYPES)
                          if top.has("checkpoint_dtype") else "bf16"),
    )
    _check_consistency(config, lambda key, msg: top.error(key, msg))
    return config


def _read_moe(t: Table) -> MoEConfig:
    """[moe]: the MoE layers are either first_moe_layer + moe_layer_freq, or a list moe_layers."""
    if t.has("moe_layers"):
        t.expect_keys(_MOE_KEYS + ("moe_layers",))
        layers = _int_list(t, "moe_layers")
        if not layers:
            raise t.error("moe_layers", "must list at least one layer index, got []")
        first, freq = layers[0], 1
    else:
        t.expect_keys(_MOE_KEYS + _MOE_LAYER_RULE)
        layers, first, freq = (), t.int("first_moe_layer", ge=0), t.int("moe_layer_freq", ge=1)
    return MoEConfig(
        num_experts=t.int("num_experts", ge=1),
        experts_per_token=t.int("experts_per_token", ge=1),
        num_shared_experts=t.int("num_shared_experts", ge=0),
        expert_ffn_hidden_size=t.int("expert_ffn_hidden_size", ge=1),
        shared_expert_ffn_hidden_size=t.int("shared_expert_ffn_hidden_size", ge=0),
        first_moe_layer=first,
        moe_layer_freq=freq,
        moe_layers=layers,
    )


def _int_list(t: Table, key: str, ascending: bool = True) -> tuple[int, ...]:
    """A list of layer indices (integers >= 0; ascending without repeats unless not asked)."""
    value = t.data[key]
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                          for v in value):
        raise t.error(key, f"must be a list of layer indices (integers >= 0), got {value!r}")
    if ascending and any(b <= a for a, b in zip(value, value[1:])):
        raise t.error(key, f"must be ascending without repeats, got {value!r}")
    return tuple(value)


def _read_mla(t: Table) -> MLAConfig:
    t.expect_keys(_MLA_KEYS)
    return MLAConfig(
        kv_lora_rank=t.int("kv_lora_rank", ge=1),
        q_lora_rank=t.int("q_lora_rank", ge=0),
        qk_rope_head_dim=t.int("qk_rope_head_dim", ge=1),
        qk_nope_head_dim=t.int("qk_nope_head_dim", ge=1),
        v_head_dim=t.int("v_head_dim", ge=1),
    )


def _check_consistency(c: ModelConfig, error) -> None:
    """Cross-key rules; ``error(key, message)`` builds the ConfigError for the source format."""
    if c.num_attention_heads % c.num_kv_heads != 0:
        raise error("num_kv_heads", f"must divide num_attention_heads ({c.num_attention_heads}), "
                                    f"got {c.num_kv_heads}")
    if c.position_embedding == "rope" and not c.rope_theta > 0:
        raise error("rope_theta", f"must be > 0 with position_embedding = 'rope', got {c.rope_theta!r}")
    if c.mla is not None:
        qk_head = c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim
        if c.head_dim != qk_head:
            raise error("head_dim", f"must equal mla.qk_nope_head_dim + mla.qk_rope_head_dim "
                                    f"({qk_head}) for MLA, got {c.head_dim}")
    if c.moe is not None:
        m = c.moe
        if m.experts_per_token > m.num_experts:
            raise error("moe.experts_per_token", f"must be <= moe.num_experts ({m.num_experts}), "
                                                 f"got {m.experts_per_token}")
        if (m.num_shared_experts > 0) != (m.shared_expert_ffn_hidden_size > 0):
            raise error("moe.shared_expert_ffn_hidden_size",
                        f"must be > 0 exactly when moe.num_shared_experts > 0 "
                        f"(num_shared_experts = {m.num_shared_experts}), got {m.shared_expert_ffn_hidden_size}")
        if m.moe_layers and m.moe_layers[-1] >= c.num_layers:
            raise error("moe.moe_layers", f"must hold indices < num_layers ({c.num_layers}), "
                                          f"got {list(m.moe_layers)}")
        if m.first_moe_layer >= c.num_layers:
            raise error("moe.first_moe_layer", f"must be < num_layers ({c.num_layers}), got {m.first_moe_layer}")
    if c.qk_norm and c.mla is not None:
        raise error("qk_norm", "= true is not supported with MLA; remove it or the [mla] table")
    if c.qk_norm_gain and not c.qk_norm:
        raise error("qk_norm_gain", "= true needs qk_norm = true; set qk_norm = true or remove qk_norm_gain")


# -- HuggingFace config.json -----------------------------------------------------------------

_REQUIRED = object()


class _HF:
    """Reads keys of an HF config.json (or of its nested ``text_config``); absent or null keys
    take the transformers default or fail."""

    def __init__(self, data: dict[str, Any], path: Path, model_type: str, prefix: str = ""):
        self.table = Table(data, path, prefix)
        self.model_type = model_type

    def _present(self, key: str, default: Any) -> bool:
        if self.table.data.get(key) is not None:
            return True
        if default is _REQUIRED:
            raise self.table.error(key, f"is missing; it is required for model_type '{self.model_type}'")
        return False

    def int(self, key: str, default: Any = _REQUIRED, ge: int = 1) -> int:
        return self.table.int(key, ge=ge) if self._present(key, default) else default

    def float(self, key: str, default: Any = _REQUIRED) -> float:
        return self.table.float(key, gt=0.0) if self._present(key, default) else default

    def bool(self, key: str, default: Any = _REQUIRED) -> bool:
        return self.table.bool(key) if self._present(key, default) else default

    def str(self, key: str, default: Any = _REQUIRED, choices=None) -> str:
        return self.table.str(key, choices=choices) if self._present(key, default) else default

    def int_list(self, key: str, default: Any = _REQUIRED, ascending: bool = True) -> tuple[int, ...]:
        return _int_list(self.table, key, ascending) if self._present(key, default) else tuple(default)


@functools.lru_cache(maxsize=None)
def _load_hf(path: Path) -> ModelConfig:
    """Map an HF config.json (model_type one of HF_MODEL_TYPES) onto ModelConfig.

    Defaults for absent keys are those of the transformers config classes (LlamaConfig etc.):
    num_key_value_heads = num_attention_heads, head_dim = hidden_size / num_attention_heads
    (128 for qwen3, qwen3_moe and llama4, as in Qwen3Config and Llama4TextConfig),
    hidden_act = "silu", tie_word_embeddings = false, rope_theta = 10000. The published
    parameter count is unknown (published_params = 0). Family specifics:

    - qwen3: heads x head_dim may differ from hidden_size (Qwen3-14B: 40 x 128 = 5120, but
      Qwen3-8B 32 x 128 = 4096 at hidden 4096, Qwen3-32B 64 x 128 = 8192 at hidden 5120); no QKV
      bias; RMSNorm ``q_norm`` and ``k_norm`` over each head (qk_norm, gain of head_dim each).
    - qwen3_moe: as qwen3, with ``num_experts`` routed experts of width ``moe_intermediate_size``,
      top ``num_experts_per_tok``, no shared expert; layer i is MoE iff i is not in
      ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` == 0 (HF Qwen3MoeDecoderLayer),
      the others are dense of width ``intermediate_size``. ``norm_topk_prob`` changes no cost.
    - llama4 (Llama4ForConditionalGeneration): only the text model in ``text_config``
      (model_type llama4_text) is read; the vision encoder and projector are ignored, neither
      counted nor costed (about 0.9B of Llama-4-Scout's 109B). MoE layers are ``moe_layers``,
      else range(step - 1, num_hidden_layers, step) with step = ``interleave_moe_layer_step``
      (HF Llama4TextConfig; Llama4TextDecoderLayer: ``layer_idx in config.moe_layers``); each
      has ``num_local_experts`` routed experts (top ``num_experts_per_tok``, sigmoid router)
      plus one shared expert, all of width ``intermediate_size``; dense layers have width
      ``intermediate_size_mlp``. ``use_qk_norm`` (a weightless L2 norm of q and k) counts as
      qk_norm in every layer, though HF applies it in the RoPE layers only (3 of 4). The NoPE
      layers (``no_rope_layers``: no rotary embedding there) and chunked local attention
      (``attention_chunk_size`` 8192 in the RoPE layers) are not modelled: up to 8192 tokens of
      context chunked attention is full causal attention; beyond it the attention cost of the
      chunked layers is overstated.

    The checkpoint's weight format (checkpoint_dtype) comes from ``quantization_config`` when
    present, else from ``torch_dtype`` (or the newer ``dtype``), else bf16; see _checkpoint_dtype.
    """
    data = read_json(path)
    raw_type = data.get("model_type")
    if raw_type not in HF_MODEL_TYPES:
        raise ConfigError(f"{display_path(path)}: key 'model_type' must be one of "
                          f"{', '.join(repr(t) for t in HF_MODEL_TYPES)}, got {raw_type!r}")
    top = hf = _HF(data, path, raw_type)
    if raw_type == "llama4":
        text = data.get("text_config")
        if not isinstance(text, dict):
            raise top.table.error("text_config", "must be an object holding the text model's config "
                                                 f"(model_type 'llama4_text'), got {text!r}")
        hf = _HF(text, path, raw_type, prefix="text_config")
    for key in ("attention_bias", "mlp_bias"):
        if hf.bool(key, default=False):
            raise hf.table.error(key, "= true is not supported; only Qwen2-style QKV bias is modelled")

    hidden = hf.int("hidden_size")
    heads = hf.int("num_attention_heads")
    kv_heads = hf.int("num_key_value_heads", default=heads)
    num_layers = hf.int("num_hidden_layers")
    ffn = hf.int("intermediate_size")
    moe = mla = None
    qk_norm = qk_norm_gain = False
    if raw_type == "deepseek_v3":
        mla = MLAConfig(
            kv_lora_rank=hf.int("kv_lora_rank"),
            q_lora_rank=hf.int("q_lora_rank", default=0, ge=0),  # null = no query compression
            qk_rope_head_dim=hf.int("qk_rope_head_dim"),
            qk_nope_head_dim=hf.int("qk_nope_head_dim"),
            v_head_dim=hf.int("v_head_dim"),
        )
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim  # HF's own head_dim key is ignored
        n_shared = hf.int("n_shared_experts", default=0, ge=0)
        moe_ffn = hf.int("moe_intermediate_size")
        moe = MoEConfig(
            num_experts=hf.int("n_routed_experts"),
            experts_per_token=hf.int("num_experts_per_tok"),
            num_shared_experts=n_shared,
            expert_ffn_hidden_size=moe_ffn,
            shared_expert_ffn_hidden_size=moe_ffn if n_shared > 0 else 0,
            first_moe_layer=hf.int("first_k_dense_replace", default=0, ge=0),
            moe_layer_freq=hf.int("moe_layer_freq", default=1),
        )
    else:
        explicit_default = 128 if raw_type in ("qwen3", "qwen3_moe", "llama4") else None
        if explicit_default is None and hf.table.data.get("head_dim") is None and hidden % heads != 0:
            raise hf.table.error("head_dim", f"is missing and hidden_size ({hidden}) is not divisible "
                                             f"by num_attention_heads ({heads}); add head_dim")
        head_dim = hf.int("head_dim", default=explicit_default or hidden // heads)
        if raw_type == "mixtral":
            moe = MoEConfig(
                num_experts=hf.int("num_local_experts"),
                experts_per_token=hf.int("num_experts_per_tok"),
                num_shared_experts=0,
                expert_ffn_hidden_size=hf.int("intermediate_size"),
                shared_expert_ffn_hidden_size=0,
                first_moe_layer=0,
                moe_layer_freq=1,
            )
        elif raw_type in ("qwen3", "qwen3_moe"):
            qk_norm = qk_norm_gain = True  # Qwen3Attention: q_norm, k_norm = RMSNorm(head_dim)
            if raw_type == "qwen3_moe":
                moe = _qwen3_moe(hf, num_layers)
        elif raw_type == "llama4":
            qk_norm = hf.bool("use_qk_norm", default=True)  # Llama4TextL2Norm: no weights
            moe = _llama4_moe(hf, num_layers)
            ffn = hf.int("intermediate_size_mlp")

    config = ModelConfig(
        name=path.parent.name if path.name == "config.json" else path.stem,
        source=display_path(path),
        published_params=0.0,
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=ffn,
        activation=hf.str("hidden_act", default="silu", choices=ACTIVATIONS),
        gated_mlp=True,  # every supported family uses gate/up/down MLPs
        vocab_size=hf.int("vocab_size"),
        tied_embeddings=hf.bool("tie_word_embeddings", default=False),
        max_context=hf.int("max_position_embeddings"),
        rope_theta=hf.float("rope_theta", default=10000.0),
        position_embedding="rope",
        norm="rmsnorm",
        linear_bias=False,
        qkv_bias=raw_type == "qwen2",  # Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False
        moe=moe,
        mla=mla,
        path=path,
        qk_norm=qk_norm,
        qk_norm_gain=qk_norm_gain,
        checkpoint_dtype=_checkpoint_dtype(top, hf),
    )
    hf_keys = {"num_kv_heads": "num_key_value_heads", "rope_theta": "rope_theta",
               "head_dim": "head_dim", "moe.experts_per_token": "num_experts_per_tok",
               "moe.first_moe_layer": "first_k_dense_replace",
               "moe.shared_expert_ffn_hidden_size": "n_shared_experts",
               "moe.moe_layers": "moe_layers"}
    _check_consistency(config, lambda key, msg: hf.table.error(hf_keys.get(key, key), msg))
    return config


def _moe_layer_rule(layers: tuple[int, ...], num_layers: int) -> dict[str, Any]:
    """MoEConfig layer fields for a set of MoE layers: first_moe_layer + moe_layer_freq when that
    rule gives exactly this set (Llama-4-Scout: every layer), else the explicit list."""
    first = layers[0]
    freq = layers[1] - layers[0] if len(layers) > 1 else 1
    if tuple(i for i in range(num_layers) if i >= first and i % freq == 0) == layers:
        return {"first_moe_layer": first, "moe_layer_freq": freq, "moe_layers": ()}
    return {"first_moe_layer": first, "moe_layer_freq": 1, "moe_layers": layers}


def _qwen3_moe(hf: _HF, num_layers: int) -> MoEConfig | None:
    """Qwen3MoeSparseMoeBlock on the layers HF Qwen3MoeDecoderLayer makes sparse; None if none."""
    num_experts = hf.int("num_experts", ge=0)
    step = hf.int("decoder_sparse_step", default=1)
    dense_only = set(hf.int_list("mlp_only_layers", default=(), ascending=False))
    layers = tuple(i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
    if num_experts == 0 or not layers:
        return None
    return MoEConfig(
        num_experts=num_experts,
        experts_per_token=hf.int("num_experts_per_tok"),
        num_shared_experts=0,
        expert_ffn_hidden_size=hf.int("moe_intermediate_size"),
        shared_expert_ffn_hidden_size=0,
        **_moe_layer_rule(layers, num_layers),
    )


def _llama4_moe(hf: _HF, num_layers: int) -> MoEConfig | None:
    """Llama4TextMoe (routed Llama4TextExperts + one shared Llama4TextMLP, both of width
    intermediate_size) on the layers of Llama4TextConfig.moe_layers; None if there are none."""
    if hf.table.data.get("moe_layers") is not None:
        layers = hf.int_list("moe_layers")
    else:
        step = hf.int("interleave_moe_layer_step", default=1)
        layers = tuple(range(step - 1, num_layers, step))
    if not layers:
        return None
    width = hf.int("intermediate_size")
    return MoEConfig(
        num_experts=hf.int("num_local_experts"),
        experts_per_token=hf.int("num_experts_per_tok"),
        num_shared_experts=1,
        expert_ffn_hidden_size=width,
        shared_expert_ffn_hidden_size=width,
        **_moe_layer_rule(layers, num_layers),
    )


# torch_dtype -> checkpoint_dtype; float32 checkpoints are served in 16-bit (vLLM's --dtype auto
# downcasts float32 weights), counted here as bf16.
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "bf16"}
_QUANT_METHODS = ("compressed-tensors", "fp8", "fbgemm_fp8", "awq", "gptq")
_CT_WEIGHTS = {("float", 8): "fp8", ("int", 8): "int8", ("float", 4): "fp4", ("int", 4): "int4"}
_INT_BITS = {8: "int8", 4: "int4"}
_DTYPE_BITS = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "fp4": 4, "int4": 4}


def _checkpoint_dtype(top: _HF, text: _HF) -> str:
    """Weight format of the checkpoint.

    ``quantization_config`` (top level) wins: quant_method "compressed-tensors" reads the
    ``weights`` scheme (``type`` float/int, ``num_bits`` 8/4) of its config_groups, the widest
    one if groups differ (float 8 -> fp8, e.g. FP8-dynamic checkpoints); "fp8" and "fbgemm_fp8"
    -> fp8; "awq" and "gptq" -> int4 (int8 with ``bits`` = 8). Layers a quantised checkpoint keeps
    in 16-bit (router, lm_head, compressed-tensors' ``ignore`` list) are not recorded. Otherwise
    ``torch_dtype`` (``dtype`` in newer transformers; the text model's first for llama4):
    bfloat16 -> bf16, float16 -> fp16, float32 -> bf16; else bf16.
    """
    if top.table.data.get("quantization_config") is not None:
        q = top.table.table("quantization_config")
        if not q.has("quant_method"):
            raise q.error("quant_method", f"is missing; use one of {', '.join(map(repr, _QUANT_METHODS))}")
        method = q.str("quant_method", choices=_QUANT_METHODS)
        if method in ("fp8", "fbgemm_fp8"):
            return "fp8"
        if method in ("awq", "gptq"):
            bits = q.int("bits") if q.data.get("bits") is not None else 4
            if bits not in _INT_BITS:
                raise q.error("bits", f"must be 4 or 8 for quant_method '{method}', got {bits}")
            return _INT_BITS[bits]
        if not q.has("config_groups"):
            raise q.error("config_groups", "is missing; compressed-tensors needs a weights scheme there")
        groups = q.table("config_groups")
        found = []
        for name in groups.data:
            group = groups.table(name)
            if group.data.get("weights") is None:
                continue  # activation-only scheme
            w = group.table("weights")
            kind, bits = w.str("type", choices=("float", "int")), w.int("num_bits", ge=1)
            if (kind, bits) not in _CT_WEIGHTS:
                raise w.error("num_bits", f"{bits} with type '{kind}' is not a supported weight format; "
                                          "supported: float 8 (fp8), int 8, float 4 (fp4), int 4")
            found.append(_CT_WEIGHTS[(kind, bits)])
        if not found:
            raise q.error("config_groups", "holds no group with a weights scheme; add one or remove "
                                           "quantization_config")
        return max(found, key=_DTYPE_BITS.__getitem__)
    for reader in (text, top):
        for key in ("torch_dtype", "dtype"):
            if reader.table.data.get(key) is not None:
                return _TORCH_DTYPES[reader.table.str(key, choices=_TORCH_DTYPES)]
    return "bf16"


__all__ = ["MoEConfig", "MLAConfig", "ModelConfig", "CHECKPOINT_DTYPES", "hf_models_dir",
           "list_hf_models", "list_models", "load_model"]
