"""A tour of the Python API, notebook style (`# %%` cells: run them one by one in VS Code / Jupyter, or
the whole file with `python experiments/api_tour.py`). Small sizes, so the whole tour runs in seconds;
every function takes the options of the CLI command of the same name and returns a typed result
(a summary dict and pandas frames). Writes nothing; `tests/test_api_tour.py` runs it."""

# %% One simulation: llama-3.1-8b on one H100, fixed 256-in / 32-out requests at 4 req/s.
import servesim

SMALL = dict(num_requests=200, isl=256, osl=32)
SLO = "ttft_p99=1s,tpot_p99=60ms"

res = servesim.simulate(rate=4, slo=SLO, **SMALL)
print(f"simulate: TTFT p99 {res.summary['ttft_ms']['p99']:.1f} ms, TPOT p99 {res.summary['tpot_ms']['p99']:.1f} ms, "
      f"{res.summary['saturation_verdict']}; {len(res.requests)} request rows")

# %% A sweep: two rates x two TP degrees, one simulation per point, one row per point.
sw = servesim.sweep([2, 8], grid={"tp": [1, 2]}, slo=SLO, workers=1, **SMALL)
print("\nsweep:")
print(sw.points[["tp", "rate", "status", "ttft_ms_p99", "tpot_ms_p99", "cost_usd_per_million_output_tokens"]]
      .to_string(index=False))

# %% The highest rate that still meets the SLO, bisected to 5%.
mr = servesim.find_max_rate(slo=SLO, workers=1, **SMALL)
p = mr.points.iloc[0]
print(f"\nfind_max_rate: {p['max_rate']:.1f} req/s (fails at {p['first_failing_rate']:.1f}: {p['limited_by']}), "
      f"{p['simulations']} simulations")

# %% The cheapest deployment meeting the SLO at 20 req/s, among H100 and L40S at TP 1 or 2.
pl = servesim.plan(hardware=["h100-sxm", "l40s"], tp=[1, 2], rate=20, slo=SLO, workers=1, **SMALL)
b = pl.best
print(f"\nplan: {b['replicas']} x {b['hardware']} TP={b['tp']} ({b['num_gpus']} GPUs), ${b['usd_per_hour']:.2f}/h, "
      f"${b['usd_per_million_output_tokens']:.3f} per M output tokens")
print(pl.candidates[["hardware", "tp", "replicas", "usd_per_hour", "status"]].to_string(index=False))

# %% One engine iteration priced by the cost model: 64 decodes at a 2,048-token context.
co = servesim.cost(decode_seqs=64, context=2048)
print(f"\ncost: {co.summary['time_ms']:.2f} ms per iteration, bottleneck {co.summary['bottleneck']}")
print(co.breakdown.to_string(index=False))

# %% Training: one layout on 8 GPUs, and a scaling table.
tr = servesim.train(gpus=8, global_batch=64)
print(f"\ntrain: step {tr.summary['step_time_s']:.2f} s, MFU {100 * tr.summary['mfu']:.1f}%, "
      f"{tr.summary['memory_gib_per_gpu']['total']:.1f} GiB per GPU")
sc = servesim.train(gpus=[8, 16], global_batch=32)
print(sc.table[["gpus", "tokens_per_s_per_gpu", "scaling_efficiency"]].to_string(index=False))

# %% Training cost against serving cost, and the break-even.
cp = servesim.compare(gpus=64, global_batch=128, train_tokens=1e12, rate=2, num_requests=100)
r = cp.rows.iloc[0]
print(f"\ncompare: training ${r['train_usd']:,.0f}; serving ${r['serve_usd_per_m_output']:.3f} per M output tokens; "
      f"break-even after {r['break_even_output_tokens']:.3g} served output tokens")
