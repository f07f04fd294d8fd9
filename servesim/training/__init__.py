"""Training step-time and memory model on the serving cost model's hardware profiles."""
from .flops import counted_flops_per_token, model_flops_per_token
from .framework import list_frameworks, load_framework
from .layout import TrainLayout, check_layout, derive_dp, resolve_layout
from .memory import activation_bytes_per_layer, layer_activation_parts, memory_per_gpu
from .step import TrainResult, fit_memory, train_step

__all__ = ["TrainLayout", "TrainResult", "activation_bytes_per_layer", "check_layout", "counted_flops_per_token",
           "derive_dp", "fit_memory", "layer_activation_parts", "list_frameworks", "load_framework", "memory_per_gpu",
           "model_flops_per_token", "resolve_layout", "train_step"]
