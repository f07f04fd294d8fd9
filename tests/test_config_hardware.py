"""Hardware profiles: every shipped file loads, units are SI, efficiency_from resolves, bad files fail
with a message naming the file and the key."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from servesim.config import Efficiency, HardwareProfile, list_hardware, load_hardware
from servesim.config.hardware import PRECISIONS, with_efficiency
from servesim.errors import ConfigError
from servesim.paths import hardware_dir

SHIPPED = ["a100-sxm-40gb", "a100-sxm-80gb", "b200", "gb200-nvl72", "h100-pcie", "h100-sxm",
           "h200-sxm", "h800-sxm", "l4", "l40s", "mi300x", "mi325x", "tpu-v5e"]
CALIBRATED = {"a100-sxm-80gb", "h100-sxm"}
FRACTIONS = ("gemm_max", "hbm_fraction", "attn_prefill_max",
             "scaleup_bw_fraction", "scaleout_bw_fraction", "pcie_bw_fraction")


def test_list_hardware_is_exactly_the_shipped_set():
    assert list_hardware() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_every_profile_loads_and_is_sane(name):
    hw = load_hardware(name)
    assert isinstance(hw, HardwareProfile)
    assert hw.name == name == hw.path.stem
    assert set(hw.peak_flops) == set(PRECISIONS)
    assert hw.peak_flops["bf16"] > 1e13  # every shipped part has > 10 TFLOP/s BF16
    assert all(v >= 0 for v in hw.peak_flops.values())
    assert hw.hbm_bytes > 1e10 and hw.hbm_bw > 1e11
    assert hw.pcie_bw > 0 and hw.scaleout_bw > 0 and hw.scaleup_bw >= 0
    assert hw.scaleup_domain >= 1 and hw.gpus_per_node >= 1
    assert hw.usd_per_hour > 0 and hw.price_source
    for field in FRACTIONS:
        assert 0 < getattr(hw.efficiency, field) <= 1
    # Lower precisions are never slower than BF16 where supported.
    for p in ("fp8", "int8", "fp4"):
        assert hw.peak_flops[p] == 0 or hw.peak_flops[p] >= hw.peak_flops["bf16"]


def test_h100_sxm_si_conversion():
    hw = load_hardware("h100-sxm")
    assert hw.hbm_bw == pytest.approx(3.35e12)
    assert hw.hbm_bytes == pytest.approx(80e9)
    assert hw.scaleup_bw == pytest.approx(450e9)  # 900 GB/s bidirectional -> 450 GB/s per direction
    assert hw.scaleout_bw == pytest.approx(50e9)  # 400 Gb/s / 8
    assert hw.pcie_bw == pytest.approx(64e9)
    assert hw.peak_flops["bf16"] == pytest.approx(989e12)
    assert hw.peak_flops["fp8"] == pytest.approx(1979e12)
    assert hw.peak_flops["int8"] == pytest.approx(1979e12)
    assert hw.peak_flops["fp4"] == 0.0
    assert hw.tdp_w == 700.0 and hw.usd_per_hour == 4.25
    assert hw.scaleup_domain == 8 and hw.gpus_per_node == 8
    # efficiencies are fitted numbers: check the unit conversion against the file itself
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    raw = tomllib.loads(hw.path.read_text())["efficiency"]
    eff = hw.efficiency
    assert eff.kernel_latency_s == pytest.approx(raw["kernel_latency_us"] * 1e-6)
    assert eff.elementwise_latency_s == pytest.approx(raw["elementwise_latency_us"] * 1e-6)
    assert eff.scaleup_latency_s == pytest.approx(raw["scaleup_latency_us"] * 1e-6)
    assert eff.p2p_large_message_bytes == pytest.approx(raw["p2p_large_message_mib"] * 2.0 ** 20)
    assert eff.gemm_half_tokens == raw["gemm_half_tokens"]


def test_a100_80gb_figures():
    hw = load_hardware("a100-sxm-80gb")
    assert hw.hbm_bw == pytest.approx(2.039e12)
    assert hw.scaleup_bw == pytest.approx(300e9)
    assert hw.peak_flops["fp8"] == 0.0
    assert hw.usd_per_hour == 2.21


def test_special_topologies():
    for name in ("l40s", "l4"):
        hw = load_hardware(name)
        assert hw.scaleup_bw == 0.0 and hw.scaleup_domain == 1
    tpu = load_hardware("tpu-v5e")
    assert tpu.peak_flops["bf16"] == pytest.approx(197e12)
    assert tpu.peak_flops["fp16"] == 0.0 and tpu.peak_flops["fp8"] == 0.0
    assert tpu.scaleup_bw == pytest.approx(200e9) and tpu.scaleup_domain == 256
    assert tpu.gpus_per_node == 8
    assert load_hardware("gb200-nvl72").scaleup_domain == 72
    assert load_hardware("h800-sxm").scaleup_bw == pytest.approx(200e9)


def test_efficiency_from_resolution():
    own = {n for n in SHIPPED if load_hardware(n).efficiency_from == ""}
    assert own == CALIBRATED
    h100, a100 = load_hardware("h100-sxm"), load_hardware("a100-sxm-80gb")
    assert h100.efficiency != a100.efficiency  # the two calibrations differ
    for name in SHIPPED:
        hw = load_hardware(name)
        if hw.efficiency_from:
            assert hw.efficiency_from in CALIBRATED
            assert hw.efficiency == load_hardware(hw.efficiency_from).efficiency
    assert load_hardware("h200-sxm").efficiency == h100.efficiency
    assert load_hardware("a100-sxm-40gb").efficiency == a100.efficiency


def test_load_by_path_equals_load_by_name_and_is_cached():
    by_name = load_hardware("h100-sxm")
    by_path = load_hardware(str(hardware_dir() / "h100-sxm.toml"))
    assert by_path == by_name
    assert load_hardware("h100-sxm") is by_name


def test_unknown_name_lists_available():
    with pytest.raises(ConfigError, match=r"unknown hardware 'foo'; available: a100-sxm-40gb, "):
        load_hardware("foo")
    with pytest.raises(ConfigError, match="not found"):
        load_hardware("/nonexistent/x.toml")


def test_profiles_are_frozen():
    hw = load_hardware("h100-sxm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        hw.hbm_bw = 1.0  # type: ignore[misc]


def test_with_efficiency_returns_a_modified_copy():
    hw = load_hardware("h100-sxm")
    tuned = with_efficiency(hw, gemm_max=0.7, kernel_latency_s=2e-6)
    assert tuned.efficiency.gemm_max == 0.7 and tuned.efficiency.kernel_latency_s == 2e-6
    assert tuned.efficiency.hbm_fraction == hw.efficiency.hbm_fraction
    assert hw.efficiency.gemm_max == load_hardware("h100-sxm").efficiency.gemm_max != 0.7  # original untouched
    assert tuned.hbm_bw == hw.hbm_bw
    with pytest.raises(ConfigError, match="gemm_maxx"):
        with_efficiency(hw, gemm_maxx=0.5)
    with pytest.raises(ConfigError, match=r"'hbm_fraction' must be in \(0, 1\]"):
        with_efficiency(hw, hbm_fraction=1.2)
    with pytest.raises(ConfigError, match="'kernel_latency_s' must be >= 0"):
        with_efficiency(hw, kernel_latency_s=-1.0)


def test_efficiency_fields_are_si_names():
    names = [f.name for f in dataclasses.fields(Efficiency)]
    assert names == ["gemm_max", "gemm_half_tokens", "kernel_latency_s", "hbm_fraction",
                     "attn_prefill_max", "scaleup_bw_fraction",
                     "scaleup_latency_s", "scaleout_bw_fraction", "scaleout_latency_s",
                     "pcie_bw_fraction", "pcie_latency_s", "norm_hbm_fraction", "rope_hbm_fraction",
                     "activation_hbm_fraction", "elementwise_latency_s", "collective_base_latency_s",
                     "p2p_bw_fraction", "p2p_latency_s", "p2p_large_bw_fraction",
                     "p2p_large_message_bytes", "fit_source"]


# -- malformed files ---------------------------------------------------------------------------

H100_TEXT = (hardware_dir() / "h100-sxm.toml").read_text()
H200_TEXT = (hardware_dir() / "h200-sxm.toml").read_text()


def _variant(tmp_path: Path, stem: str, text: str = H100_TEXT, set_: dict | None = None,
             drop: tuple = (), add_after: dict | None = None, rename: bool = True) -> Path:
    """Write a copy of a shipped profile with keys replaced, dropped or added; name = stem."""
    if rename:
        text = re.sub(r'^name = ".*"$', f'name = "{stem}"', text, count=1, flags=re.M)
    for key, value in (set_ or {}).items():
        text, n = re.subn(rf"^{re.escape(key)}\s*=.*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key  # test-helper sanity, not input validation
    for key in drop:
        text, n = re.subn(rf"^{re.escape(key)}\s*=.*\n", "", text, flags=re.M)
        assert n == 1, key
    for anchor, line in (add_after or {}).items():
        text, n = re.subn(rf"^({re.escape(anchor)}\s*=.*)$", rf"\1\n{line}", text, flags=re.M)
        assert n == 1, anchor
    path = tmp_path / f"{stem}.toml"
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_hardware(str(path))
    message = str(info.value)
    assert path.name in message, message  # every message names the file
    assert "\n" not in message
    return message


def test_copy_of_shipped_profile_loads(tmp_path):
    hw = load_hardware(str(_variant(tmp_path, "copy-ok")))
    assert hw.name == "copy-ok" and hw.hbm_bw == pytest.approx(3.35e12)


def test_unknown_key(tmp_path):
    msg = _error(_variant(tmp_path, "bad-unknown", add_after={"hbm_bandwidth_GBps": "hbm_bandwith_GBps = 1.0"}))
    assert "key 'memory.hbm_bandwith_GBps' is not a known key" in msg
    assert "did you mean 'memory.hbm_bandwidth_GBps'" in msg


def test_unknown_top_level_table(tmp_path):
    path = _variant(tmp_path, "bad-table")
    path.write_text(path.read_text() + "\n[extras]\nfoo = 1\n")
    assert "key 'extras' is not a known key" in _error(path)


def test_missing_key(tmp_path):
    msg = _error(_variant(tmp_path, "bad-missing", drop=("tdp_W",)))
    assert "key 'power.tdp_W' is missing" in msg


def test_missing_efficiency_key(tmp_path):
    msg = _error(_variant(tmp_path, "bad-missing-eff", drop=("pcie_latency_us",)))
    assert "key 'efficiency.pcie_latency_us' is missing" in msg


def test_negative_bandwidth(tmp_path):
    msg = _error(_variant(tmp_path, "bad-negative", set_={"hbm_bandwidth_GBps": "-1"}))
    assert "key 'memory.hbm_bandwidth_GBps' must be > 0, got -1" in msg


def test_zero_capacity_and_zero_bf16(tmp_path):
    assert "key 'memory.hbm_capacity_GB' must be > 0, got 0" in _error(
        _variant(tmp_path, "bad-capacity", set_={"hbm_capacity_GB": "0.0"}))
    assert "key 'compute.peak_bf16_TFLOPS' must be > 0" in _error(
        _variant(tmp_path, "bad-bf16", set_={"peak_bf16_TFLOPS": "0.0"}))


def test_fraction_above_one(tmp_path):
    msg = _error(_variant(tmp_path, "bad-fraction", set_={"gemm_max": "1.5"}))
    assert "key 'efficiency.gemm_max' must be a fraction in (0, 1], got 1.5" in msg


def test_fraction_zero(tmp_path):
    msg = _error(_variant(tmp_path, "bad-fraction0", set_={"hbm_fraction": "0.0"}))
    assert "key 'efficiency.hbm_fraction' must be a fraction in (0, 1]" in msg


def test_name_differs_from_stem(tmp_path):
    msg = _error(_variant(tmp_path, "bad-name", rename=False))
    assert "key 'name' must equal the file stem 'bad-name', got 'h100-sxm'" in msg


def test_wrong_types(tmp_path):
    assert "key 'memory.hbm_bandwidth_GBps' must be a number, got '3350'" in _error(
        _variant(tmp_path, "bad-type", set_={"hbm_bandwidth_GBps": '"3350"'}))
    assert "key 'interconnect.gpus_per_node' must be an integer, got 8.0" in _error(
        _variant(tmp_path, "bad-int", set_={"gpus_per_node": "8.0"}))
    assert "key 'interconnect.scaleup_domain_gpus' must be an integer, got True" in _error(
        _variant(tmp_path, "bad-bool", set_={"scaleup_domain_gpus": "true"}))


def test_integer_accepted_for_float_key(tmp_path):
    hw = load_hardware(str(_variant(tmp_path, "int-ok", set_={"hbm_bandwidth_GBps": "3350"})))
    assert hw.hbm_bw == pytest.approx(3.35e12)


def test_invalid_toml_syntax(tmp_path):
    path = tmp_path / "bad-syntax.toml"
    path.write_text('name = "bad-syntax"\n[compute\n')
    assert "not valid TOML" in _error(path)


def test_no_scaleup_requires_domain_one(tmp_path):
    msg = _error(_variant(tmp_path, "bad-domain", set_={"scaleup_bandwidth_GBps": "0.0"}))
    assert "key 'interconnect.scaleup_domain_gpus' must be 1" in msg


def test_efficiency_from_unknown(tmp_path):
    path = _variant(tmp_path, "bad-from", text=H200_TEXT, set_={"efficiency_from": '"h900"'})
    msg = _error(path)
    assert "key 'efficiency_from' names unknown profile 'h900'" in msg


def test_efficiency_from_with_own_block_names_the_engine_fits_only(tmp_path):
    # own [efficiency] kept (measured); efficiency_from names where the engine tables come from (issue #25)
    hw = load_hardware(str(_variant(tmp_path, "both", set_={"efficiency_from": '"a100-sxm-80gb"', "gemm_max": "0.5"})))
    assert hw.own_efficiency and hw.efficiency.gemm_max == 0.5 and hw.efficiency_from == "a100-sxm-80gb"
    assert not load_hardware("h200-sxm").own_efficiency and load_hardware("h100-sxm").own_efficiency
    msg = _error(_variant(tmp_path, "both-typo", set_={"efficiency_from": '"h100-sxn"'}))
    assert "key 'efficiency_from' names unknown profile 'h100-sxn'" in msg


def test_efficiency_block_missing(tmp_path):
    msg = _error(_variant(tmp_path, "bad-none", text=H200_TEXT, set_={"efficiency_from": '""'}))
    assert "key 'efficiency' is missing" in msg


def test_efficiency_from_sibling_file_resolves(tmp_path):
    # A sibling calibrated profile is preferred over the shipped one of the same name.
    _variant(tmp_path, "my-cal", set_={"gemm_max": "0.5"})
    hw = load_hardware(str(_variant(tmp_path, "my-gpu", text=H200_TEXT,
                                    set_={"efficiency_from": '"my-cal"'})))
    assert hw.efficiency.gemm_max == 0.5 and hw.efficiency_from == "my-cal"


def test_efficiency_from_chain_is_refused(tmp_path):
    # chain-b borrows from h100-sxm; chain-a borrows from chain-b -> error, a borrowed block must be measured.
    _variant(tmp_path, "chain-b", text=H200_TEXT)
    msg = _error(_variant(tmp_path, "chain-a", text=H200_TEXT, set_={"efficiency_from": '"chain-b"'}))
    assert "key 'efficiency_from' names 'chain-b', which itself borrows from 'h100-sxm'" in msg


def test_efficiency_from_cycle_is_refused_not_recursed(tmp_path):
    _variant(tmp_path, "cyc-b", text=H200_TEXT, set_={"efficiency_from": '"cyc-a"'})
    msg = _error(_variant(tmp_path, "cyc-a", text=H200_TEXT, set_={"efficiency_from": '"cyc-b"'}))
    assert "itself borrows from 'cyc-a'" in msg


def test_efficiency_from_self_is_refused(tmp_path):
    msg = _error(_variant(tmp_path, "selfish", text=H200_TEXT, set_={"efficiency_from": '"selfish"'}))
    assert "must not name the profile itself" in msg


def test_readme_documents_every_key():
    readme = (hardware_dir() / "README.md").read_text()
    keys = re.findall(r"^([a-zA-Z0-9_]+)\s*=", H100_TEXT, flags=re.M)
    assert len(keys) > 30
    for key in keys:
        assert key in readme, key
    assert "efficiency_from" in readme


def test_renamed_efficiency_key_names_its_replacement(tmp_path):
    path = _variant(tmp_path, "old-key", drop=("norm_hbm_fraction", "rope_hbm_fraction", "activation_hbm_fraction",
                                               "elementwise_latency_us"),
                    add_after={"pcie_latency_us": "elementwise_hbm_fraction = 0.6"})
    msg = _error(path)
    assert "elementwise_hbm_fraction" in msg and "norm_hbm_fraction" in msg and "elementwise_latency_us" in msg


@pytest.mark.parametrize("old, new", [("iteration_overhead_us = 1356.8", "host_step_us"),
                                      ("per_seq_overhead_us = 4.59", "host_per_seq_us"),
                                      ("attn_decode_hbm_fraction = 0.9", "attn_decode_hbm_fraction")])
def test_engine_keys_in_a_hardware_profile_name_the_engine_profile(tmp_path, old, new):
    # these moved to the engine profile; an older profile that still has one says where its value lives now
    msg = _error(_variant(tmp_path, "old-engine-key", add_after={"pcie_latency_us": old}))
    assert f"efficiency.{old.split()[0]}" in msg and "is no longer a key" in msg
    assert new in msg and "engines/<engine>.toml [hardware.<gpu>]" in msg and "--engine-output" in msg
