"""Pipeline layouts in Megatron-Core's syntax (--pipeline-layout, issue #24 item 1)."""
import dataclasses
import itertools

import pytest
from click.testing import CliRunner

from servesim.cli import main
from servesim.config import load_hardware, load_model
from servesim.errors import ConfigError, InfeasibleError
from servesim.training import TrainLayout, memory_per_gpu, train_step
from servesim.training.flops import model_flops_per_token
from servesim.training.pipeline import in_flight_chunks, in_flight_per_chunk, layout_text, pipeline_chunks, unit_flops
from servesim.training.pipeline_layout import balanced_layout, format_layout, parse_layout


@pytest.fixture(scope="module")
def dsv3():
    return load_model("deepseek-v3")


@pytest.fixture(scope="module")
def h100():
    return load_hardware("h100-sxm")


def test_megatron_docstring_example_expands():
    """Megatron-Core's own example: DeepSeek-V3's 61 layers on 32 stages."""
    st = parse_layout("Ettt|(tt|)*29,m|L")
    assert len(st) == 32
    assert st[0] == "Ettt" and st[1:30] == ["tt"] * 29 and st[30:] == ["m", "L"]
    assert "".join(st).count("t") == 61
    # nested groups and symbol repeats
    assert parse_layout("(E|(t*2|)*2)*1t*3L") == ["E", "tt", "tt", "tttL"]


def test_format_round_trips():
    for stages in (["Et", "tt", "tt", "tt", "mL"], ["E", "tttt", "tttt", "L"], ["Ettt"] + ["tt"] * 29 + ["m", "L"],
                   ["", "t", "", "tL"], ["Et*3".replace("*3", "tt")] + ["t"] * 5 + ["ttL"]):
        assert parse_layout(format_layout(stages)) == stages
    assert format_layout(["Et"] + ["tt"] * 30 + ["mL"]) == "Et|(tt|)*30mL"


def test_deepseek_v3_pp16(dsv3, h100):
    """PP 16 without VP: 3 layers with the embedding, 4 on each of the 14 middle stages, 2 with the MTP
    layer and the loss on the last (61 layers)."""
    lay = TrainLayout(tp=1, pp=16, dp=64, ep=64, sp=False, seq_len=4096, micro_batch=1, global_batch=1024,
                      recompute="full", dtype="bf16", pipeline_layout="Et*3|(t*4|)*14ttmL")
    chunks = pipeline_chunks(dsv3, lay)
    assert [len(r[0].layers) for r in chunks] == [3] + [4] * 14 + [2]
    assert chunks[0][0].embedding and chunks[0][0].layers == (0, 1, 2)
    last = chunks[-1][0]
    assert last.loss and last.mtp == 1 and last.layers == (59, 60)
    assert sorted(i for r in chunks for c in r for i in c.layers) == list(range(61))
    r = train_step(dsv3, h100, lay, check_memory=False)
    st = r.extra["stage_times_s"]
    assert r.extra["pipeline_layout"] == "Et*3|(t*4|)*14ttmL"
    assert r.extra["layers_per_rank"] == [3] + [4] * 14 + [2]
    # v = 1: the slowest rank sets the period, the others fill the ramp
    assert r.breakdown_s["pp_bubble"] == pytest.approx(sum(st) - max(st))
    # the MTP layer counts in the model FLOPs (as Megatron-Core counts it)
    assert r.model_flops_per_token == pytest.approx(model_flops_per_token(dsv3, 4096, mtp_layers=1))
    assert r.model_flops_per_token > model_flops_per_token(dsv3, 4096)
    # rank 0 holds 3 dense layers + the embedding; a middle rank 4 MoE layers: more parameters there
    mem = memory_per_gpu(dsv3, h100, lay)
    assert mem["stage"] > 0


