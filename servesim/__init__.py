"""servesim: request-level LLM serving simulator, cost model and capacity planner."""

__version__ = "0.1.0"
