"""Training step-time and memory model on the serving cost model's hardware profiles.

Its names are loaded on first use (PEP 562): the CLI reads `framework` and `layout`'s option choices at
start-up without loading the step model, the memory model and the cost model behind them."""

_NAMES = {
    "flops": ("counted_flops_per_token", "model_flops_per_token"),
    "framework": ("list_frameworks", "load_framework"),
    "layout": ("TrainLayout", "check_layout", "derive_dp", "resolve_layout"),
    "memory": ("activation_bytes_per_layer", "layer_activation_parts", "memory_per_gpu"),
    "step": ("TrainResult", "fit_memory", "train_step"),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'servesim.training' has no attribute {name!r}")
    if module == "flops":
        from . import flops as m
    elif module == "framework":
        from . import framework as m
    elif module == "layout":
        from . import layout as m
    elif module == "memory":
        from . import memory as m
    else:
        from . import step as m
    value = getattr(m, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))
