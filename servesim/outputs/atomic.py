"""Writing outputs so that nothing is ever half-written, and stopping cleanly on SIGINT / SIGTERM.

- `OutputDir`: an output folder checked before any work (an empty path, a file, a folder under a
  file, an unwritable place: one-line `ConfigError`s), whose files are written into a staging folder
  inside it (`.servesim-partial-<pid>`) and renamed into place when the command has finished. An
  interrupted or failed run therefore leaves the previous complete output (the staging folder is
  removed), never a truncated file. Work saved while the command runs (a sweep's points) is declared
  with `begin_progress`: an `INCOMPLETE` file in the folder says what is there and what is missing
  until the command commits.
- `atomic_file` / `write_text_atomic`: one file (a calibrated profile) written to a temporary name in
  its folder and renamed.
- `signal_handlers`: SIGTERM raises `Terminated` (like SIGINT's KeyboardInterrupt), so cleanup runs;
  the CLI turns both into one line and exit status 143 / 130 (128 + the signal number).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from ..errors import ConfigError

INCOMPLETE = "INCOMPLETE"
_STAGE_PREFIX = ".servesim-partial-"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread (a BaseException, like KeyboardInterrupt, so that
    `except Exception` never swallows it)."""

    signum = signal.SIGTERM


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def signal_handlers():
    """While inside: SIGTERM raises `Terminated`; SIGINT keeps raising KeyboardInterrupt. Restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_blocked():
    """Hold SIGINT / SIGTERM while cleaning up or renaming, so a signal cannot cut it short; the first
    one held is handled as the block ends. Held in Python, by handlers that note it: a signal mask
    would hold it only in this thread, and the kernel hands a process's signal to any thread that
    does not mask it (numpy's BLAS threads), whose arrival Python then handles at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = {s: signal.signal(s, lambda signum, frame: held.append(signum))
              for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        if held:
            h = before[held[0]]
            if callable(h):
                h(held[0], None)        # raises (KeyboardInterrupt, Terminated) or holds it further out
            elif h == signal.SIG_DFL:
                os.kill(os.getpid(), held[0])


def signal_name(exc: BaseException) -> str:
    return "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"


def exit_status(exc: BaseException) -> int:
    """128 + the signal number, as a shell reports a process killed by it."""
    return 128 + int(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def add_note(exc: BaseException, note: str) -> None:
    """A line for the CLI's interrupt message (what was left on disk)."""
    notes = getattr(exc, "servesim_notes", None)
    if notes is None:
        notes = []
        try:
            exc.servesim_notes = notes
        except AttributeError:
            return
    notes.append(note)


def _why(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__


# ------------------------------------------------------------------------------------------------
# checks before any work


def check_output_dir(path, option: str = "-o", create: bool = True) -> tuple[Path, bool]:
    """Create the folder if needed and prove it writable (``create=False``: prove it, then remove what
    was created). Returns (folder, created)."""
    text = os.fspath(path) if path is not None else ""
    if not str(text).strip():
        raise ConfigError(f"{option}: empty path; name an output folder, e.g. {option} out/")
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{option} {text}: exists and is not a folder; name a folder (new or existing)")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{option} {text}: {parent} is a file, not a folder; name a folder elsewhere")
            break
    created = not p.exists()
    made = [q for q in (p, *p.parents) if not q.exists()][::-1]     # the folders this call would create
    try:
        with _signals_blocked():
            p.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".servesim-probe-", dir=p)
            os.close(fd)
            os.unlink(probe)
            if not create:
                for q in reversed(made):
                    _remove_empty(q)
    except OSError as e:
        for q in reversed(made):
            _remove_empty(q)
        raise ConfigError(f"{option} {text}: cannot write there ({_why(e)}); name a folder you can write") from None
    except (KeyboardInterrupt, Terminated) as exc:     # a signal held while creating arrives as the block ends
        for q in reversed(made):
            _remove_empty(q)
        add_note(exc, f"nothing written to {p}" if created else f"the previous contents of {p} are untouched")
        raise
    return p, created


def check_output_file(path, option: str = "-o") -> Path:
    """A file to write: a non-empty path, not a folder nor a device, in a folder that exists or can be
    created and is writable (nothing is created here)."""
    text = os.fspath(path) if path is not None else ""
    if not str(text).strip():
        raise ConfigError(f"{option}: empty path; name the file to write")
    p = Path(text)
    if p.exists() and (p.is_dir() or not p.is_file()):
        kind = "a folder" if p.is_dir() else "not a regular file"
        raise ConfigError(f"{option} {text}: is {kind}; name a file to write")
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{option} {text}: {parent} is a file, not a folder; name a file elsewhere")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {text}: cannot write in {parent} (permission denied)")
    return p


