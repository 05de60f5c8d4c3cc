"""Floats as the records write them: JSON has no NaN or infinity, and figures are rounded."""

from __future__ import annotations

import math
from typing import overload


@overload
def json_float(value: float) -> float | str: ...
@overload
def json_float(value: None) -> None: ...
def json_float(value: float | None) -> float | str | None:
    """A float for a telemetry record: rounded when finite, "nan"/"inf"/"-inf" strings otherwise;
    None (no such figure) stays null."""
    # Strings keep them distinct from null (no entropy) and float() reads them back.
    if value is None:
        return None
    if not math.isfinite(value):
        return str(float(value))
    return round(float(value), 6)


def rounded(value: float | None, digits: int) -> float | None:
    """`value` rounded to `digits`, None kept."""
    return None if value is None else round(value, digits)


def finite(value):
    """`value` with every NaN or infinite float as null, through dicts, lists and tuples (the bench JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
