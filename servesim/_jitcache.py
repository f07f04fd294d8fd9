"""Keep numba's on-disk cache honest, wherever numba keeps it.

numba invalidates a cached function only when its own file changes, not when a jitted function it
calls, or a constant it reads, lives in another file: after editing the cost model, the engine would
silently run the old formulas. On import we hash the content of every servesim source that jitted
code can reach (the files defining `@njit` functions and, transitively, the servesim modules they
import) and compare it with a stamp kept in each folder numba caches those files in -- the one
numba may pick: `NUMBA_CACHE_DIR` when set, the package's `__pycache__`, the user-wide cache
(`numba.core.caching`'s locators, in that order). On a mismatch that folder's compiled files
(`*.nbi`, `*.nbc`) are dropped and numba recompiles.
Caching stays a speed-up, never a correctness requirement.
"""
from __future__ import annotations

import ast
import hashlib
import os
from pathlib import Path

_ROOT = Path(os.path.abspath(__file__)).parent   # as numba sees the sources (not resolved)
_PACKAGE = _ROOT.name
STAMP_NAME = "servesim-numba-sources.sha256"


def _module_file(dotted: str) -> Path | None:
    p = _ROOT.parent.joinpath(*dotted.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    q = p.with_suffix(".py")
    return q if q.is_file() else None


def _imports(path: Path, tree: ast.AST) -> set[Path]:
    """The servesim source files that `path` imports (absolute or relative imports)."""
    parts = list(path.relative_to(_ROOT.parent).with_suffix("").parts)
    package = parts[:-1]
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name == _PACKAGE or name.startswith(_PACKAGE + "."):
                f = _module_file(name)
                if f is not None:
                    out.add(f)
    return out


def jitted_sources() -> list[Path]:
    """Every servesim file defining jitted code, plus the servesim modules they import, transitively."""
    texts = {p: p.read_bytes() for p in _ROOT.rglob("*.py") if p.name != "_jitcache.py"}
    todo = [p for p, t in texts.items() if b"njit" in t or b"numba.jit" in t]
    seen: set[Path] = set()
    while todo:
        p = todo.pop()
        if p in seen or p not in texts:
            continue
        seen.add(p)
        try:
            tree = ast.parse(texts[p])
        except SyntaxError:
            continue   # numba will report it when the module is imported
        todo.extend(_imports(p, tree) - seen)
    return sorted(seen)


def sources_digest(files: list[Path] | None = None) -> str:
    h = hashlib.sha256()
    for p in files if files is not None else jitted_sources():
        h.update(str(p.relative_to(_ROOT)).encode())
        h.update(b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def _numba_cache_dir() -> str:
    """`NUMBA_CACHE_DIR` as numba reads it (its config once imported, else the environment)."""
    import sys
    config = getattr(sys.modules.get("numba.core.config"), "CACHE_DIR", None)
    return config if config is not None else os.environ.get("NUMBA_CACHE_DIR", "")


def _user_wide_cache() -> Path:
    """numba's user-wide cache folder (its vendored appdirs.user_cache_dir("numba"))."""
    import sys
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "numba" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "numba"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba"


def cache_dirs(files: list[Path]) -> dict[Path, bool]:
    """Every folder numba may cache the functions defined in `files` in, for its locators in order:
    `NUMBA_CACHE_DIR`/<folder>_<sha1 of the source folder> when set, the source folder's
    `__pycache__`, and the user-wide cache (used when `__pycache__` is not writable). All of them
    are checked, so a stale file is dropped whichever numba picks; numba itself is not imported.
    Maps each folder to whether to create it (not the user-wide one: it may never be used)."""
    return _dirs_of({p.parent for p in files if b"njit" in p.read_bytes() or b"numba.jit" in p.read_bytes()})


def _dirs_of(folders) -> dict[Path, bool]:
    """`cache_dirs` of the folders holding jitted functions."""
    dirs: dict[Path, bool] = {}
    user_dir = _numba_cache_dir()
    for folder in folders:
        sub = folder.name + "_" + hashlib.sha1(str(folder).encode()).hexdigest()   # numba's subpath
        if user_dir:
            dirs[Path(user_dir) / sub] = True
        dirs[folder / "__pycache__"] = True
        dirs[_user_wide_cache() / sub] = False
    return dirs


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


QUICK_NAME = "servesim-numba-sources.quick.json"


def _quick_key() -> str:
    """Every servesim source's path, size and modification time (numba's own test of a changed file),
    hashed: when it matches the key stored with the digest, the sources have not changed since."""
    h = hashlib.sha1()
    for p in sorted(_ROOT.rglob("*.py")):
        st = p.stat()
        h.update(f"{p.relative_to(_ROOT)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _sources_state() -> tuple[str, dict[Path, bool]]:
    """(the jitted sources' digest, `cache_dirs`), from the quick index in the package's __pycache__
    when the sources are as they were when it was written (reading and parsing ~100 files costs
    ~0.1 s at every start), else computed and the index rewritten."""
    import json
    index = _ROOT / "__pycache__" / QUICK_NAME
    key = _quick_key()
    try:
        saved = json.loads(index.read_text())
        if saved["key"] == key:
            files = [_ROOT / f for f in saved["jitted_folders"]]    # (one file per folder: what cache_dirs reads)
            return saved["digest"], _dirs_of({f.parent for f in files})
    except (OSError, ValueError, KeyError, TypeError):
        pass
    files = jitted_sources()
    digest = sources_digest(files)
    folders = {p.parent for p in files if b"njit" in p.read_bytes() or b"numba.jit" in p.read_bytes()}
    firsts = sorted(str(min(p for p in files if p.parent == d).relative_to(_ROOT)) for d in folders)
    try:
        index.parent.mkdir(exist_ok=True)
        _write_atomic(index, json.dumps({"key": key, "digest": digest, "jitted_folders": firsts}))
    except OSError:
        pass
    return digest, _dirs_of(folders)


def ensure_fresh() -> None:
    """Drop numba's compiled servesim code wherever it is cached if any jitted source changed."""
    try:
        digest, dirs = _sources_state()
    except OSError:
        return
    for d, create in dirs.items():
        stamp = d / STAMP_NAME
        try:
            if stamp.is_file() and stamp.read_text().strip() == digest:
                continue
            if d.is_dir():
                for f in list(d.iterdir()):
                    if f.suffix in (".nbi", ".nbc"):
                        f.unlink(missing_ok=True)
            elif not create:
                continue
            d.mkdir(parents=True, exist_ok=True)
            _write_atomic(stamp, digest + "\n")
        except OSError:
            pass   # read-only: numba cannot cache there either


# ------------------------------------------------------------------ the cold-compile notice
# CPU seconds of a plain run's cold compile on this project's 2-core machine
# (experiments/compile_times.py; the figures in experiments/results/compile_times.md; 12.1-14.0 s,
# medians of 3-4 pairs, at load average 2.1-2.9 from other jobs, README Speed, 2026-12-06, session 2).
COLD_COMPILE_S = 12
NOTICE = "compiling the simulator (first run only, about {s} s)"
_notice = {"installed": False, "said": False}


def compile_notice() -> None:
    """From now on, the first compilation of a servesim jitted function in this process (numba found
    nothing cached for it) prints one line on stderr, `NOTICE`, before the compile starts: a cold
    compile takes far more than a second. Listens to numba's "numba:compile" event; idempotent."""
    if _notice["installed"]:
        return
    import sys

    from numba.core import event

    class _Notice(event.Listener):
        def on_start(self, ev):
            if _notice["said"]:
                return
            func = getattr(ev.data.get("dispatcher"), "py_func", None)
            if (getattr(func, "__module__", None) or "").startswith(_PACKAGE + "."):
                _notice["said"] = True
                print(NOTICE.format(s=COLD_COMPILE_S), file=sys.stderr, flush=True)

        def on_end(self, ev):
            pass

    event.register("numba:compile", _Notice())
    _notice["installed"] = True
