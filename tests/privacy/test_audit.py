"""fedmf.audit: realized (b, k) and violations vs brute force, sensitivity never below brute force."""

import collections
import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as hs

from fedmf.privacy import audit, audit_result, log_counts, log_statistics, participation_log
from fedmf.errors import FedmfUserError
from fedmf.mf import strategies as st
from tests.mf.brute_force import brute_force_sensitivity

BLT = {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]}


def arrays(rows):
  ids = [c for _, c in rows]
  enc = pa.array(ids, pa.string()).dictionary_encode()
  return participation_log.ParticipationArrays(
    rounds=np.array([r for r, _ in rows], dtype=np.int64),
    codes=enc.indices.to_numpy().astype(np.int64),
    client_ids=enc.dictionary,
  )


def brute(rows, B, K):
  by_client = collections.defaultdict(list)
  for r, c in rows:
    by_client[c].append(r)
  gaps, viol = [], set()
  kmax = 0
  for c, rs in by_client.items():
    cnt = collections.Counter(rs)
    dups = sorted(r for r, m in cnt.items() if m > 1)
    if dups:
      viol.add((c, tuple(dups), "duplicate"))
    u = sorted(cnt)
    kmax = max(kmax, len(u))
    bad = set()
    for i, j in zip(u, u[1:]):
      gaps.append(j - i)
      if B is not None and j - i < B:
        bad |= {i, j}
    if bad:
      viol.add((c, tuple(sorted(bad)), "min-sep"))
    if K is not None and len(u) > K:
      viol.add((c, tuple(u), "max-participations"))
  return (min(gaps) if gaps else None), kmax, viol


row_lists = hs.lists(
  hs.tuples(hs.integers(0, 7), hs.sampled_from("abcde")), min_size=1, max_size=25
)


@settings(max_examples=60, deadline=None)
@given(row_lists, hs.one_of(hs.none(), hs.integers(1, 5)), hs.one_of(hs.none(), hs.integers(1, 4)))
def test_realized_b_k_and_violations_equal_brute_force(rows, B, K):
  res = audit.audit_arrays(
    arrays(rows),
    BLT,
    2.0,
    1e-6,
    min_sep=B,
    max_participations=K,
    curve=False,
    accountant="analytic",
  )
  b, k, viol = brute(rows, B, K)
  assert res.stats.observed_min_sep == b
  assert res.stats.observed_max_participations == k
  assert {(v.client_id, v.rounds, v.reason) for v in res.violations} == viol
  assert len(res.violations) == len(viol)
  assert res.claim_covers_all_clients == (len(rows) == len(set(rows)))
  assert res.stats.participations == len(set(rows))


def _random_strategy(rng, n):
  kind = rng.integers(4)
  if kind == 0:
    return st.load_strategy(BLT)
  if kind == 1:
    bands = int(rng.integers(1, n + 1))
    cols = [list(rng.normal(size=min(bands, n - j))) for j in range(n)]
    for col in cols:
      col[0] = abs(col[0]) + 0.5
    return st.load_strategy({"mechanism": "bandmf", "n": n, "bands": bands, "columns": cols})
  if kind == 2:
    coefs = list(rng.uniform(-0.5, 1.0, size=int(rng.integers(1, n + 1))))
    coefs[0] = 1.0
    return st.load_strategy({"mechanism": "band-toeplitz", "coefficients": coefs})
  return st.load_strategy({"mechanism": "tree", "variant": "vanilla"})


@settings(max_examples=40, deadline=None)
@given(
  hs.lists(hs.tuples(hs.integers(0, 7), hs.sampled_from("abcd")), min_size=1, max_size=16),
  hs.integers(0, 2**31),
)
def test_sensitivity_never_below_brute_force(rows, seed):
  rng = np.random.default_rng(seed)
  n = 8
  strategy = _random_strategy(rng, n)
  res = audit.audit_arrays(
    arrays(rows), strategy, 1.0, 1e-6, rounds=n, curve=True, accountant="analytic"
  )
  b = res.stats.observed_min_sep
  k = res.stats.observed_max_participations
  c = strategy.matrix(n)
  bf = brute_force_sensitivity(c, b if b is not None else n, k)
  assert res.realized.sensitivity >= bf - 1e-9
  # The curve's last point is the realized claim's sensitivity.
  assert res.curve.sensitivity[-1] == pytest.approx(res.realized.sensitivity, rel=1e-12)


