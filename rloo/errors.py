"""The errors a run reports in one line: a leaf module, so that any layer can raise them."""

SIGTERM_EXIT_CODE = 128 + 15  # a process stopped by SIGTERM, as a shell reports it: preempted, never success


class ConfigError(ValueError):
    """A bad config value or input file; the message is the whole one-line explanation."""


class WriteError(RuntimeError):
    """A run's output could not be written (full disk, permissions); the message says what and where, in one line."""


class NonFiniteError(RuntimeError):
    """Training stopped by the guard: too many rollouts in a row with non-finite scores, loss or gradients."""


class JudgeFailed(RuntimeError):
    """The final evaluation's judge failed for most pairs: no win rate to report."""


class RewardFunctionError(RuntimeError):
    """A reward function misbehaved (raised, wrong count, non-finite value); the message names it, in one line."""


class RunIncomplete(RuntimeError):
    """A run that trained every rollout but lacks its exported policy or final evaluation: never "finished"."""
