"""The check every bad-input CLI test makes: exit status 2, no traceback, and exactly one line,
`servesim: error: ...`, naming what was wrong (each phrase in `must_contain` in that line)."""
from click.testing import CliRunner

from servesim.cli import main


def one_line_error(*args, must_contain=()) -> str:
    args = [str(a) for a in args]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (args, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
    assert "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servesim: error:"), (args, r.output)
    for s in must_contain:
        assert s in lines[0], (s, lines[0])
    return lines[0]


def stderr_error(*args, must_contain=()):
    """The same check on standard error alone, for commands that also print a result (plan's "no
    plan" table) before failing; returns click's Result."""
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("servesim: error:"), r.stderr
    for s in must_contain:
        assert s in err[0], err[0]
    return r
