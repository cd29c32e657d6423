"""`fedmf simulate` with `participation.model: cyclic-poisson` (issue 25 §3): the run is planned
with amplification, and its participation log complies with the partition schema."""

import csv
import json

import pytest

from fedmf.cli import main as cli_main
from fedmf.mf import strategies as st
from fedmf.privacy import amplification
from fedmf.privacy import partition_audit

SETTINGS = [
  "task=synthetic",
  "num_clients=60",
  "vocab_size=40",
  "rounds=9",
  "clients_per_round=4",
  "max_sentences_per_client=16",
  "test_sentences=64",
  "eval_every=9",
  "noise_seed=5",
  "mechanism=bandmf",
  "noise_multiplier=1.5",
  "participation.model=cyclic-poisson",
  "participation.partitions=3",
  "participation.sampling_probability=0.2",  # q·N/P = 0.2·60/3 = 4 = clients_per_round
]


def test_cyclic_poisson_run_is_amplified_and_its_log_complies(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("FEDMF_CACHE_DIR", str(tmp_path / "cache"))
  out = tmp_path / "run"
  args = ["simulate", "--out", str(out), "--no-progress", "--json"]
  for item in SETTINGS:
    args += ["--set", item]
  code = cli_main.main(args)
  captured = capsys.readouterr()
  assert code == 0, captured.err
  summary = json.loads((out / "summary.json").read_text())
  assert "amplified BandMF" in summary["accounting"]
  strategy = st.load_strategy(out / "strategy.json")
  assert strategy.mechanism == "bandmf" and strategy.bands == 3
  sampling = amplification.CyclicPoissonSampling.from_probability(60, 3, 0.2)
  expected = amplification.account_amplified(strategy, 9, sampling, 1e-6, noise_multiplier=1.5)
  assert summary["planned_epsilon"] == pytest.approx(expected.epsilon, rel=1e-12)
  # The run's one accountant is PLD (the amplified event's), named in the plan and the summary,
  # and audit.json names the accountant of its epsilon (the amplified claim's, when credited).
  plan = json.loads((out / "plan.json").read_text())
  audited = json.loads((out / "audit.json").read_text())
  assert plan["accountant"] == summary["accountant"] == "pld"
  if audited["epsilon_amplified"]:
    assert audited["accountant"] == summary["audit"]["accountant"] == "pld"
  assert audited["unamplified_accountant"] == "analytic"
  with open(out / "participation.csv") as f:
    rows = list(csv.DictReader(f))
  clients = [r["client_id"] for r in rows]
  rounds = [int(r["round"]) for r in rows]
  audit = partition_audit.audit_amplified(
    clients,
    rounds,
    strategy=strategy,
    n=9,
    partitions=3,
    dataset_size=60,
    sampling_probability=0.2,
    noise_multiplier=1.5,
    delta=1e-6,
  )
  assert audit.compliance.complies and audit.compliance.participations == len(rows)
  assert audit.accounting.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
