"""`participation.model: cyclic-poisson` in a config is planned with amplification (issue 25 §3)."""

import pytest

from fedmf import participation as participation_lib
from fedmf.mf import strategies as st
from fedmf.privacy import amplification
from fedmf.program import plan as plan_lib
from fedmf.config_parse import ConfigError
from fedmf.program.config import load_config


def _config(tmp_path, *overrides):
  path = tmp_path / "c.yaml"
  path.write_text(
    "rounds: 32\nnum_clients: 400\nclients_per_round: 10\nmechanism: bandmf\nbands: 4\n"
    "noise_multiplier: 1.2\ndelta: 1.0e-6\n"
    "participation:\n  model: cyclic-poisson\n  partitions: 4\n  sampling_probability: 0.1\n"
  )
  return load_config(path, list(overrides))


def test_cyclic_poisson_config_is_accounted_with_amplification(tmp_path):
  config = _config(tmp_path)
  assert config.participation.model == "cyclic_poisson"
  assert (config.participation.partitions, config.participation.min_sep) == (4, 4)
  model = participation_lib.build(
    config.participation,
    config.task.num_clients,
    config.program.clients_per_round,
    0,
    config.poisson_groups,
  )
  schema = model.declared_schema(config.program.rounds)
  strategy = st.load_strategy(
    {
      "mechanism": "bandmf",
      "n": 32,
      "bands": 4,
      "columns": [[1.0] * min(4, 32 - j) for j in range(32)],
    }
  )
  plan = plan_lib.make_plan(config, model, strategy, schema)
  assert "amplified BandMF" in plan.accounting
  sampling = amplification.CyclicPoissonSampling.from_probability(400, 4, 0.1)
  expected = amplification.account_amplified(strategy, 32, sampling, 1e-6, noise_multiplier=1.2)
  assert plan.epsilon == pytest.approx(expected.epsilon, rel=1e-12)


@pytest.mark.parametrize(
  "override,message",
  [
    ("participation.sampling_probability=0.5", "set clients_per_round to 50"),
    ("participation.model=timer", "needs participation.model: cyclic-poisson"),
  ],
)
def test_cyclic_poisson_config_errors(tmp_path, override, message):
  with pytest.raises((ConfigError, participation_lib.ParticipationError), match=message):
    config = _config(tmp_path, override)
    participation_lib.build(
      config.participation, config.task.num_clients, config.program.clients_per_round, 0, None
    )
