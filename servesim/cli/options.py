"""The click options of simulate, sweep and plan, made from the SimConfig declarations
(`servesim.options`): one flag per field, same name, default, help and choices."""
from __future__ import annotations

import click


class Choices(click.ParamType):
    """A choice option whose list is read from its declaration only when shown; the value is checked
    by `checks.check_sim_config` (one line, with the closest choice)."""
    name = "choice"

    def __init__(self, option):
        self.option = option

    def get_metavar(self, param, ctx=None):
        return "[" + "|".join(self.option.choice_list()) + "]"

    def convert(self, value, param, ctx):
        return value


class SloParam(click.ParamType):
    """--slo TEXT parsed into a `servesim.slo.Slo` while the command line is read, before any work."""
    name = "slo"

    def convert(self, value, param, ctx):
        from ..slo import parse_slo
        return parse_slo(value, param.opts[0] if param is not None else "--slo")


class Duration(click.ParamType):
    """600s, 10min, 500ms -> seconds."""
    name = "duration"

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        from ..metrics import parse_duration
        return parse_duration(value, param.opts[0] if param is not None else "--duration")


SLO = SloParam()


class SpeculativeParam(click.ParamType):
    """--speculative TEXT parsed into a `costmodel.speculative.Speculative` as the command line is read."""
    name = "speculative"

    def convert(self, value, param, ctx):
        from ..costmodel.speculative import parse_speculative
        return parse_speculative(value)


def click_option(name: str, **overrides):
    """The click option of one SimConfig field; ``overrides`` replace click keywords (e.g. a command's
    own default)."""
    from ..options import defaults, flag, options
    o, default = options()[name], defaults()[name]
    kw = dict(default=default, help=o.help_text(), show_default=default is not None)
    if o.kind == "int":
        kw["type"] = int
    elif o.kind == "float":
        kw["type"] = float
    elif o.kind == "choice":
        kw["type"] = Choices(o)
    elif o.kind == "slo":
        kw["type"] = SLO
    elif o.kind == "speculative":
        kw.update(type=SpeculativeParam(), metavar="METHOD:k=K[:...]")
    elif o.kind == "duration":
        kw.update(type=Duration(), default=None if default is None else f"{default:g}s")
    elif o.kind == "bool":
        kw = dict(is_flag=True, default=default, help=o.help_text())
        if default is None or default is True:      # on/off (None: the engine profile's)
            kw.update(overrides)
            return click.option(f"{flag(name)}/--no-{flag(name)[2:]}", name, **kw)
    elif o.kind == "pools":
        kw = dict(multiple=True, default=default, help=o.help_text(), metavar="SPEC")
    kw.update(overrides)
    return click.option(flag(name), name, **kw)


def simulate_options(f):
    """Every SimConfig field as a click option, in declaration order."""
    from ..options import options
    for name in reversed(list(options())):
        f = click_option(name)(f)
    return f


def sim_config(kw: dict):
    """The simulate options as a checked SimConfig (`checks.check_sim_config`: every field, durations
    in seconds, contradictions), before any work."""
    from ..checks import check_sim_config
    from ..options import SimConfig
    return check_sim_config(SimConfig(**kw))
