"""The strategy JSON schema and THE loader: validation, round trips, normalization, horizons."""

import json

import numpy as np
import pytest

from fedmf.mf import strategies as st


def _blt():
  return {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]}


def test_round_trip_every_mechanism(tmp_path):
  objs = [
    {"mechanism": "dpsgd"},
    {"mechanism": "tree", "variant": "vanilla"},
    {"mechanism": "band-toeplitz", "coefficients": [1.0, 0.5, 0.25], "column_normalized": True},
    _blt(),
    {"mechanism": "bandmf", "n": 4, "bands": 2, "columns": [[2, 1], [1, 1], [3, -1], [5]]},
    {
      "mechanism": "dense",
      "matrix": [[1, 0, 0, 0], [0.5, 2, 0, 0], [-1, 0, 1, 0], [0, 0, 0.25, 3]],
    },
  ]
  for obj in objs:
    strategy = st.load_strategy(obj)
    assert strategy.mechanism == obj["mechanism"]
    path = tmp_path / f"{obj['mechanism']}.json"
    st.save_strategy(strategy, path, optimized_for={"n": 4})
    again = st.load_strategy(str(path))
    back = again.to_dict()
    assert back["optimized_for"] == {"n": 4}
    back.pop("optimized_for")
    assert json.loads(json.dumps(back)) == json.loads(json.dumps(obj)) | (
      {"column_normalized": obj.get("column_normalized")} if "coefficients" in obj else {}
    )
    np.testing.assert_array_equal(strategy.matrix(4), again.matrix(4))


@pytest.mark.parametrize(
  "obj, field",
  [
    ({"mechanism": "nope"}, "mechanism"),
    ({}, "mechanism"),
    ({"mechanism": "blt", "buf_decay": [1.2], "output_scale": [0.1]}, "buf_decay"),
    ({"mechanism": "blt", "buf_decay": [0.5, 0.5], "output_scale": [0.1, 0.1]}, "buf_decay"),
    ({"mechanism": "blt", "buf_decay": [0.5], "output_scale": [-0.1]}, "output_scale"),
    ({"mechanism": "blt", "buf_decay": [0.5], "output_scale": [float("nan")]}, "output_scale"),
    ({"mechanism": "blt", "buf_decay": [0.5, 0.4], "output_scale": [0.1]}, "output_scale"),
    ({"mechanism": "blt", "output_scale": [0.1]}, "buf_decay"),
    ({"mechanism": "blt", "buf_decay": "0.5", "output_scale": [0.1]}, "buf_decay"),
    ({"mechanism": "tree", "variant": "honaker"}, "variant"),
    ({"mechanism": "band-toeplitz", "coefficients": []}, "coefficients"),
    ({"mechanism": "band-toeplitz", "coefficients": [0.0, 1.0]}, "coefficients"),
    (
      {"mechanism": "band-toeplitz", "coefficients": [1.0], "column_normalized": "yes"},
      "column_normalized",
    ),
    ({"mechanism": "bandmf", "n": 3, "bands": 2, "columns": [[1, 1], [1, 1]]}, "columns"),
    ({"mechanism": "bandmf", "n": 3, "bands": 2, "columns": [[1, 1], [1], [1]]}, "columns[1]"),
    (
      {"mechanism": "bandmf", "n": 3, "bands": 2, "columns": [[1, 1], [1, float("inf")], [1]]},
      "columns[1]",
    ),
    ({"mechanism": "bandmf", "n": 3, "bands": 4, "columns": [[1], [1], [1]]}, "bands"),
    ({"mechanism": "bandmf", "n": 0, "bands": 1, "columns": []}, "'n'"),
    ({"mechanism": "bandmf", "n": 2, "bands": 1, "columns": [[0.0], [1.0]]}, "columns[0]"),
    ({"mechanism": "dense", "matrix": [[1, 1], [0, 1]]}, "lower triangular"),
    ({"mechanism": "dense", "matrix": [[1, 0], [1, 0]]}, "diagonal"),
    ({"mechanism": "dense", "matrix": [[1, 0, 0], [1, 1, 0]]}, "square"),
    ({"mechanism": "dense", "matrix": [[1, 0], [float("nan"), 1]]}, "non-finite"),
    ({"mechanism": "dense"}, "matrix"),
    ({"mechanism": 3}, "mechanism"),
  ],
)
def test_invalid_strategies_name_the_field(obj, field):
  with pytest.raises(st.StrategyError) as e:
    st.load_strategy(obj)
  message = str(e.value)
  assert "\n" not in message
  assert field in message


