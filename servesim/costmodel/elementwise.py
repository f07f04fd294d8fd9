"""Memory-bound kernels of one transformer layer: bytes per token and the bandwidth fraction that prices each.

Besides its GEMMs and attention, a layer runs six elementwise kernels (the layer of vLLM v0 /
Sarathi-Serve as profiled by Vidur, Agrawal et al., MLSys 2024): an RMSNorm before attention and one
before the MLP, rotary embedding of q and k, the (gated) activation, and two residual adds. Each
reads its 16-bit inputs and writes its outputs once (per token, per GPU):

    RMSNorm       read h, write h                        4 h bytes
    residual add  read 2 h, write h                      6 h bytes
    rope          read + write the rotated q and k part  4 (q_heads + kv_heads) d_rope bytes
    activation    read g f / TP, write f / TP            2 (g + 1) f / TP bytes (g = 2 if gated)

MLA (DeepSeek-V2 sec. 2.1) adds an RMSNorm on each of the compressed q and kv latents. A q/k norm
(Qwen3's per-head RMSNorm ``q_norm`` / ``k_norm``, Llama-4's L2 norm) adds two norm kernels, over
the q heads and over the KV heads of one GPU: 4 (q_heads + kv_heads) d_head bytes in all.
A kernel costs ``latency + bytes / (hbm_bw * fraction)`` with one achieved fraction per kind: norms
are per-token reductions, rope and the activation do arithmetic per element, and the residual add
is a pure stream, priced at the GEMMs' weight-streaming ``hbm_fraction``. Engines that fuse the add
into the next norm (vLLM's ``fused_add_rms_norm``, TensorRT-LLM) move somewhat fewer bytes.
"""
from __future__ import annotations

ACT_BYTES = 2.0  # 16-bit activations

# kind -> Efficiency field holding its achieved fraction of HBM bandwidth
KIND_FIELD = {
    "norm": "norm_hbm_fraction",
    "rope": "rope_hbm_fraction",
    "activation": "activation_hbm_fraction",
    "stream": "hbm_fraction",
}


def norm_bytes(width):
    return 2.0 * width * ACT_BYTES


def add_bytes(width):
    return 3.0 * width * ACT_BYTES


def rope_bytes(rotated_width):
    return 2.0 * rotated_width * ACT_BYTES


def activation_bytes(ffn_width_gpu, gated):
    return ((2.0 if gated else 1.0) + 1.0) * ffn_width_gpu * ACT_BYTES


def fused_add_norm_bytes(width):
    """Residual add fused into the next RMSNorm: read x and the residual, write both."""
    return 4.0 * width * ACT_BYTES


def layer_kernels(hidden, rope_width_gpu, ffn_width_gpu, gated, latent_norm_widths=(), qk_norm_widths=(),
                  fused_add_norm=False):
    """[(kind, bytes per token)] of one layer's elementwise kernels on one GPU; ``qk_norm_widths``
    are the q and k widths per GPU (q_heads d_head, kv_heads d_head) of a q/k-normed model.

    ``fused_add_norm``: the engine fuses each residual add into the RMSNorm that follows it (vLLM's
    ``fused_add_rms_norm``, TensorRT-LLM's fused residual norm): two kernels of 8 h bytes instead of
    two norms (4 h) and two adds (6 h)."""
    if fused_add_norm:
        out = [("norm", fused_add_norm_bytes(hidden)), ("norm", fused_add_norm_bytes(hidden))]
    else:
        out = [("norm", norm_bytes(hidden)), ("norm", norm_bytes(hidden))]
    out += [("norm", norm_bytes(w)) for w in latent_norm_widths]
    out += [("norm", norm_bytes(w)) for w in qk_norm_widths]
    out += [("rope", rope_bytes(rope_width_gpu)), ("activation", activation_bytes(ffn_width_gpu, gated))]
    if not fused_add_norm:
        out += [("stream", add_bytes(hidden)), ("stream", add_bytes(hidden))]
    return out


def kind_fractions(efficiency) -> dict:
    """{kind: achieved HBM fraction} from an ``Efficiency``."""
    return {kind: getattr(efficiency, field) for kind, field in KIND_FIELD.items()}


def seconds_per_token(kernels, hbm_bw: float, fractions: dict) -> float:
    """Bandwidth time per token of ``kernels`` (without the per-kernel latency)."""
    return sum(b / (hbm_bw * fractions[kind]) for kind, b in kernels)