def test_rounds_inferred_warning_and_given(tmp_path):
  rows = [(0, "a"), (4, "a"), (2, "b")]
  res = audit.audit_arrays(arrays(rows), BLT, 2.0, 1e-6)
  assert res.rounds == 5 and res.rounds_source == "inferred"
  assert any("--rounds not given" in w for w in res.warnings)
  res = audit.audit_arrays(arrays(rows), BLT, 2.0, 1e-6, rounds=9)
  assert res.rounds == 9 and not any("--rounds" in w for w in res.warnings)
  assert res.curve.epsilon.shape == (9,)
  with pytest.raises(FedmfUserError, match="round 4"):
    audit.audit_arrays(arrays(rows), BLT, 2.0, 1e-6, rounds=4)


def test_bandmf_horizon_refused():
  s = {"mechanism": "bandmf", "n": 4, "bands": 1, "columns": [[1.0]] * 4}
  with pytest.raises(FedmfUserError, match="n=4"):
    audit.audit_arrays(arrays([(0, "a"), (5, "a")]), s, 1.0, 1e-6)
  res = audit.audit_arrays(arrays([(0, "a"), (2, "a")]), s, 1.0, 1e-6, rounds=4)
  assert res.realized.sensitivity == pytest.approx(2**0.5)


def test_declared_object_and_json_keys(tmp_path):
  path = tmp_path / "log.csv"
  participation_log.write_participation_log(
    path, [0, 0, 3, 5, 5, 9], ["a", "b", "a", "b", "b", "a"]
  )
  res = audit.audit_log(path, BLT, 2.0, 1e-6, rounds=10, min_sep=4, max_participations=2)
  d = json.loads(json.dumps(res.to_dict()))
  for key in [
    "rounds",
    "clients",
    "participations",
    "observed_min_sep",
    "observed_max_participations",
    "violations",
    "sensitivity",
    "sensitivity_method",
    "rho",
    "epsilon",
    "delta",
    "noise_multiplier",
    "declared",
    "claim_covers_all_clients",
    "warnings",
  ]:
    assert key in d
  assert d["rounds"] == 10 and d["clients"] == 2 and d["participations"] == 5
  assert d["observed_min_sep"] == 3 and d["observed_max_participations"] == 3
  assert d["claim_covers_all_clients"] is False
  assert set(d["declared"]) >= {
    "min_sep",
    "max_participations",
    "sensitivity",
    "sensitivity_method",
    "rho",
    "epsilon",
  }
  assert d["declared"]["epsilon"] < d["epsilon"]
  assert {(v["client_id"], v["reason"]) for v in d["violations"]} == {
    ("a", "min-sep"),
    ("a", "max-participations"),
    ("b", "duplicate"),
  }
  # Single participation: observed_min_sep is null.
  res = audit.audit_arrays(arrays([(0, "a"), (1, "b")]), BLT, 2.0, 1e-6)
  assert res.to_dict()["observed_min_sep"] is None
  assert res.realized.sensitivity == pytest.approx(
    np.linalg.norm(st.load_strategy(BLT).matrix(2)[:, 0])
  )


def test_report_files(tmp_path):
  path = tmp_path / "log.csv"
  participation_log.write_participation_log(path, [0, 0, 3, 5, 9], ["a", "b", "a", "b", "a"])
  res = audit.audit_log(path, BLT, 2.0, 1e-6, min_sep=4)
  from fedmf.privacy import report

  paths = report.write_report(res, tmp_path / "rep")
  for f in [
    "report.md",
    "report.html",
    "audit.json",
    "epsilon_curve.csv",
    "gap_histogram.png",
    "participations_per_client.png",
    "epsilon_vs_rounds.png",
  ]:
    assert (tmp_path / "rep" / f).stat().st_size > 0
  md = (tmp_path / "rep" / "report.md").read_text()
  for phrase in [
    "Unit of privacy",
    "Adjacency",
    "Zero-out",
    "Type of accounting",
    "Accounting assumptions",
    "complete",
    "trusted",
    "Formal DP statement",
  ]:
    assert phrase in md
  assert paths["markdown"].endswith("report.md")


_ids = hs.one_of(
  hs.integers(0, 10**19).map(str),
  hs.text(alphabet="ab", min_size=1, max_size=24),
  hs.sampled_from(["client-", "client-000000000000000000000", "é", "éé", "日本", "x" * 40]),
  hs.text(
    alphabet=hs.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters=',"'),
    min_size=1,
    max_size=20,
  ),
)


