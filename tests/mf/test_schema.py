"""ParticipationSchema: one validation, the defaults of BandMF §2, and its words."""

import math

import pytest

from fedmf.errors import FedmfUserError
from fedmf.mf.schema import ParticipationSchema, SchemaError


def test_defaults_fill_k_and_single_participation():
  s = ParticipationSchema(2052, 342)
  assert (s.min_sep, s.max_participations, s.effective_max_participations) == (342, 6, 6)
  single = ParticipationSchema(60)
  assert single.single_participation and single.max_participations == 1 and single.min_sep == 60
  anywhere = ParticipationSchema(10, None, 3)
  assert (anywhere.min_sep, anywhere.max_participations) == (1, 3)
  # k = 1 makes the separation vacuous: the same schema as single participation.
  assert ParticipationSchema(10, 4, 1) == ParticipationSchema(10)


def test_effective_k_is_the_number_that_fits():
  # Reference values: min(k, ceil(n/b)) for n = 5 and b = 1..6 with k unbounded: 5, 3, 2, 2, 1, 1.
  assert [ParticipationSchema(5, b).effective_max_participations for b in range(1, 7)] == [
    5,
    3,
    2,
    2,
    1,
    1,
  ]
  assert ParticipationSchema(100, 10, 40).effective_max_participations == 10
  assert ParticipationSchema(100, 10, 4).effective_max_participations == 4


@pytest.mark.parametrize(
  "args, field",
  [
    ((0,), "rounds"),
    ((2.5,), "rounds"),
    ((True,), "rounds"),
    ((math.nan,), "rounds"),
    ((10, 0), "min-sep"),
    ((10, -3), "min-sep"),
    ((10, 1.5), "min-sep"),
    ((10, "3"), "min-sep"),
    ((10, 2, 0), "max participations"),
    ((10, 2, math.inf), "max participations"),
  ],
)
def test_invalid_values_raise_one_error_type(args, field):
  with pytest.raises(SchemaError, match=field) as e:
    ParticipationSchema(*args)
  assert isinstance(e.value, FedmfUserError)
  assert "\n" not in str(e.value)


def test_integral_floats_are_accepted():
  assert ParticipationSchema(10.0, 2.0, 3.0) == ParticipationSchema(10, 2, 3)


def test_words_never_print_python_none():
  texts = [
    ParticipationSchema(60, 15, 4).describe(),
    ParticipationSchema(60).describe(),
    ParticipationSchema(60, None, 3).describe(),
    ParticipationSchema(60, 15, 40).describe(),
  ]
  assert texts[0] == "n = 60 rounds, each client at most 4 times, at least 15 rounds apart"
  assert texts[1] == "n = 60 rounds, each client at most once"
  assert texts[2] == "n = 60 rounds, each client at most 3 times, in any rounds"
  assert "at most 4 fit" in texts[3]
  assert not any("None" in t for t in texts)


def test_of_accepts_a_schema_or_numbers():
  s = ParticipationSchema(20, 5, 2)
  assert ParticipationSchema.of(s) is s
  assert ParticipationSchema.of(20, 5, 2) == s
  with pytest.raises(TypeError):
    ParticipationSchema.of(s, 5)
  assert s.with_rounds(40) == ParticipationSchema(40, 5, 2)
  assert ParticipationSchema(20).with_rounds(40) == ParticipationSchema(40)


@pytest.mark.parametrize(
  "value", [2**63, 10**30, 10**5000, 1e300], ids=["2^63", "1e30", "1e5000", "1e300"]
)
def test_counts_beyond_int64_are_refused_in_one_short_line(value):
  with pytest.raises(SchemaError, match=r"min-sep b must be an integer in \[1, 2\^63 - 1\]") as e:
    ParticipationSchema(10, value, 2)
  assert len(str(e.value)) < 120
  assert ParticipationSchema(10, 2**63 - 1, 2).effective_max_participations == 1