def test_deepseek_v3_pp4_vp8(dsv3, h100):
    """PP 4 x VP 8 = 32 stages, in virtual-stage order: stage i on rank i mod 4, chunk i div 4."""
    text = "Et|(tt|)*30mL"
    lay = TrainLayout(tp=1, pp=4, vp=8, dp=64, ep=64, seq_len=4096, global_batch=1024, recompute="full",
                      pipeline_layout=text)
    chunks = pipeline_chunks(dsv3, lay)
    assert chunks[0][0].layers == (0,) and chunks[0][0].embedding
    assert chunks[1][0].layers == (1, 2) and chunks[0][1].layers == (7, 8)   # stage 1 = rank 1 chunk 0; stage 4 = rank 0 chunk 1
    assert chunks[3][7].layers == () and chunks[3][7].loss and chunks[3][7].mtp == 1
    assert [sum(len(c.layers) for c in r) for r in chunks] == [15, 16, 16, 14]
    r = train_step(dsv3, h100, lay, check_memory=False)
    st = r.extra["stage_times_s"]
    assert r.breakdown_s["pp_bubble"] == pytest.approx((sum(st) - max(st)) / 8)
    # an MTP layer placed before the last transformer layer is refused
    with pytest.raises(ConfigError) as e:
        pipeline_chunks(dsv3, dataclasses.replace(lay, pipeline_layout="Et|(tt|)*29mL|tL"))
    assert "\n" not in str(e.value)


def test_in_flight_per_chunk_follows_megatron_order():
    """p 4, v 2, m 8, rank 0: (4 - 0 - 1) 2 + (2 - 1) 4 + 1 = 11 forwards in flight; forward k runs
    chunk (k mod 8) div 4: 0,0,0,0,1,1,1,1,0,0,0 -> 7 of chunk 0, 4 of chunk 1."""
    lay = TrainLayout(pp=4, vp=2, global_batch=8)
    assert in_flight_chunks(lay, 0, 8) == 11
    assert in_flight_per_chunk(lay, 0, 8) == [7, 4]
    assert in_flight_per_chunk(lay, 3, 8) == [4, 1]   # (0) 2 + 4 + 1 = 5
    assert in_flight_per_chunk(dataclasses.replace(lay, vp=1), 1, 8) == [3]


def test_even_layout_equals_the_plain_split(h100):
    """Writing the even split as a layout changes nothing: same stage times, memory and step."""
    m = load_model("llama-3.1-70b")
    plain = TrainLayout(tp=8, pp=4, dp=2, sp=True, seq_len=4096, global_batch=64, recompute="selective")
    layout = dataclasses.replace(plain, pipeline_layout="Et*20|t*20|t*20|t*20L")
    a, b = train_step(m, h100, plain), train_step(m, h100, layout)
    assert a.extra["stage_times_s"] == pytest.approx(b.extra["stage_times_s"])
    assert a.step_time_s == pytest.approx(b.step_time_s)
    assert a.memory_bytes["total"] == pytest.approx(b.memory_bytes["total"])
    inter = dataclasses.replace(plain, vp=5, global_batch=64)
    inter_l = dataclasses.replace(inter, pipeline_layout="Et*4|" + "t*4|" * 18 + "t*4L")
    assert train_step(m, h100, inter).step_time_s == pytest.approx(train_step(m, h100, inter_l).step_time_s)


def _brute_min_max(costs, stages):
    """The slow obvious twin: every way to cut n units into `stages` contiguous non-empty parts."""
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0,) + cuts + (n,)
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@pytest.mark.parametrize("n,stages", [(8, 3), (10, 4), (12, 5), (9, 9)])
def test_balanced_layout_is_optimal(n, stages):
    costs = [3.0] + [float(1 + (i * 7) % 5) for i in range(n - 2)] + [4.0]
    units = ["E"] + ["t"] * (n - 2) + ["L"]
    st = balanced_layout(units, costs, stages)
    assert len(st) == stages and all(st) and "".join(st) == "".join(units)
    got, i = [], 0
    for s in st:
        got.append(sum(costs[i:i + len(s)]))
        i += len(s)
    assert max(got) == pytest.approx(_brute_min_max(costs, stages))


