"""`participation.model: cyclic-poisson` with partitions and sampling_probability (issue 25 §3),
and the audit check of a log against the partition schema (BandMF §5 Alg. 6, Thm 4)."""

import numpy as np
import pytest

from fedmf.errors import FedmfUserError
from fedmf.mf import strategies as st
from fedmf.participation import ParticipationConfig, ParticipationError, build
from fedmf.privacy import accounting
from fedmf.privacy import partition_audit


def _log(model, rounds):
  clients, times = [], []
  for r in range(rounds):
    cohort = model.sample(r)
    clients += cohort.clients.tolist()
    times += [r] * cohort.clients.size
  return np.array(clients), np.array(times)


def test_contract_keys_build_the_cyclic_poisson_model():
  cfg = ParticipationConfig(model="cyclic-poisson", partitions=4, sampling_probability=0.1)
  assert cfg.model == "cyclic_poisson" and cfg.min_sep == 4
  # partitions overrides a min_sep left by a base config (e.g. the default timer's 50).
  assert ParticipationConfig(model="cyclic-poisson", partitions=4, min_sep=50).min_sep == 4
  model = build(cfg, 400, 10, seed=3)  # expected cohort q·N/P = 0.1·400/4 = 10
  amp = model.amplification()
  assert amp.groups == 4 and amp.sampling_probability == 0.1
  assert model.declared_schema(40).min_sep == 4
  clients, rounds = _log(model, 80)
  for c in np.unique(clients):
    assert len({int(r) % 4 for r in rounds[clients == c]}) == 1
  # Without sampling_probability: q = P·B/N, as before.
  assert build(ParticipationConfig(model="cyclic-poisson", partitions=4), 400, 10, 3)
  assert (
    build(ParticipationConfig(model="cyclic-poisson", partitions=5), 400, 10, 3)
    .amplification()
    .sampling_probability
    == 5 * 10 / 400
  )


@pytest.mark.parametrize(
  "cfg,message",
  [
    (ParticipationConfig(model="uniform", partitions=4), "needs participation.model"),
    (
      ParticipationConfig(model="cyclic-poisson", partitions=4, sampling_probability=1.5),
      r"sampling_probability must be in \(0, 1\]",
    ),
    (
      ParticipationConfig(model="cyclic-poisson", partitions=4, sampling_probability=0.5),
      "set clients_per_round to 50",
    ),
    (ParticipationConfig(model="cyclic-poisson"), "participation.partitions"),
  ],
)
def test_bad_cyclic_configs_name_the_key(cfg, message):
  with pytest.raises(ParticipationError, match=message):
    build(cfg, 400, 10, seed=0)


def test_a_log_of_the_model_complies_and_a_tampered_one_does_not():
  model = build(ParticipationConfig(model="cyclic-poisson", partitions=3), 300, 10, seed=1)
  clients, rounds = _log(model, 30)
  good = partition_audit.check_partitions(clients, rounds, 3)
  assert good.complies and good.participations == rounds.size
  assigned = {int(c): int(model.group[c]) for c in np.unique(clients)}
  assert partition_audit.check_partitions(clients, rounds, 3, assigned).complies
  # Move one participation of one device into a round of another partition.
  i = int(np.flatnonzero(clients == clients[-1])[0])
  moved = rounds.copy()
  moved[i] = rounds[i] + 1 if rounds[i] + 1 < 30 else rounds[i] - 1
  bad = partition_audit.check_partitions(clients, moved, 3, assigned)
  assert not bad.complies
  assert bad.violating_clients == 1 and bad.violating_participations == 1
  assert bad.examples[0].client == clients[-1] and bad.examples[0].round == moved[i]
  assert "outside their partition" in bad.describe()


def test_first_round_defines_the_partition_without_an_assignment():
  # Device 'a' joins rounds 1, 5, 9 (≡ 1 mod 4) then 10 (≡ 2): one violation, in round 10.
  check = partition_audit.check_partitions(["a"] * 4 + ["b"], [9, 1, 10, 5, 3], 4)
  assert check.violating_participations == 1
  assert check.examples[0].round == 10 and check.examples[0].partition == 1


def test_audit_reports_amplified_epsilon_only_for_a_complying_log():
  n, p = 32, 4
  strategy = st.load_strategy(
    {
      "mechanism": "bandmf",
      "n": n,
      "bands": p,
      "columns": [[1.0] * min(p, n - j) for j in range(n)],
    }
  )
  model = build(ParticipationConfig(model="cyclic-poisson", partitions=p), 400, 10, seed=2)
  clients, rounds = _log(model, n)
  kwargs = dict(
    strategy=strategy,
    n=n,
    partitions=p,
    dataset_size=400,
    sampling_probability=0.1,
    noise_multiplier=1.2,
    delta=1e-6,
  )
  audit = partition_audit.audit_amplified(clients, rounds, **kwargs)
  assert audit.compliance.complies and audit.accounting is not None
  # The corrected App. F event: ⌈32/4⌉ = 8 steps at q = 0.1, σ/Δ with Δ = 1 (normalized C).
  assert audit.accounting.epsilon == pytest.approx(
    accounting.dpsgd_epsilon(1.2, 8, 1e-6, sampling_probability=0.1), rel=1e-12
  )
  assert audit.to_dict()["amplified"]["partitions"] == p
  ids, counts = np.unique(clients, return_counts=True)
  i = int(np.flatnonzero(clients == ids[np.argmax(counts)])[-1])  # a device seen more than once
  moved = rounds.copy()
  moved[i] = rounds[i] - 1
  refused = partition_audit.audit_amplified(clients, moved, **kwargs)
  assert refused.accounting is None and "no amplification credited" in refused.note
  with pytest.raises(FedmfUserError, match="beyond the n=16"):
    partition_audit.audit_amplified(clients, rounds, **{**kwargs, "n": 16})
