"""Engine profiles: loading and validation, CUDA-graph capture sizes and padding, the engine's
all-reduce, host time, and the prefix cache against the reference simulator."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.config import load_hardware, load_model
from servesim.config.engine import list_engines, load_engine, with_fit_for
from servesim.costmodel import Batch, Layout, build_replica
from servesim.costmodel.fields import table
from servesim.costmodel.iteration import graph_tokens_nb, iteration_components
from servesim.engine import codes as C
from servesim.errors import ConfigError

VLLM_TOML = load_engine("vllm").path.read_text()


def test_shipped_engines_load_with_fits_for_calibrated_gpus():
    assert set(list_engines()) >= {"vllm", "sglang", "trtllm"}
    for name in list_engines():
        e = load_engine(name)
        assert e.name == name and {"h100-sxm", "a100-sxm-80gb"} <= set(e.fits)


def test_vllm_capture_sizes_follow_vllm_rule():
    # vLLM 0.15: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), max = min(2 * max_num_seqs, 512)
    g = load_engine("vllm").cuda_graph
    want = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
    assert g.capture_sizes(256).tolist() == want
    assert g.capture_sizes(128).tolist() == [1, 2, 4] + list(range(8, 256, 8)) + [256]
    assert g.capture_sizes(2).tolist() == [1, 2, 4]


def test_graph_padding_picks_next_captured_size():
    sizes = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 24.0])
    assert [graph_tokens_nb(sizes, t) for t in (1, 3, 5, 8, 17, 24)] == [1, 4, 8, 8, 24, 24]
    assert graph_tokens_nb(sizes, 25) == -1.0
    assert graph_tokens_nb(np.zeros(0), 1) == -1.0


def _decode(rc, n, ctx=1000):
    return rc.iteration(Batch(decode=(ctx,) * n))


def test_padded_decode_costs_as_its_captured_size():
    m, hw = load_model("llama-3.1-8b"), load_hardware("h100-sxm")
    rc = build_replica(m, hw, Layout(), max_seqs=256)
    # 9 decodes run as a captured batch of 16 tokens: layer GEMMs and elementwise as for 16, attention
    # as for 9; the LM head, outside the graph, on the 9 sampled rows (a few us less)
    a, b = _decode(rc, 9), _decode(rc, 16)
    assert a.parts_s["gemm"] == pytest.approx(b.parts_s["gemm"], rel=1e-3)
    assert a.parts_s["elementwise"] == pytest.approx(b.parts_s["elementwise"])
    assert a.parts_s["attention"] < b.parts_s["attention"]


def test_full_graph_pays_one_launch_eager_pays_every_kernel():
    m, hw = load_model("llama-3.1-8b"), load_hardware("h100-sxm")
    eng = load_engine("vllm")
    slow_host = with_fit_for(eng, hw, launch_s=1e-3, host_step_s=0.0, host_per_seq_s=0.0,
                          step_gpu_s=0.0)
    rc = build_replica(m, hw, Layout(), max_seqs=4, engine=slow_host)   # captures up to 8 tokens
    p = rc.params
    small = iteration_components(table(p), 0.0, 0.0, 4.0, 0.0, 0.0, 4.0, 4000.0)   # 4 decodes: full graph
    big = iteration_components(table(p), 0.0, 0.0, 9.0, 0.0, 0.0, 9.0, 9000.0)     # 9 decodes: eager
    def body(c):
        return c.gemm + c.attention + c.elementwise + c.communication
    assert small.latency == pytest.approx(max(body(small), 1e-3))
    launches = m.num_layers * p.kernels_layer + 3
    assert big.latency == pytest.approx(max(body(big), launches * 1e-3))


def test_host_time_adds_per_step_and_per_sequence():
    # a synchronous engine (TensorRT-LLM's profile) adds the host time to the step
    m, hw = load_model("llama-3.1-8b"), load_hardware("h100-sxm")
    eng = load_engine("trtllm")
    assert not eng.host_overlap
    base = build_replica(m, hw, Layout(), engine=with_fit_for(eng, hw, host_step_s=0.0, host_per_seq_s=0.0))
    more = build_replica(m, hw, Layout(), engine=with_fit_for(eng, hw, host_step_s=1e-3, host_per_seq_s=1e-5))
    t0, t1 = _decode(base, 32).time_s, _decode(more, 32).time_s
    assert t1 - t0 == pytest.approx(1e-3 + 32 * 1e-5)


def test_async_host_time_hides_behind_the_gpu_until_it_is_longer():
    # vLLM 0.15.1 schedules asynchronously (engines/vllm.toml [ASY]): the step is the longer of the GPU
    # work and the host work; the GPU-side step time adds in either case
    m, hw = load_model("llama-3.1-8b"), load_hardware("h100-sxm")
    eng = load_engine("vllm")
    assert eng.host_overlap
    fit0 = dict(host_step_s=0.0, host_per_seq_s=0.0, step_gpu_s=0.0)
    gpu = _decode(build_replica(m, hw, Layout(), engine=with_fit_for(eng, hw, **fit0)), 32).time_s
    small = _decode(build_replica(m, hw, Layout(), engine=with_fit_for(eng, hw, **{**fit0, "host_step_s": 1e-4})),
                    32).time_s
    big = _decode(build_replica(m, hw, Layout(), engine=with_fit_for(eng, hw, **{**fit0, "host_step_s": 0.05,
                                                                                   "host_per_seq_s": 1e-4})), 32).time_s
    sync = _decode(build_replica(m, hw, Layout(), engine=with_fit_for(eng, hw, **{**fit0, "step_gpu_s": 1e-3})),
                   32).time_s
    assert gpu > 1e-3 and small == pytest.approx(gpu)
    assert big == pytest.approx(0.05 + 32 * 1e-4)
    assert sync == pytest.approx(gpu + 1e-3)


def test_custom_allreduce_inside_nvlink_nccl_outside():
    m = load_model("llama-3.1-8b")
    eng = load_engine("vllm")
    sxm = build_replica(m, load_hardware("h100-sxm"), Layout(tp=2), engine=eng).params
    pcie = build_replica(m, load_hardware("l40s"), Layout(tp=2), engine=eng).params
    assert sxm.ar_custom == 1.0 and pcie.ar_custom == 0.0
    assert build_replica(m, load_hardware("h100-sxm"), Layout(tp=2), engine=load_engine("trtllm")).params.ar_custom == 0.0


def test_fit_for_borrows_from_efficiency_source_and_says_so():
    eng = load_engine("vllm")
    mi300x = load_hardware("mi300x")          # no vLLM kernel tables: borrows h100-sxm's fit
    fit = eng.fit_for(mi300x)
    assert fit.fitted_on == "h100-sxm" and "mi300x" in fit.note and "h100-sxm" in fit.note
    assert eng.fit_for(load_hardware("h100-sxm")).note == "fitted on h100-sxm"
    # a GPU with kernel tables of its own but no end-to-end data says what it carries over
    h200 = eng.fit_for(load_hardware("h200-sxm"))
    assert h200.fitted_on == "h200-sxm" and "end-to-end terms" in h200.note and "carried over from h100-sxm" in h200.note


def test_prefix_hits_whole_blocks_and_recomputes_the_last_prompt_token(replica_cost, small_engine, run_both):
    """Two requests of one group, far apart: 100 shared tokens are 6 whole blocks (96 tokens) hit;
    a 96-token prompt that is all prefix hits 5 blocks, its last token recomputed (vLLM)."""
    rc = replica_cost()
    cfg = small_engine(rc, num_blocks=400)
    for prompt, plen, hit in ((150, 100, 96), (96, 96, 80)):
        out, ref = run_both(rc, cfg, [0.0, 5.0], [prompt, prompt], [4, 4], group=[0, 0], hit=[plen, plen])
        assert out.prefix[C.HIT_GPU_TOKENS] == hit == ref["prefix"][C.HIT_GPU_TOKENS]


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("scheduler", ["vllm", "sarathi", "vllm-v0"])
def test_prefix_cache_kernel_matches_reference(replica_cost, small_engine, small_workload, run_both,
                                               replicas, scheduler):
    rc = replica_cost()
    cfg = small_engine(rc, num_blocks=64, scheduler=scheduler, replicas=replicas, router="least-requests")
    arrival, prompt, output = small_workload(n=150, seed=3)
    rng = np.random.default_rng(7)
    prompt = prompt + 80
    group = rng.integers(-1, 5, prompt.size)
    out, ref = run_both(rc, cfg, arrival, prompt, output, group=group, hit=np.full(prompt.size, 80))
    for key in ("scheduled", "first_token", "finish"):
        np.testing.assert_array_equal(getattr(out, key), ref[key])
    np.testing.assert_array_equal(out.preemptions, ref["preemptions"])


def test_prefix_cache_shortens_ttft(replica_cost, small_engine, run_both):
    rc = replica_cost()
    cfg = small_engine(rc, num_blocks=400)
    n = 40
    arrival = np.arange(n) * 0.5      # far apart: every request runs alone
    prompt = np.full(n, 500, np.int64)
    output = np.full(n, 4, np.int64)
    cold, _ = run_both(rc, cfg, arrival, prompt, output)
    warm, _ = run_both(rc, cfg, arrival, prompt, output, group=np.zeros(n, np.int64), hit=np.full(n, 400))
    ttft_cold = cold.first_token - cold.arrival
    ttft_warm = warm.first_token - warm.arrival
    assert ttft_warm[0] == ttft_cold[0]             # the first of the group computes the prefix
    assert (ttft_warm[1:] < 0.6 * ttft_cold[1:]).all()   # the others prefill 500 - 400 tokens


# ---------------------------------------------------------------- files and options

def _write(tmp_path, text, name="myengine"):
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


def test_user_engine_file_loads(tmp_path):
    p = _write(tmp_path, VLLM_TOML.replace('name = "vllm"', 'name = "myengine"'))
    assert load_engine(str(p)).name == "myengine"


@pytest.mark.parametrize("edit, expect", [
    (lambda t: t.replace("launch_us = ", "launch_usec = "), "launch_usec"),
    (lambda t: t.replace("block_size = 16 ", "blok_size = 16 "), "did you mean 'scheduler.block_size'"),
    (lambda t: t.replace('mode = "full_and_piecewise"', 'mode = "sometimes"'), "cuda_graph.mode"),
    (lambda t: t.replace("gpu_memory_utilization = 0.90", "gpu_memory_utilization = 1.5"), "fraction"),
    (lambda t: t.replace("sizes = [1, 2, 4]", "sizes = [4, 2]"), "increasing"),
    (lambda t: t.replace("host_per_seq_us", "# host_per_seq_us"), "host_per_seq_us' is missing"),
])
def test_bad_engine_file_is_one_clear_error(tmp_path, edit, expect):
    p = _write(tmp_path, edit(VLLM_TOML).replace('name = "vllm"', 'name = "myengine"'))
    with pytest.raises(ConfigError, match=expect):
        load_engine(str(p))


def test_cli_engine_errors_exit_2(tmp_path):
    r = CliRunner().invoke(main, ["simulate", "--engine", "vllx", "--num-requests", "10"])
    assert r.exit_code == 2 and "unknown engine 'vllx'" in r.output and "vllm" in r.output
    bad = _write(tmp_path, VLLM_TOML.replace('name = "vllm"', 'name = "myengine"').replace("launch_us", "lunch_us"))
    r = CliRunner().invoke(main, ["simulate", "--engine", str(bad), "--num-requests", "10"])
    assert r.exit_code == 2 and "lunch_us" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_num_gpu_blocks_sets_capacity_and_rejects_too_few():
    from servesim.api import simulate
    res = simulate(num_gpu_blocks=5000, num_requests=50, isl=100, osl=10)
    assert res.summary["config"]["kv_blocks_per_replica"] == 5000
    r = CliRunner().invoke(main, ["simulate", "--num-gpu-blocks", "10", "--isl", "1000", "--osl", "100",
                                  "--num-requests", "5"])
    assert r.exit_code == 2 and "--num-gpu-blocks 10" in r.output and "69 or more" in r.output
    r = CliRunner().invoke(main, ["simulate", "--num-gpu-blocks", "0", "--num-requests", "5"])
    assert r.exit_code == 2 and "--num-gpu-blocks" in r.output


def test_vllm_kv_capacity_from_device_memory():
    # vLLM: 0.9 x total - weights - activations - non-torch, in blocks of 16 (gpu_worker.py)
    m, hw = load_model("qwen2.5-7b-instruct"), load_hardware("h100-sxm")
    eng = load_engine("vllm")
    rc = build_replica(m, hw, Layout(dtype="fp16"), 0.9, max_tokens=2048, max_seqs=128, engine=eng)
    mem = rc.memory
    free = 0.9 * hw.device_bytes - mem.weight_bytes - mem.activation_bytes - eng.scheduler.non_torch_memory_bytes
    assert mem.kv_capacity_tokens == int(free // mem.kv_bytes_per_token)
    assert dataclasses.replace(eng.scheduler).memory_fraction_of == "total"
