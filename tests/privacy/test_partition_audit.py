"""The auditor's side of a declared cyclic Poisson sampling, without a simulation: the partition
check on a log read as codes, the fallbacks that credit no amplification, and what a run
directory's config.json declares (`fedmf.program.run_dir.declared_sampling`)."""

import numpy as np
import pyarrow as pa
import pytest

from fedmf.mf import strategies as st
from fedmf.privacy import amplification
from fedmf.privacy.partition_audit import DeclaredSampling, audit_declared
from fedmf.program import run_dir

DECLARED = DeclaredSampling(partitions=2, dataset_size=8, sampling_probability=0.5)
IDS = pa.array(["a", "b", "c", "d"])
# a, b in partition 0 (rounds 0, 2, 4), c, d in partition 1 (rounds 1, 3, 5).
CODES = np.array([0, 1, 2, 3, 0, 2, 1])
ROUNDS = np.array([0, 0, 1, 1, 2, 3, 4])


def _bandmf(n, bands):
  rng = np.random.default_rng(0)
  columns = [list(1.0 + rng.random(min(bands, n - j))) for j in range(n)]
  return st.load_strategy({"mechanism": "bandmf", "n": n, "bands": bands, "columns": columns})


def test_a_complying_log_is_credited_the_amplified_epsilon():
  strategy = _bandmf(6, 2)
  result = audit_declared(
    IDS, CODES, ROUNDS, DECLARED, strategy=strategy, n=6, noise_multiplier=2.0, delta=1e-6
  )
  assert result.compliance.complies and result.compliance.clients == 4
  sampling = amplification.CyclicPoissonSampling.from_probability(8, 2, 0.5)
  expected = amplification.account_amplified(strategy, 6, sampling, 1e-6, noise_multiplier=2.0)
  assert result.accounting.epsilon == expected.epsilon
  assert result.note.startswith("amplified epsilon")


def test_a_violation_names_the_device_by_its_id_and_credits_nothing():
  rounds = ROUNDS.copy()
  rounds[-1] = 5  # b (partition 0, first in round 0) in round 5, partition 1's.
  result = audit_declared(
    IDS, CODES, rounds, DECLARED, strategy=_bandmf(6, 2), n=6, noise_multiplier=2.0, delta=1e-6
  )
  assert not result.compliance.complies and result.accounting is None
  assert result.compliance.examples[0].client == "b"
  assert "device b (partition 0) in round 5" in result.note
  assert result.to_dict()["amplified"] is None


@pytest.mark.parametrize(
  "strategy, why",
  [
    (_bandmf(6, 3), "more than the 2 partitions"),  # Thm 4 needs bands <= partitions.
    (st.load_strategy({"mechanism": "tree"}), "needs a banded strategy"),
  ],
)
def test_what_amplification_cannot_cover_falls_back_with_the_reason(strategy, why):
  result = audit_declared(
    IDS, CODES, ROUNDS, DECLARED, strategy=strategy, n=6, noise_multiplier=2.0, delta=1e-6
  )
  assert result.compliance.complies and result.accounting is None
  assert result.note.startswith("no amplification credited") and why in result.note


def test_run_dir_reads_the_declared_sampling(tmp_path):
  config = {
    "num_clients": 60,
    "clients_per_round": 4,
    "participation": {"model": "cyclic_poisson", "partitions": 3, "min_sep": 3},
  }
  # q defaults to P·clients_per_round/N = 3·4/60 (fedmf.participation.CyclicPoisson).
  got = run_dir.declared_sampling(config, {}, None, tmp_path / "config.json")
  assert got == DeclaredSampling(3, 60, 0.2)
  # The population the run sampled (summary.json) wins over the config's synthetic one.
  got = run_dir.declared_sampling(config, {"num_clients": 120}, None, tmp_path / "config.json")
  assert got.dataset_size == 120 and got.sampling_probability == pytest.approx(0.1)
  config["participation"]["sampling_probability"] = 0.25
  assert run_dir.declared_sampling(config, {}, None, tmp_path).sampling_probability == 0.25
  assert run_dir.declared_sampling({"participation": {"model": "timer"}}, {}, 3, tmp_path) is None
  with pytest.raises(run_dir.RunDirError, match="cannot check the declared sampling"):
    run_dir.declared_sampling({"participation": {"model": "cyclic-poisson"}}, {}, 3, tmp_path)


def test_plan_notes_leave_the_amplification_to_an_audit_that_checks_it():
  plan = {"accounting": "amplified BandMF (BandMF §5): 3 groups, q = 0.2, PLD"}
  assert any("credits no amplification" in n for n in run_dir.plan_notes(plan))
  assert run_dir.plan_notes(plan, sampling_audited=True) == ()
