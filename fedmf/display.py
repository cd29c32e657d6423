"""How fedmf shows numbers to people: one rule for ε, one for durations.

ε: three significant digits, rounded UP, on the console, on progress lines and in reports (a
displayed ε is never below the true one: 8.004 shows as 8.01, not as 8 under a budget of 8; 7.9994
shows as 8). JSON and CSV files keep the full float. Durations: `1h 02m`, `3m 05s`, `42 s`,
`0.8 s`.
"""

from __future__ import annotations

import math
from typing import Optional

EPSILON_DIGITS = 3


def epsilon(value: Optional[float], digits: int = EPSILON_DIGITS) -> str:
  """ε with `digits` significant digits, rounded up; '-' for None, 'inf' for infinity."""
  if value is None:
    return "-"
  value = float(value)
  if math.isnan(value):
    return "nan"
  if math.isinf(value):
    return "inf"
  if value <= 0:
    return "0"
  scale = 10.0 ** (digits - 1 - math.floor(math.log10(value)))
  # The float product may land a hair above an exact decimal (7.99 * 100 = 799.0000000000001):
  # round it to 9 digits first, so only true excess rounds up.
  up = math.ceil(round(value * scale, 9)) / scale
  return f"{up:.{digits}g}"


def duration(seconds: Optional[float]) -> str:
  """A duration for people: '0.8 s', '42 s', '3m 05s', '1h 02m' ('-' when unknown)."""
  if seconds is None or not math.isfinite(seconds) or seconds < 0:
    return "-"
  if seconds < 10:
    return f"{seconds:.1f} s"
  whole = int(round(seconds))
  if whole < 60:
    return f"{whole} s"
  if whole < 3600:
    return f"{whole // 60}m {whole % 60:02d}s"
  return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