def test_missing_and_malformed_files(tmp_path):
  with pytest.raises(st.StrategyError, match="not found"):
    st.load_strategy(tmp_path / "missing.json")
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(st.StrategyError, match="not valid JSON"):
    st.load_strategy(bad)
  wrong = tmp_path / "wrong.json"
  wrong.write_text(json.dumps({"mechanism": "blt", "buf_decay": [2.0], "output_scale": [0.1]}))
  with pytest.raises(st.StrategyError, match="wrong.json.*buf_decay"):
    st.load_strategy(wrong)


def test_extra_keys_are_kept():
  strategy = st.load_strategy(_blt() | {"optimized_for": {"n": 2052}, "note": "hi"})
  assert strategy.metadata == {"optimized_for": {"n": 2052}, "note": "hi"}


def test_bandmf_columns_are_normalized_in_the_leading_block():
  obj = {"mechanism": "bandmf", "n": 4, "bands": 2, "columns": [[3, 4], [1, 1], [2, -2], [7]]}
  strategy = st.load_strategy(obj)
  c4 = strategy.matrix(4)
  expected = np.array([[3, 0, 0, 0], [4, 1, 0, 0], [0, 1, 2, 0], [0, 0, -2, 7]], float)
  np.testing.assert_allclose(c4, expected / np.linalg.norm(expected, axis=0))
  # The n'=3 block truncates column 2 to its diagonal entry before normalizing.
  c3 = strategy.matrix(3)
  block = expected[:3, :3]
  np.testing.assert_allclose(c3, block / np.linalg.norm(block, axis=0))
  np.testing.assert_allclose(np.linalg.norm(c3, axis=0), 1.0)
  with pytest.raises(st.StrategyError, match="built for n=4"):
    strategy.matrix(5)


def test_band_toeplitz_normalization_flag():
  raw = st.load_strategy(
    {"mechanism": "band-toeplitz", "coefficients": [2.0, 1.0], "column_normalized": False}
  )
  norm = st.load_strategy(
    {"mechanism": "band-toeplitz", "coefficients": [2.0, 1.0], "column_normalized": True}
  )
  c_raw = raw.matrix(3)
  np.testing.assert_allclose(c_raw, [[2, 0, 0], [1, 2, 0], [0, 1, 2]])
  c_norm = norm.matrix(3)
  np.testing.assert_allclose(c_norm, c_raw / np.linalg.norm(c_raw, axis=0))
  assert raw.toeplitz_coefs(3) is not None and norm.toeplitz_coefs(3) is None


def test_blt_matrix_matches_definition():
  strategy = st.load_strategy(_blt())
  c = strategy.matrix(5)
  # BLT §2: c_0 = 1, c_i = Σ_j ω_j θ_j^{i-1}.
  coefs = [1.0] + [0.2 * 0.9 ** (i - 1) + 0.3 * 0.5 ** (i - 1) for i in range(1, 5)]
  for i in range(5):
    for j in range(5):
      assert c[i, j] == pytest.approx(coefs[i - j] if i >= j else 0.0, abs=1e-15)


def test_strategy_objects_pass_through_the_loader():
  strategy = st.load_strategy(_blt())
  assert st.load_strategy(strategy) is strategy
  with pytest.raises(st.StrategyError):
    st.load_strategy(3.5)


