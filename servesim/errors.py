"""Domain errors. The CLI turns them into one-line messages and a non-zero exit."""


class ServesimError(Exception):
    """Base class for user-facing errors (bad input, infeasible configuration)."""


class ConfigError(ServesimError):
    """A data file, option or trace is malformed: names the source, the key/value and what would work."""


class InfeasibleError(ServesimError):
    """A well-formed configuration that cannot run (does not fit in memory, layout does not divide)."""


class ServesimWarning(UserWarning):
    """An option that does nothing in the given combination; the CLI prints it as one line."""
