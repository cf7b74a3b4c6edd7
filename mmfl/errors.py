"""Errors a user can cause. The CLI turns them into one line and exit code 2."""


class MMFLError(Exception):
    """A problem with the user's input (config, path, data file, name).

    The message must name the problem in one line, e.g.
    ``partition.beta: must be > 0, got -1``.
    """


class ConfigError(MMFLError):
    """An invalid or unknown configuration value."""


class DataError(MMFLError):
    """A missing, unreadable or corrupt data file."""
