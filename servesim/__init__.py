"""servesim: request-level LLM serving simulator, cost model and capacity planner."""

__version__ = "0.1.0"

from ._jitcache import ensure_fresh as _ensure_fresh

_ensure_fresh()


def simulate(config=None, **options):
    """Run one serving simulation; see servesim.api.SimConfig for the options."""
    from .api import simulate as _simulate
    return _simulate(config, **options)
