"""User code run under guard: reward functions (`reward=module:function`), plug-in judges (`judge._target_`) and
environments (`env.target`).

They run in a daemon thread that the caller waits for in 0.2 s slices: past `timeout_s` the call fails with
TimeoutError, and as soon as `should_stop()` says SIGTERM came the caller gets `Interrupted` and stops the run as
it would between rollouts. Whatever the code raises, SystemExit included, is raised in the caller, which judges it
as the code's failure; KeyboardInterrupt (Ctrl-C reaches the main thread, which is waiting) still stops the run.
A call that hangs is abandoned, not killed: Python cannot stop a thread.

Both import and run code named in the config: they must come from a trusted source.
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from typing import Callable

from rloo.utils.errors import ConfigError


class Interrupted(Exception):
    """SIGTERM arrived while user code ran: the caller stops the run as it would between rollouts."""


def call_guarded(
    function: Callable, args: tuple, kwargs: dict, timeout_s: float, should_stop, what: str, timeout_key: str
) -> object:
    """function(*args, **kwargs) under guard (see the module), in a thread named `what`; the TimeoutError names the
    config key that sets the limit (`timeout_key`). timeout_s=0: called directly in the main thread, unguarded (for
    code that times itself with signal.alarm, which works in the main thread only)."""
    if timeout_s <= 0:
        return function(*args, **kwargs)
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 (handed to the caller, which judges it)
            outcome["error"] = error

    thread = threading.Thread(target=target, name=what, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive():
        thread.join(0.2)
        if should_stop is not None and should_stop():
            raise Interrupted()
        if thread.is_alive() and time.monotonic() > deadline:
            raise TimeoutError(f"no result after {timeout_s:g} s ({timeout_key})")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def one_line(error: BaseException) -> str:
    """`TypeName: first line of the message` (the type alone where the message is empty)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def raised(error: BaseException) -> str:
    """What user code raised, where the user can act on it: `raised at my_rewards.py:14 in accuracy_reward: KeyError:
    'solution'`, the innermost frame in the user's own files (user_frame), or `raised KeyError: ...` where none is
    (a builtin, or rloo's own timeout). The full traceback rides on the error rloo raises from it (`from error`),
    and train.log keeps it (rloo.run.stops.record_failure)."""
    return f"raised {located(error)}"


def located(error: BaseException) -> str:
    """`at my_rewards.py:14 in accuracy_reward: KeyError: 'solution'` (raised), or one_line where no frame is the
    user's."""
    where = user_frame(error)
    return f"at {where}: {one_line(error)}" if where else one_line(error)


class Failure(str):
    """A one-line failure of user code that keeps the exception it came from (`cause`): the error rloo raises for it
    is raised from that one, so train.log's traceback reaches the user's line."""

    cause: BaseException | None = None

    @classmethod
    def of(cls, line: str, cause: BaseException | None = None) -> "Failure":
        failure = cls(line)
        failure.cause = cause
        return failure


def user_frame(error: BaseException) -> str | None:
    """`path:line in function` of the innermost traceback frame that is the user's: not in rloo, the standard library
    or an installed package (a helper the function called counts: the frame that raised is the one to look at). The
    path relative to the working directory where it lies below it."""
    import traceback

    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if is_user_file(frame.filename):
            return f"{shown_path(frame.filename)}:{frame.lineno} in {frame.name}"
    return None


@functools.lru_cache(maxsize=1)
def not_user_dirs() -> tuple[str, ...]:
    """rloo's dir, the standard library's and the installed packages': where no frame is the user's."""
    import sysconfig
    from pathlib import Path

    import rloo

    dirs = {str(Path(rloo.__file__).resolve().parent)}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        if path := sysconfig.get_paths().get(name):
            dirs.add(str(Path(path).resolve()))
    return tuple(d.rstrip("/") + "/" for d in dirs)


def is_user_file(filename: str) -> bool:
    import os

    if filename.startswith("<frozen") or not filename:
        return False
    return not os.path.realpath(filename).startswith(not_user_dirs())


def shown_path(filename: str) -> str:
    import os

    real, here = os.path.realpath(filename), os.path.realpath(os.getcwd())
    return os.path.relpath(real, here) if real.startswith(here.rstrip("/") + "/") else filename


def import_user_module(name: str, key: str):
    """The module of `name` (`module:attribute`, user code the config key `key` names), imported; a one-line
    ConfigError naming `key` where it cannot be imported, has moved (rloo.utils.moved), or fails as it runs."""
    from rloo.utils.moved import MOVED

    module_name, _, attribute = name.partition(":")
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        if module_name in MOVED:
            moved = MOVED[module_name]
            raise ConfigError(f"{key}: {module_name} moved to {moved}: write {moved}:{attribute}") from None
        raise ConfigError(f"{key}: cannot import {module_name!r} for {name!r} ({error})") from None
    except (Exception, SystemExit) as error:  # the module itself fails as it runs
        raise ConfigError(f"{key}: importing {module_name!r} for {name!r} {raised(error)}") from None