@settings(max_examples=40, deadline=None)
@given(
  hs.lists(hs.tuples(hs.integers(0, 12), _ids), min_size=1, max_size=40),
  hs.one_of(hs.none(), hs.integers(1, 6)),
  hs.one_of(hs.none(), hs.integers(1, 4)),
  hs.booleans(),
  hs.sampled_from(["csv", "parquet"]),
)
def test_audit_log_fast_path_equals_brute_force(tmp_path_factory, rows, B, K, dup, ext):
  """The file path (packed ids, one key sort) agrees with a Python recomputation, in order."""
  if dup:
    rows = rows + rows[::3]
  path = tmp_path_factory.mktemp("audit") / f"log.{ext}"
  participation_log.write_participation_log(path, [r for r, _ in rows], [c for _, c in rows])
  res = audit.audit_log(
    path, BLT, 2.0, 1e-6, min_sep=B, max_participations=K, curve=False, accountant="analytic"
  )
  b, k, viol = brute(rows, B, K)
  assert res.stats.observed_min_sep == b
  assert res.stats.observed_max_participations == k
  assert res.stats.clients == len({c for _, c in rows})
  assert res.stats.participations == len(set(rows)) and res.stats.log_rows == len(rows)
  listed = [(v["client_id"], tuple(v["rounds"]), v["reason"]) for v in res.violations.to_list()]
  assert set(listed) == viol and len(listed) == len(viol)
  # Order: clients by first appearance in the log, then reason in REASONS order.
  first = {c: i for i, c in reversed(list(enumerate(c for _, c in rows)))}
  assert listed == sorted(listed, key=lambda v: (first[v[0]], log_counts.REASONS.index(v[2])))
  assert [(v.client_id, v.rounds, v.reason) for v in res.violations] == listed


@pytest.mark.parametrize("max_round,num_clients", [(1023, 50), (1024, 50), (1023, 2**23), (0, 3)])
def test_log_statistics_key_layouts_equal_brute_force(max_round, num_clients):
  """uint32 and int64 (code << bits | round) keys, R a power of two or not, agree with brute force."""
  rng = np.random.default_rng(max_round + num_clients)
  n = 3000
  rounds = rng.integers(0, max_round + 1, n)
  rounds[0] = max_round
  codes = rng.integers(0, 50 if max_round else 3, n)
  rows = [(int(r), str(c)) for r, c in zip(rounds, codes)]
  stats, viol = log_statistics.statistics_of_arrays(
    rounds.astype(np.int64), codes.astype(np.int32), num_clients, max(1, max_round // 20), 40, None
  )
  b, k, expected = brute(rows, max(1, max_round // 20), 40)
  assert stats.observed_min_sep == b and stats.observed_max_participations == k
  assert {(v.client_id, v.rounds, v.reason) for v in viol} == expected
  assert stats.participations == len(set(rows)) and stats.clients == num_clients


def test_huge_mu_takes_the_analytic_curve_instead_of_pld():
  """A client in every round makes mu = s / sigma huge; PLD's grid (~mu^2 points) would not fit."""
  from fedmf.privacy import gaussian_curve

  rows = [(r, "hot") for r in range(400)] + [(0, "a")]
  res = audit.audit_arrays(arrays(rows), BLT, 1.0, 1e-6, curve=False, accountant="pld")
  assert res.realized.accountant == "analytic"
  assert any("PLD accounting would need" in w for w in res.warnings)
  assert res.realized.epsilon == gaussian_curve.gaussian_epsilon(res.realized.sensitivity, 1e-6)
  # A moderate mu keeps PLD when asked for.
  res = audit.audit_arrays(
    arrays([(0, "a"), (3, "a")]), BLT, 2.0, 1e-6, curve=False, accountant="pld"
  )
  assert res.realized.accountant == "pld" and not any("PLD" in w for w in res.warnings)


def test_violation_limit_counts_all_lists_first(tmp_path):
  rows = [(r, f"c{c}") for r in range(6) for c in range(5)] + [(5, "c3")]
  path = tmp_path / "log.csv"
  participation_log.write_participation_log(path, [r for r, _ in rows], [c for _, c in rows])
  full = audit.audit_log(
    path,
    BLT,
    2.0,
    1e-6,
    min_sep=2,
    max_participations=3,
    curve=False,
    accountant="analytic",
    violation_limit=None,
  )
  some = audit.audit_log(
    path,
    BLT,
    2.0,
    1e-6,
    min_sep=2,
    max_participations=3,
    curve=False,
    accountant="analytic",
    violation_limit=4,
  )
  assert (
    full.violation_counts()
    == some.violation_counts()
    == {"min-sep": 5, "max-participations": 5, "duplicate": 1}
  )
  assert some.violations.to_list() == full.violations.to_list()[:4]
  d = some.to_dict()
  assert d["violations_truncated"] is True and len(d["violations"]) == 4
  assert full.to_dict()["violations_truncated"] is False
  text = audit_result.format_summary(some, max_violations=2)
  assert "... 9 more (the first 4 in --json)" in text
