"""The length above which a series (of requests, completions, latencies) takes servesim's jitted paths
that shorter runs never compile: the batch means of the intervals (`intervals.JIT_ABOVE`), the order
of the completions (`order.JIT_ABOVE`), the gather of the output columns
(`engine.state.GATHER_JIT_ABOVE`). `servesim warmup` compiles them ahead (`api.warm_long_runs`).
No imports: `intervals` stays free of numba."""
LONG_ABOVE = 1 << 16
