"""Training step-time and memory model on the serving cost model's hardware profiles."""
from .flops import counted_flops_per_token, model_flops_per_token
from .layout import TrainLayout, check_layout, derive_dp
from .memory import activation_bytes_per_layer, memory_per_gpu
from .step import TrainResult, train_step

__all__ = ["TrainLayout", "TrainResult", "activation_bytes_per_layer", "check_layout",
           "counted_flops_per_token", "derive_dp", "memory_per_gpu", "model_flops_per_token", "train_step"]
