"""Shared fixtures: a small, fast engine setup and a way to run kernel and reference side by side."""
from __future__ import annotations

import functools
import os
import types

import numpy as np
import pytest

# a run that uses the prefix cache, session turns, KV transfers or static batching compiles the kernel with
# all four: one specialisation for the suite instead of 15 (engine/kernel.py; the pruned ones: test_golden,
# slow);
# and every run the full step cost (costmodel/features.py; the plain one: test_cost_features)
os.environ.setdefault("SERVESIM_KERNEL_UNION", "1")

from servesim.config import load_hardware, load_model  # noqa: E402
from servesim.costmodel import Layout, build_replica
from servesim.engine.lower import EngineOptions, engine_config, one_pool_inputs
from servesim.engine.run import run
from servesim.reference import reference_run
from servesim.workload.chains import block_chains


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernel():
    """Compile (or load) the plain kernel before any test, so that the cold-compile notice, printed
    once per process, is not printed inside a test that reads a command's output."""
    import servesim
    servesim.simulate(num_requests=20)


@functools.lru_cache(maxsize=None)
def _replica(tp: int, pp: int, model: str, hardware: str):
    return build_replica(load_model(model), load_hardware(hardware), Layout(tp, pp, "bf16"), 0.9,
                         max_tokens=512, max_seqs=16)


@pytest.fixture(scope="session")
def replica_cost():
    """replica_cost(tp=1, pp=1) -> ReplicaCost of llama-3.1-8b on h100-sxm (cached)."""
    def make(tp: int = 1, pp: int = 1, model: str = "llama-3.1-8b", hardware: str = "h100-sxm"):
        return _replica(tp, pp, model, hardware)
    return make


@pytest.fixture(scope="session")
def small_engine():
    """small_engine(rc, num_blocks=48, watermark_blocks=1, **EngineOptions) -> EngineConfig with a
    deliberately small KV cache, so that preemption happens on small workloads."""
    def make(rc, num_blocks: int = 48, watermark_blocks: int = 1, **opts):
        base = dict(max_num_seqs=16, max_num_batched_tokens=512, chunk_size=256, block_size=16)
        cfg = engine_config(EngineOptions(**(base | opts)), rc)
        return cfg._replace(num_blocks=num_blocks, watermark_blocks=watermark_blocks)
    return make


@pytest.fixture(scope="session")
def small_workload():
    """small_workload(n, seed, rate, max_prompt, max_output) -> (arrival, prompt, output) arrays."""
    def make(n: int = 120, seed: int = 0, rate: float = 40.0, max_prompt: int = 600, max_output: int = 60):
        rng = np.random.default_rng(seed)
        arrival = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
        prompt = rng.integers(1, max_prompt + 1, n).astype(np.int64)
        output = rng.integers(1, max_output + 1, n).astype(np.int64)
        return arrival, prompt, output
    return make


def shared_prefix_chains(prompt, output, group, prefix_len, block_size):
    """The block chains (`workload.chains.block_chains`, the one builder) of requests sharing
    system prompts: ``group`` (-1: none) and ``prefix_len`` tokens of it."""
    n = len(prompt)
    reqs = types.SimpleNamespace(prompt=np.asarray(prompt, np.int64), output=np.asarray(output, np.int64),
                                 prefix_group=np.asarray(group, np.int64), prefix_len=np.asarray(prefix_len, np.int64),
                                 session=np.full(n, -1, np.int64))
    return block_chains(reqs, block_size)


@pytest.fixture(scope="session")
def run_both():
    """run_both(rc, cfg, arrival, prompt, output, seed=0, group=None, hit=None, spec=None, dp=None) ->
    (EngineOutput, reference dict): one mixed pool, the kernel and the reference on the same lowered
    inputs (``group``, ``hit``: shared-prefix groups and the prefix tokens each request holds; chains
    from `block_chains`; ``spec``, ``dp``: speculative decoding, `engine.lower.spec_inputs`)."""
    def go(rc, cfg, arrival, prompt, output, seed: int = 0, group=None, hit=None, spec=None, dp=None):
        chains = None
        if group is not None and np.any(np.asarray(group) >= 0):
            chains = shared_prefix_chains(prompt, output, group, hit, cfg.block_size)
        inputs = one_pool_inputs(rc.params, cfg, arrival, prompt, output, seed, chains, spec=spec, dp=dp)
        return run(inputs), reference_run(inputs)
    return go
