"""The progress display computes its fields (the realized ε: an accountant call) only when shown."""

from __future__ import annotations

import io

from fedmf.program import outputs


def _counting_fields(calls):
  def fields():
    calls.append(1)
    return {"epsilon": "1.5"}

  return fields


def test_lines_compute_fields_only_on_shown_rounds():
  stream = io.StringIO()
  bar = outputs.Progress(25, enabled=True, every=10, stream=stream)
  calls = []
  for r in range(25):
    bar.update(r, _counting_fields(calls))
  assert len(calls) == 3  # rounds 10, 20 and the last
  assert stream.getvalue().splitlines() == [
    "round 10/25  epsilon 1.5",
    "round 20/25  epsilon 1.5",
    "round 25/25  epsilon 1.5",
  ]


def test_disabled_progress_never_computes_fields():
  calls = []
  bar = outputs.Progress(5, enabled=False, stream=io.StringIO())
  for r in range(5):
    bar.update(r, _counting_fields(calls))
  assert not calls


class _Tty(io.StringIO):
  def isatty(self):
    return True


def test_bar_computes_fields_on_first_and_shown_rounds():
  calls = []
  bar = outputs.Progress(25, enabled=True, every=10, stream=_Tty())
  for r in range(25):
    bar.update(r, _counting_fields(calls))
  bar.close()
  assert len(calls) == 4  # the first round (an empty postfix), 10, 20 and the last
