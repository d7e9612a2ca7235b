"""How a run that does not finish ends. A failed run's dir says why it failed: summary.json's `error` and the last line
of train.log hold the one line the console printed. A run stopped by SIGTERM or Ctrl-C (not a failure) ends with the
line to act on: the checkpoint kept and the command that continues it."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

from rloo.utils.errors import CTRL_C_EXIT_CODE, SIGTERM_EXIT_CODE, STOP_LINES, ConfigError, stopped_by_ctrl_c


def is_interruption(error: BaseException) -> bool:
    """SIGTERM or Ctrl-C, in whichever form it reached the run: not a failure (summary.json says interrupted)."""
    from rloo.rewards.user_code import Interrupted as UserCodeInterrupted
    from rloo.utils.errors import Stopped

    if stopped_by_ctrl_c(error):  # also Lightning's SystemExit(1) while it handles a KeyboardInterrupt
        return True
    if isinstance(error, SystemExit):
        return error.code in (SIGTERM_EXIT_CODE, CTRL_C_EXIT_CODE)
    if isinstance(error, (KeyboardInterrupt, Stopped, UserCodeInterrupted)):
        return True
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    return isinstance(error, SIGTERMException)


def failure_line(error: BaseException) -> str:
    """The one line a failure is told by: rloo's own errors as the console's `error:` line has them, anything else
    as `TypeName: first line`."""
    from rloo.rewards.user_code import one_line
    from rloo.utils import errors

    ours = tuple(v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception))
    text = str(error).strip()
    return text.splitlines()[0] if isinstance(error, ours) and text else one_line(error)


def record_failure(out: Path, error: BaseException) -> None:
    """A failed run's dir says why: summary.json gets `"status": "failed"` and the one-line `error` (over what the
    run recorded so far), and train.log ends with `error: <line>` (the console has it on stderr). Only in a dir this
    process owns (never in one another live run holds) and on the first rank; interruptions say so elsewhere."""
    from rloo.run.cli import further_rank
    from rloo.utils import atomic, ownership

    if is_interruption(error) or further_rank() or not ownership.owns(out):
        return
    line = failure_line(error)
    path = out / "summary.json"
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        previous = {}
    summary = (previous if isinstance(previous, dict) else {}) | {"status": "failed", "error": line}
    try:
        atomic.write_text(path, json.dumps(summary, indent=2), "the run summary")
    except Exception:  # a full disk: the console's line is what is left
        pass
    if not isinstance(error, ConfigError):  # the traceback, down to the user's own line where user code failed
        log_file_only(out / "train.log", "".join(traceback.format_exception(error)).rstrip())
    log_file_only(out / "train.log", f"error: {line}")


def log_file_only(path: Path, line: str) -> None:
    """`line` through the root logger's file handler for `path` (the run's train.log), not its console handler:
    the console already has the line on stderr."""
    record = logging.LogRecord("rloo", logging.ERROR, __file__, 0, line, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).resolve() == path.resolve():
            handler.handle(record)


def checkpoint_names(out: Path) -> str:
    return ", ".join(sorted(p.name for p in (out / "checkpoints").glob("*.ckpt")))


def stopped_by_sigterm(plan, module) -> None:
    """Exit as a process ended by SIGTERM (128 + 15), which schedulers read as preempted, never as success. Stopped
    by SLURM's pre-kill signal (rloo.run.preemption): the first rank requeues the job, and its line says so."""
    if not module.trainer.is_global_zero:  # one line for the run
        sys.exit(SIGTERM_EXIT_CODE)
    if any(getattr(callback, "preempted", False) for callback in module.trainer.callbacks):
        from rloo.run.preemption import REQUEUE_SIGNAL, requeue

        line = stop_line(f"SLURM's pre-kill signal ({REQUEUE_SIGNAL.name})", plan, module)
        plan.log(f"{line.split('; continue with')[0]}; {requeue()}")
    else:
        plan.log(stop_line("SIGTERM", plan, module))
    sys.exit(SIGTERM_EXIT_CODE)


def stop_line(by: str, plan, module) -> str:
    """The line a stopped run ends with: what it did, the checkpoint a resume continues from (or none), and the
    command that continues it (its own settings come with it: rloo.run.cli.with_the_runs_own_overrides)."""
    from rloo.utils.resume import find_resume_point

    out, said = plan.out, f"rloo: stopped by {by} after {module.state.rollouts} rollouts"
    try:
        point = find_resume_point("auto", out, plan.updates, log=lambda line: None)
    except Exception:  # a damaged checkpoints/ dir: say what is there
        point = None
    if point is None:
        line = f"{said}; no checkpoint was kept, nothing to continue from (start it again: the same command)"
    else:
        kept = f"kept {point.checkpoint.relative_to(out)} (in {out})"
        line = f"{said}; {kept}; continue with: python -m rloo.train resume={out}"
    STOP_LINES.append(line)
    return line


def stop_other_ranks(trainer, log) -> None:
    """The first rank failed: the ranks Lightning launched from it are killed now, not left waiting in a collective
    until its timeout (a rank that is failing too, or waits on a dead one, has nothing left to save). Lightning's
    child-process observer watches the same list, and SIGKILLs this process when it finds a rank ended: emptied, it
    has none left to watch, and this rank ends the run with its own line."""
    import signal

    launcher = getattr(trainer.strategy, "launcher", None)
    procs = getattr(launcher, "procs", None)
    if not trainer.is_global_zero or not isinstance(procs, list) or not procs:
        return
    alive = [proc for proc in procs if proc.poll() is None]
    for proc in alive:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    procs.clear()
    if alive:
        log(f"rloo: stopped the other ranks (pid {', '.join(str(p.pid) for p in alive)}): this run has failed")


@contextmanager
def ctrl_c_held():
    """Ctrl-C ignored for the seconds a stopped run takes to record itself (in the main thread; elsewhere as is)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def stopped_while_building(record):  # a rloo.run.pipeline.RunRecord
    """SIGTERM or Ctrl-C while the run is set up (the embedded task's build, a packaged model's conversion, loading):
    summary.json says interrupted (and where), a line says what is kept, and the exit is 143 or 130. Caches are
    whole or absent (rloo.utils.cache); a resume starts the setup again."""
    import signal
    import threading

    from rloo.utils.errors import Stopped

    def stop(signum, frame):
        raise Stopped()

    main = threading.current_thread() is threading.main_thread()  # signal handlers live in the main thread only
    previous = signal.signal(signal.SIGTERM, stop) if main else None
    try:
        yield
    except (Stopped, KeyboardInterrupt, SystemExit) as error:
        sigterm = isinstance(error, Stopped) or (isinstance(error, SystemExit) and error.code == SIGTERM_EXIT_CODE)
        if not sigterm and not isinstance(error, KeyboardInterrupt):
            raise
        record.write_before_fit("interrupted", "setting up (data, models, caches)")
        if not sigterm:
            raise
        plan = record.plan
        plan.log(
            f"rloo: stopped by SIGTERM while setting up the run, after {plan.resumed_rollouts} rollouts; "
            f"checkpoints in {plan.out / 'checkpoints'}: {checkpoint_names(plan.out) or 'none'}; caches are whole"
        )
        sys.exit(SIGTERM_EXIT_CODE)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
