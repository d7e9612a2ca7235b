"""The errors a run reports in one line: a leaf module, so that any layer can raise them."""


class ConfigError(ValueError):
    """A bad config value or input file; the message is the whole one-line explanation."""


class WriteError(RuntimeError):
    """A run's output could not be written (full disk, permissions); the message says what and where, in one line."""