def _remove_empty(p: Path) -> None:
    try:
        p.rmdir()
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------
# single files


@contextlib.contextmanager
def atomic_file(path, option: str = "-o"):
    """Yield a temporary path in `path`'s folder; on success it is renamed to `path` (the previous file
    stays whole until then); on any error or interrupt it is removed."""
    target = check_output_file(path, option)
    if target.is_symlink():
        target = target.resolve()
    tmp = None
    try:
        with _signals_blocked():    # a signal waits until the temporary file's name is held
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial" + target.suffix,
                                        dir=target.parent)
            os.close(fd)
            tmp = Path(name)
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot write there ({_why(e)})") from None
    except (KeyboardInterrupt, Terminated):
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
    try:
        yield tmp
        with _signals_blocked():
            if target.exists():
                os.chmod(tmp, target.stat().st_mode & 0o7777)
            else:
                os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, target)
    except OSError as e:
        raise ConfigError(f"{option} {path}: cannot write it ({_why(e)})") from None
    finally:
        with _signals_blocked():
            tmp.unlink(missing_ok=True)


def write_text_atomic(path, text: str, option: str = "-o") -> Path:
    with atomic_file(path, option) as tmp:
        tmp.write_text(text)
    return Path(path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------------------------------------
# folders


class OutputDir:
    """An output folder written all or nothing (see the module docstring).

    with OutputDir(path, "-o", "servesim simulate") as out:    # checked and created here
        ... the work ...
        write_outputs(result, out.stage)                        # into the staging folder
    # on leaving without an error the staged files are renamed into `path`
    """

    def __init__(self, path, option: str = "-o", command: str = "servesim"):
        self.option, self.command = option, command
        self.path, self._created = check_output_dir(path, option)
        self._stage: Path | None = None
        self._last_stage: Path | None = None
        self._progress = None          # callable -> (present, missing) lines while work is saved
        self._hint = ""
        self.committed: list[Path] = []
        self.done = False
        try:
            self._clean_stale()
        except (KeyboardInterrupt, Terminated) as exc:     # interrupted before the `with` body: as after it
            self.discard(exc)
            raise

    # -- staging ----------------------------------------------------------------------------------
    @property
    def stage(self) -> Path:
        if self._stage is None:
            try:
                with _signals_blocked():    # a signal waits until the folder's name is held (discard removes it)
                    self._stage = Path(tempfile.mkdtemp(prefix=f"{_STAGE_PREFIX}{os.getpid()}-", dir=self.path))
            except OSError as e:
                raise ConfigError(f"{self.option} {self.path}: cannot write there ({_why(e)})") from None
        return self._stage

    def final(self, p) -> Path:
        """The path a staged file will have once committed."""
        p = Path(p)
        for stage in (self._stage, self._last_stage):
            if stage is not None and p.is_relative_to(stage):
                return self.path / p.relative_to(stage)
        return p

    def write(self, fn, *args, **kw):
        """fn(staging folder, ...) with write errors (a full disk, a name taken by a folder) as one line."""
        try:
            return fn(self.stage, *args, **kw)
        except OSError as e:
            where = getattr(e, "filename", None)
            where = f" ({self.final(where).name})" if where else ""
            raise ConfigError(f"{self.option} {self.path}: cannot write the outputs{where}: {_why(e)}") from None

    # -- work saved while running -----------------------------------------------------------------
    def begin_progress(self, describe, hint: str = "") -> None:
        """Declare work written straight into the folder while the command runs; ``describe()`` ->
        (lines on what is present, lines on what is missing); ``hint``: how to finish. Marked
        INCOMPLETE until the commit."""
        self._progress, self._hint = describe, hint
        self._mark("is running or was stopped before it finished")

    def _mark(self, state: str, extra=()) -> None:
        present, missing = self._progress() if self._progress else ([], [])
        when = datetime.datetime.now().isoformat(timespec="seconds")
        lines = [f"{self.command} {state} ({when}); this folder is incomplete.", ""]
        lines += list(extra)
        if present:
            lines += ["Present:"] + [f"  {x}" for x in present]
        if missing:
            lines += ["Missing:"] + [f"  {x}" for x in missing]
        if self._progress and self._hint:
            lines += ["", self._hint]
        lines += ["", f"This file is removed when {self.command} completes in this folder."]
        tmp = self.path / f".{INCOMPLETE}.{os.getpid()}"
        try:
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, self.path / INCOMPLETE)
        except OSError:
            tmp.unlink(missing_ok=True)

    # -- the end ----------------------------------------------------------------------------------
    def commit(self) -> list[Path]:
        """Rename every staged file into the folder; drop the INCOMPLETE marker. Idempotent."""
        if self.done:
            return self.committed
        files = sorted(p for p in self._stage.rglob("*") if p.is_file()) if self._stage is not None else []
        moved: list[Path] = []
        with _signals_blocked():
            try:
                if files:
                    names = [str(p.relative_to(self._stage)) for p in files]
                    self._mark("is replacing its outputs", extra=["Being replaced: " + ", ".join(names), ""])
                for p in files:
                    dest = self.path / p.relative_to(self._stage)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(p, dest)
                    moved.append(dest)
                (self.path / INCOMPLETE).unlink(missing_ok=True)
            except OSError as e:
                left = [str(p.relative_to(self._stage)) for p in files if self.path / p.relative_to(self._stage)
                        not in moved]
                self._mark("failed while replacing its outputs",
                           extra=["Written: " + (", ".join(str(m.name) for m in moved) or "none"),
                                  "Not written (any present are from an earlier run): " + ", ".join(left), ""])
                raise ConfigError(f"{self.option} {self.path}: cannot write the outputs: {_why(e)}; "
                                  f"{self.path / INCOMPLETE} lists what is missing") from None
            finally:
                self._drop_stage()
        self.committed, self.done = moved, True
        return moved

    def discard(self, exc: BaseException | None = None) -> None:
        """Remove the staging folder; mark INCOMPLETE if work was saved; note for an interrupt message."""
        if self.done:
            return
        with _signals_blocked():
            self._drop_stage()
            if self._progress is not None:
                how = f"was interrupted by {signal_name(exc)}" if _is_interrupt(exc) else "stopped on an error"
                self._mark(how)
            elif self._created:
                _remove_empty(self.path)
        self.done = True
        if exc is not None and _is_interrupt(exc):
            if self._progress is not None:
                add_note(exc, f"{self.path / INCOMPLETE} lists what was saved and what is missing")
            elif self._created:
                add_note(exc, f"nothing written to {self.path}")
            else:
                add_note(exc, f"the previous contents of {self.path} are untouched")

    def _drop_stage(self) -> None:
        if self._stage is not None:
            shutil.rmtree(self._stage, ignore_errors=True)
            self._stage, self._last_stage = None, self._stage

    def _clean_stale(self) -> None:
        """Staging folders left by a process that was killed outright (SIGKILL, power loss)."""
        for d in self.path.glob(f"{_STAGE_PREFIX}*"):
            try:
                pid = int(d.name[len(_STAGE_PREFIX):].split("-")[0])
            except ValueError:
                continue
            if pid != os.getpid() and not _alive(pid):
                shutil.rmtree(d, ignore_errors=True)

    def __enter__(self) -> "OutputDir":
        return self

    def __exit__(self, etype, exc, tb) -> None:
        if exc is None:
            self.commit()
        else:
            self.discard(exc)


def _is_interrupt(exc) -> bool:
    return isinstance(exc, (KeyboardInterrupt, Terminated))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def output_dir(path, option: str = "-o", command: str = "servesim"):
    """`OutputDir(path, ...)`, or a context yielding None when no folder was asked for (path None)."""
    if path is None:
        return contextlib.nullcontext(None)
    return OutputDir(path, option, command)
