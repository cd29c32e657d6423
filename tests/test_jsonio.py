"""fedmf.jsonio.json_text: strict JSON (null for NaN and infinities), the same text whether a value
takes the one-pass path (floats, numpy float64 among them) or the round trip (numpy arrays holding
non-finite values)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedmf import jsonio


def _round_trip(obj, indent=1):
  plain = json.loads(json.dumps(obj, default=jsonio._default, allow_nan=True))
  return json.dumps(jsonio.strict_json(plain), indent=indent, allow_nan=False)


@pytest.mark.parametrize(
  "obj",
  [
    {"columns": [list(np.linspace(0.1, 1.0, 7)), [np.float64(0.25)]], "n": 2},
    {"a": np.array([1.0, np.nan]), "b": np.float64("inf"), "c": [np.int64(3), (1.5, math.nan)]},
    {"path": Path("/x"), "nested": {"1": [-math.inf, 2.5e-300, 1e300]}, "m": np.eye(2)},
  ],
)
@pytest.mark.parametrize("indent", [1, None])
def test_json_text_is_strict_and_equals_the_round_trip(obj, indent):
  text = jsonio.json_text(obj, indent=indent)
  assert text == _round_trip(obj, indent)
  assert "NaN" not in text and "Infinity" not in text
  json.loads(text)  # valid JSON


def test_non_finite_values_become_null():
  assert json.loads(jsonio.json_text({"a": np.array([1.0, np.nan]), "b": math.inf})) == {
    "a": [1.0, None],
    "b": None,
  }


def test_number_rows_write_each_list_of_numbers_on_one_line_with_the_same_values():
  obj = {
    "columns": [list(np.linspace(0.1, 1.0, 7)), [np.float64(0.25), 3], [1.0, math.nan]],
    "flags": [True, False],  # booleans are not numbers here
    "mixed": [1, "a", [2.5, -1e-300]],
    "n": 2,
  }
  text = jsonio.json_text(obj, number_rows=True)
  assert json.loads(text) == json.loads(jsonio.json_text(obj))
  lines = text.splitlines()
  assert f'  {json.dumps(list(np.linspace(0.1, 1.0, 7)))},' in lines
  assert '  [0.25, 3],' in lines
  assert '   null' in lines  # a row with NaN is written the plain way, NaN as null
  assert '  [2.5, -1e-300]' in lines and '  true,' in lines
  # A string holding NUL (the placeholder's marker) is written the plain way, the same values.
  odd = {"note": "a\x00row0\x00b", "c": [1.0, 2.0]}
  assert jsonio.json_text(odd, number_rows=True) == jsonio.json_text(odd)