@pytest.mark.parametrize(
  "text, needle",
  [
    ('{"mechanism": "bandmf", "n": Infinity, "bands": 1, "columns": []}', "'n' must be an integer"),
    ('{"mechanism": "bandmf", "n": 1e400, "bands": 1, "columns": []}', "got inf"),
    ('{"mechanism": "bandmf", "n": NaN, "bands": 1, "columns": []}', "'n' must be an integer"),
    ('{"mechanism": "bandmf", "n": 1' + "0" * 60 + ', "bands": 1, "columns": []}', "61 digits"),
    ('{"mechanism": "bandmf", "n": 2, "bands": 1, "columns": [[1e400], [1]]}', "'columns[0]'"),
    ('{"mechanism": "blt", "buf_decay": [0.5], "output_scale": [1e400]}', "non-finite value inf"),
    ('{"mechanism": "band-toeplitz", "coefficients": [1, 1' + "0" * 400 + "]}", "too large"),
    ('{"mechanism": "band-toeplitz", "coefficients": [1, "x"]}', "list of numbers"),
    ('{"mechanism": "dense", "matrix": [[1, 0], [Infinity, 1]]}', "index 1, 0"),
    ('{"mechanism": "dense", "matrix": [[1, 0], [1]]}', "'matrix'"),
    ('{"mechanism": "tree", "variant": ' + "[" * 50 + "]" * 50 + "}", "'variant'"),
    ("[" * 100_000 + "]" * 100_000, "nests its JSON too deeply"),
    ('{"mechanism": "dpsgd", "n": 1' + "0" * 5000 + "}", "not valid JSON"),
    ('{"mechanism": "' + "x" * 5000 + '"}', "unknown mechanism"),
  ],
  ids=lambda value: value[:40] if isinstance(value, str) and len(value) > 40 else None,
)
def test_hostile_files_give_one_line_errors_naming_file_and_field(tmp_path, text, needle):
  path = tmp_path / "s.json"
  path.write_text(text)
  with pytest.raises(st.StrategyError) as info:
    st.load_strategy(str(path))
  message = str(info.value)
  assert needle in message and str(path) in message, message
  assert "\n" not in message and len(message) < 400


def test_unreadable_sources(tmp_path):
  with pytest.raises(st.StrategyError, match="is a directory"):
    st.load_strategy(str(tmp_path))
  binary = tmp_path / "b.json"
  binary.write_bytes(b'{"mechanism": "\xff"}')
  with pytest.raises(st.StrategyError, match="not UTF-8"):
    st.load_strategy(str(binary))


def test_save_leaves_nothing_half_written(tmp_path, monkeypatch):
  strategy = st.load_strategy(_blt())
  with pytest.raises(st.StrategyError, match="cannot write strategy file"):
    st.save_strategy(strategy, tmp_path)  # a directory
  assert sorted(p.name for p in tmp_path.iterdir()) == []
  target = tmp_path / "s.json"
  target.write_text("previous")

  def interrupted(src, dst):
    raise KeyboardInterrupt

  monkeypatch.setattr(st.os, "replace", interrupted)
  with pytest.raises(KeyboardInterrupt):
    st.save_strategy(strategy, target)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
  assert target.read_text() == "previous"


def test_sensitivity_is_computed_once_per_schema_and_method(monkeypatch):
  from fedmf.mf import strategy as strategy_lib
  from fedmf.mf.blt import Blt
  from fedmf.mf.schema import ParticipationSchema

  calls = []
  compute = strategy_lib.Strategy._compute_sensitivity

  def counting(self, schema, method):
    calls.append((schema.n, schema.min_sep, method))
    return compute(self, schema, method)

  monkeypatch.setattr(strategy_lib.Strategy, "_compute_sensitivity", counting)
  blt = Blt(buf_decay=np.array([0.9, 0.5]), output_scale=np.array([0.3, 0.2]))
  schema = ParticipationSchema(64, 8, 3)
  first = blt.sensitivity(schema)
  assert blt.sensitivity(schema) is first
  assert blt.sensitivity(ParticipationSchema(64, 8, 3)) == first  # an equal schema: cached too
  assert len(calls) == 1
  upper = blt.sensitivity(schema, "upper-bound")
  other = blt.sensitivity(ParticipationSchema(64, 16, 3))
  assert len(calls) == 3 and upper.value >= first.value and other != first
  # The cache is not part of the strategy: its JSON, equality and a copy do not see it.
  same = Blt(buf_decay=np.array([0.9, 0.5]), output_scale=np.array([0.3, 0.2]))
  assert blt.to_dict() == same.to_dict()
  assert "_sensitivity_cache" not in blt.to_dict()
  with pytest.raises(Exception):
    blt.sensitivity(schema, "no-such-method")
  assert len(calls) == 4  # a refused method is not cached
