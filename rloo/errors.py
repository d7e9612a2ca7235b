"""The one error type of bad input: a leaf module, so that any layer can raise it."""


class ConfigError(ValueError):
    """A bad config value or input file; the message is the whole one-line explanation."""
