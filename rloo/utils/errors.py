"""The errors a run reports in one line: a leaf module, so that any layer can raise them."""

SIGTERM_EXIT_CODE = 128 + 15  # a process stopped by SIGTERM, as a shell reports it: preempted, never success
STOP_LINES: list[str] = []  # the lines a stopped run said (rloo.run.stops.stop_line): no generic one after them
CTRL_C_EXIT_CODE = 128 + 2  # a process stopped by Ctrl-C (SIGINT), as a shell reports it: every entry point


def stopped_by_ctrl_c(error: BaseException) -> bool:
    """A KeyboardInterrupt, or the SystemExit(1) Lightning raises while handling one (its graceful shutdown)."""
    return isinstance(error, KeyboardInterrupt) or (
        isinstance(error, SystemExit) and isinstance(error.__context__, KeyboardInterrupt)
    )


def collective_failure(error: BaseException) -> str | None:
    """What a failed collective says (a rank that died closed its connections; one that hung let the collective time
    out), in one line without the C++ source location; None for any other error."""
    names = {cls.__name__ for cls in type(error).__mro__}
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    distributed = names & {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
    if not distributed and not (isinstance(error, RuntimeError) and ("gloo" in text or "NCCL" in text)):
        return None
    if text.startswith("[") and "] " in text:  # [/path/to/gloo/transport/tcp/pair.cc:553] Connection closed by peer
        text = text.split("] ", 1)[1]
    return text.split(". This is typically")[0][:200]


class Stopped(BaseException):
    """SIGTERM arrived while a run was being set up (its data, the embedded task's build, a model's conversion), where
    no Lightning trainer listens for it: raised in the main thread; a BaseException, so no `except Exception` on
    the way swallows it."""


class ConfigError(ValueError):
    """A bad config value or input file; the message is the whole one-line explanation."""


class WriteError(RuntimeError):
    """A run's output could not be written (full disk, permissions); the message says what and where, in one line."""


class NonFiniteError(RuntimeError):
    """Training stopped by the guard: too many rollouts in a row with non-finite scores, loss or gradients."""


class NoLearningSignal(RuntimeError):
    """Training stopped: too many rollouts in a row in which no prompt's completions differed in score."""


class JudgeFailed(RuntimeError):
    """The final evaluation's judge failed for most pairs: no win rate to report."""


class RewardFunctionError(RuntimeError):
    """A reward function misbehaved (raised, wrong count, non-finite value); the message names it, in one line."""


class EnvironmentFailed(RuntimeError):
    """An environment (env=) raised, hung or answered a step wrongly; the message names it, in one line."""


class ProducerFailed(RuntimeError):
    """The rollout producer process (max_staleness, producer=process) raised or died, or handed a record the learner
    must not train on (a version its staleness bound forbids); the message says which, in one line."""


class RankLost(RuntimeError):
    """A process of a multi-process run died or hung: the collective it did not join failed; the run ends."""


class RunIncomplete(RuntimeError):
    """A run that trained every rollout but lacks its exported policy or final evaluation: never "finished"."""
