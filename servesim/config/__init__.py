"""Typed, validated configuration: hardware profiles and model architectures, in SI units."""
from servesim.config.hardware import Efficiency, HardwareProfile, list_hardware, load_hardware
from servesim.config.model import ModelConfig, list_models, load_model

__all__ = ["Efficiency", "HardwareProfile", "ModelConfig", "list_hardware", "list_models",
           "load_hardware", "load_model"]