def test_auto_layout(dsv3, h100):
    """auto on a PP that does not divide the layers: the most balanced split by forward FLOPs, printed."""
    m = load_model("llama-3.1-405b")
    lay = TrainLayout(tp=8, pp=8, vp=8, dp=1, sp=True, seq_len=8192, global_batch=64, pipeline_layout="auto")
    # 126 layers over 64 stages: at most 2 layers a stage; the embedding has no FLOPs and joins the first
    # two layers, the LM head (2 h V = 4.2 GFLOP/token < one layer) stands alone
    assert layout_text(m, lay) == "Ett|(tt|)*62L"
    acc = dataclasses.replace(lay, pipeline_layout=None, account_for_embedding=True, account_for_loss=True)
    assert max(len(c.layers) for r in pipeline_chunks(m, lay) for c in r) == 2 == \
        max(len(c.layers) for r in pipeline_chunks(m, acc) for c in r)
    lay16 = TrainLayout(tp=1, pp=16, dp=64, ep=64, seq_len=4096, global_batch=1024, pipeline_layout="auto")
    stages = parse_layout(layout_text(dsv3, lay16))
    cost = []
    for s in stages:
        cost.append(sum(unit_flops(dsv3, u, 0 if u != "t" else 3, 4096) for u in s))
    # no stage costs more than 1.3 MoE layers above the average: the split is balanced
    assert max(cost) <= sum(cost) / 16 + 1.3 * unit_flops(dsv3, "t", 10, 4096)
    r = train_step(dsv3, h100, dataclasses.replace(lay16, recompute="full"), check_memory=False)
    assert r.extra["pipeline_layout"] == layout_text(dsv3, lay16)


@pytest.mark.parametrize("layout,kw,needles", [
    ("Et|(tt|)*30xL", {}, ["unknown symbol 'x'", "position 12"]),
    ("Et|(tt|*30mL", {}, ["unbalanced parentheses", "position 4"]),
    ("Et|tt)*30mL", {}, ["unbalanced parentheses", "')'"]),
    ("Et|(tt|)*30mL", {"vp": 4}, ["8 virtual stages", "--vp is 4", "--vp 8"]),
    ("Et|(tt|)*29t|mL", {}, ["places 60 transformer layers", "deepseek-v3 has 61"]),
    ("Et|(tt|)*30mL|", {}, ["33 stages", "4 x 8 = 32"]),
    ("tE|(tt|)*30mL", {}, ["E (embedding) must come first"]),
    ("Et|(tt|)*30Lm", {}, ["L (loss) must come last"]),
    ("Et|(tt|)*", {}, ["needs a repeat count"]),
])
def test_bad_layouts_are_one_line_exit_2(layout, kw, needles):
    args = ["train", "--model", "deepseek-v3", "--gpus", "256", "--pp", "4", "--vp", str(kw.get("vp", 8)), "--ep",
            "64", "--pipeline-layout", layout, "--seq-len", "4096", "--global-batch", "1024"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("servesim: error: --pipeline-layout")
    for n in needles:
        assert n in line, line


def test_layout_conflicts_and_pp1(dsv3, h100):
    with pytest.raises(ConfigError) as e:
        pipeline_chunks(dsv3, TrainLayout(pp=4, vp=8, first_stage_layers=8, pipeline_layout="Et|(tt|)*30mL"))
    assert "drop --first-stage-layers" in str(e.value)
    with pytest.raises(ConfigError):
        train_step(dsv3, h100, TrainLayout(pp=1, dp=8, pipeline_layout="auto"))
    # without a layout, a split that does not divide suggests one
    with pytest.raises(InfeasibleError) as e:
        train_step(dsv3, h100, TrainLayout(pp=16, dp=1, global_batch=16))
    assert "--pipeline-layout auto" in str(e.value)


def test_cli_summary_shows_the_layout():
    r = CliRunner().invoke(main, ["train", "--model", "llama-3.1-8b", "--gpus", "24", "--pp", "3", "--pipeline-layout",
                                  "auto", "--seq-len", "4096", "--global-batch", "48"])
    assert r.exit_code == 0, r.output
    assert "layout=" in r.output and "(auto)" in r.output


def _readme_train_commands(quick: bool):
    from test_readme_examples import readme_commands
    cmds = readme_commands(("train",))
    if quick:   # --search and --gpus lists have their own CLI tests; the slow test runs them as written
        cmds = [a for a in cmds if "--search" not in a and "," not in a[a.index("--gpus") + 1]]
    return cmds


def _run_all(cmds, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in cmds:
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, (args, r.output)


def test_readme_train_examples_run(tmp_path, monkeypatch):
    """Every single-layout `servesim train` line of the README's bash blocks runs as written (issue #24)."""
    cmds = _readme_train_commands(quick=True)
    assert len(cmds) >= 10
    _run_all(cmds, tmp_path, monkeypatch)


@pytest.mark.slow   # --search and the scaling figure: ~15 s
def test_every_readme_train_example_runs(tmp_path, monkeypatch):
    _run_all(_readme_train_commands(quick=False), tmp_path, monkeypatch)
