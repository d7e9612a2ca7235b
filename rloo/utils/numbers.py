"""What counts as a number where user code hands rloo one (a reward function's value, an environment's reward): a
real number, Python's or NumPy's, or a 0-d array or tensor holding one; never a bool or a string (a reward
function's bools are counted as 0 and 1 before they get here, as TRL casts them). A score must be
finite in float32, the dtype rewards are kept in: 10**400 or 1e39 is as unusable as inf."""

from __future__ import annotations

import math
import numbers

FLOAT32_MAX = 3.4028234663852886e38


def scalar(value):
    """A 0-d array or tensor (np.mean(...), torch.tensor(0.5)) as the Python number it holds; anything else as is."""
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return value.item()
    return value


def is_number(value) -> bool:
    value = scalar(value)
    return isinstance(value, numbers.Real) and type(value).__name__ not in ("bool", "bool_")


def finite_float(value) -> float | None:
    """`value` as a float where it is a number finite in float32; None otherwise (not a number, nan, inf, or too
    large: an int past float's range raises in math.isfinite, here it is only not finite)."""
    if not is_number(value):
        return None
    try:
        number = float(scalar(value))
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) and abs(number) <= FLOAT32_MAX else None


def shown(value, limit: int = 60) -> str:
    """A value for a one-line error: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
