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


def one_line(handler, args) -> int:
    """``handler(args)`` as a command: an :class:`MMFLError` or a file system error becomes one
    ``mmfl: error:`` line and exit code 2, Ctrl-C exit 130, a closed pipe (``mmfl list | head``) 0."""
    import os
    import sys

    try:
        return handler(args)
    except BrokenPipeError:  # the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except MMFLError as e:
        print(f"mmfl: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file system error not caught closer to its cause: still one line
        print(f"mmfl: error: {str(e.filename) + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mmfl: interrupted (the last completed round is checkpointed; continue with --resume)",
              file=sys.stderr)
        return 130
