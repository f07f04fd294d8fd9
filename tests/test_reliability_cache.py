"""Compiled-code cache (issue #16): the guard drops numba's cached servesim code wherever numba keeps
it (NUMBA_CACHE_DIR included) when any source jitted code can reach changes, and a changed formula
changes the result. Each test works on a copy of the package in a temporary folder."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import servesim
from servesim import _jitcache

REPO = Path(__file__).resolve().parents[1]
PKG = Path(servesim.__file__).resolve().parent


def _copy(tmp_path: Path) -> Path:
    """A copy of the package (and links to the data folders) under tmp_path/src; returns src."""
    src = tmp_path / "src"
    shutil.copytree(PKG, src / "servesim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    for d in ("hardware_profiles", "engines", "workloads"):
        (src / d).symlink_to(REPO / d)
    return src


def _run(src: Path, code: str, cache: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(src), NUMBA_CACHE_DIR=str(cache))
    pre = f"import servesim; assert servesim.__file__.startswith({str(src)!r}), servesim.__file__\n"
    r = subprocess.run([sys.executable, "-c", pre + code], cwd=src, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _cached_files(cache: Path) -> set[str]:
    return {str(p.relative_to(cache)) for p in cache.rglob("*") if p.suffix in (".nbi", ".nbc")}


def test_reachable_sources_include_the_constants_kernels_read():
    names = {str(p.relative_to(PKG)) for p in _jitcache.jitted_sources()}
    # files defining jitted code, and what they import: constants (codes, params) are compiled in
    for f in ("engine/kernel.py", "engine/codes.py", "costmodel/iteration.py", "costmodel/kernels.py",
              "costmodel/params.py", "costmodel/roofline.py", "costmodel/collectives.py"):
        assert f in names, f
    for f in ("cli/main.py", "metrics.py", "api.py", "report/build.py"):   # not reachable from jitted code
        assert f not in names, f


def test_numba_picks_one_of_the_guarded_folders(tmp_path):
    # ask numba's own locator, with NUMBA_CACHE_DIR set and unset, where it caches the kernel
    code = ("import json\nfrom numba.core.caching import CompileResultCacheImpl\n"
            "from servesim import _jitcache\nfrom servesim.engine.kernel import run_nb\n"
            "from servesim.costmodel.kernels import gemm_time_nb\n"
            "dirs = {str(d) for d in _jitcache.cache_dirs(_jitcache.jitted_sources())}\n"
            "got = [CompileResultCacheImpl(f.py_func).locator.get_cache_path() for f in (run_nb, gemm_time_nb)]\n"
            "print(json.dumps([g in dirs for g in got] + got))")
    src = _copy(tmp_path)
    out = json.loads(_run(src, code, tmp_path / "numba-cache"))
    assert out[:2] == [True, True] and all(p.startswith(str(tmp_path / "numba-cache")) for p in out[2:]), out


SLOW = pytest.mark.slow     # ~2.5 CPU s each: one that drops and one that keeps run by default


@pytest.mark.parametrize("edit, drops", [
    ("costmodel/kernels.py", True),      # a jitted cost function the engine kernel inlines
    pytest.param("costmodel/params.py", True, marks=SLOW),   # constants read by jitted code (no njit in the file)
    pytest.param("engine/codes.py", True, marks=SLOW),
    pytest.param("engine/kernel.py", True, marks=SLOW),
    ("cli/main.py", False),              # nothing jitted reaches it: the cache stays
    pytest.param("metrics.py", False, marks=SLOW),
])
def test_changed_source_drops_the_cache_in_numba_cache_dir(tmp_path, edit, drops):
    src = _copy(tmp_path)
    cache = tmp_path / "numba-cache"
    listing = ("from servesim import _jitcache\n"
               "print('\\n'.join(str(d) for d in _jitcache.cache_dirs(_jitcache.jitted_sources())))")
    dirs = [Path(p) for p in _run(src, listing, cache).split()]
    ours = [d for d in dirs if d.is_relative_to(cache)]
    # (servesim: the package's own folder, for batchmeans.py)
    assert {d.name.split("_")[0] for d in ours} == {"engine", "costmodel", "calibrate", "servesim"}
    for d in ours:                                   # stand-ins for what numba wrote
        d.mkdir(parents=True, exist_ok=True)
        (d / "f-1.py311.nbi").write_bytes(b"index")
        (d / "f-1.py311.1.nbc").write_bytes(b"code")
    before = _cached_files(cache)
    assert len(before) == 2 * len(ours)
    _run(src, "", cache)                             # unchanged sources: the cache stays
    assert _cached_files(cache) == before
    f = src / "servesim" / edit
    f.write_text(f.read_text() + "\n# edited\n")
    _run(src, "", cache)
    assert _cached_files(cache) == (set() if drops else before)
    digest = _run(src, "from servesim import _jitcache\nprint(_jitcache.sources_digest())", cache).strip()
    assert {(d / _jitcache.STAMP_NAME).read_text().strip() for d in ours} == {digest}


def test_unwritable_cache_folder_is_not_an_error(tmp_path):
    src = _copy(tmp_path)
    cache = tmp_path / "ro-cache"
    cache.mkdir()
    cache.chmod(0o500)
    try:
        _run(src, "print('ok')", cache)
    finally:
        cache.chmod(0o700)


@pytest.mark.slow
def test_changed_formula_changes_the_result(tmp_path):
    """A tiny simulation, a constant changed in a jitted cost function of another file than the engine
    kernel (decode attention reads the KV cache 3 times over instead of once), the same
    NUMBA_CACHE_DIR: the new physics runs, not the cached old code."""
    src = _copy(tmp_path)
    cache = tmp_path / "numba-cache"
    code = ("r = servesim.simulate(num_requests=20, isl=2000, osl=50, seed=0)\n"
            "print(repr(r.summary['tpot_ms']['mean']))")
    first = float(_run(src, code, cache))
    assert float(_run(src, code, cache)) == first               # warm: the same result
    kernels = src / "servesim" / "costmodel" / "kernels.py"
    text = kernels.read_text()
    old = "nbytes = kv_tokens * 2.0 * kv_heads * head_dim * kv_bytes"
    assert text.count(old) == 1
    kernels.write_text(text.replace(old, "nbytes = kv_tokens * 6.0 * kv_heads * head_dim * kv_bytes"))
    changed = float(_run(src, code, cache))
    assert changed > first * 1.05, (first, changed)
    assert float(_run(src, code, tmp_path / "fresh-cache")) == changed   # exactly what a cold cache gives
