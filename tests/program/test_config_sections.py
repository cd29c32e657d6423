"""The config by concern (issue 21 §3): a key inside its section or by its flat name is one key;
config.json keeps its flat keys in their order; errors name the keys as the docs do."""

import json

import pytest

from fedmf.config_parse import ConfigError
from fedmf.program.config import config_from_dict, load_config

FLAT = """\
task: synthetic
num_clients: 2000
model: lstm-small
vocab_size: 1000
rounds: 150
clients_per_round: 20
mechanism: blt
target_epsilon: 8.0
delta: 1.0e-6
reference_clients_per_round: 1000
client_learning_rate: 0.5
seed: 0
participation:
  model: timer
  timer_unit: rounds
  min_sep: 50
eval_every: 10
checkpoint_every: 5
budget:
  epsilon: 9.0
workers: 2
worker_timeout_s: 30
"""

# The same run written by concern (typed by hand, not generated from the table under test).
BY_CONCERN = """\
task:
  name: synthetic
  num_clients: 2000
  model: lstm-small
  vocab_size: 1000
program:
  rounds: 150
  clients_per_round: 20
  seed: 0
  eval_every: 10
  checkpoint_every: 5
  budget:
    epsilon: 9.0
privacy:
  mechanism: blt
  target_epsilon: 8.0
  delta: 1.0e-6
  reference_clients_per_round: 1000
recipe:
  client_learning_rate: 0.5
participation:
  model: timer
  timer_unit: rounds
  min_sep: 50
platform:
  workers: 2
  worker_timeout_s: 30
"""

# config.json's keys, in the order every run so far has written them.
CONFIG_JSON_KEYS = [
  "task", "num_clients", "model", "vocab_size", "sequence_length", "max_sentences_per_client",
  "batch_size", "test_sentences", "data_dir", "rounds", "clients_per_round", "mechanism", "bands",
  "buffers", "strategy", "force_strategy", "target_epsilon", "noise_multiplier", "delta",
  "reference_clients_per_round", "clip_norm", "client_learning_rate", "server_learning_rate",
  "server_momentum", "warmup_fraction", "cooldown_fraction", "cooldown_factor", "zeroing_linf",
  "eval_every", "seed", "noise_seed", "participation", "checkpoint_every", "budget", "workers",
  "worker_tls", "worker_timeout_s", "worker_isolation", "clients_per_call",
]  # fmt: skip


def _load(tmp_path, text, overrides=()):
  path = tmp_path / "c.yaml"
  path.write_text(text)
  return load_config(path, overrides)


def test_flat_and_by_concern_are_the_same_run(tmp_path):
  flat, by_concern = _load(tmp_path, FLAT), _load(tmp_path, BY_CONCERN)
  assert flat == by_concern
  assert by_concern.privacy.reference_clients_per_round == 1000
  assert by_concern.program.budget.epsilon == 9.0 and by_concern.platform.workers == 2
  assert by_concern.recipe.client_learning_rate == 0.5 and by_concern.recipe.clip_norm == 1.0


def test_sections_and_flat_names_mix(tmp_path):
  mixed = "rounds: 150\nprivacy:\n  mechanism: tree\n  noise_multiplier: 1.0\ntask: synthetic\n"
  c = _load(tmp_path, mixed + "participation:\n  min_sep: 5\n")
  assert (c.program.rounds, c.privacy.mechanism, c.task.name) == (150, "tree", "synthetic")


@pytest.mark.parametrize(
  "overrides",
  [
    ["delta=1e-8", "rounds=60", "budget.epsilon=3", "task=synthetic", "num_clients=500"],
    [
      "privacy.delta=1e-8",
      "program.rounds=60",
      "program.budget.epsilon=3",
      "task.name=synthetic",
      "task.num_clients=500",
    ],
  ],
)
def test_overrides_by_flat_name_or_section(tmp_path, overrides):
  c = _load(tmp_path, BY_CONCERN, overrides)
  assert (c.privacy.delta, c.program.rounds, c.program.budget.epsilon) == (1e-8, 60, 3.0)
  assert (c.task.name, c.task.num_clients) == ("synthetic", 500)
  assert c == _load(tmp_path, FLAT, overrides)


@pytest.mark.parametrize(
  "text, overrides, message",
  [
    ("rounds: 5\nprogram:\n  rounds: 6\n", [], "program.rounds is given twice \\(also as rounds\\)"),
    ("privacy:\n  mechansim: blt\n", [], "unknown config key 'privacy.mechansim'; did you mean "
     "'privacy.mechanism'"),
    ("privacy: 3\n", [], "privacy must be a section of keys, got 3"),
    ("task:\n  name: 5\n", [], "task must be a string, got 5"),
    ("", ["recipe.clip_norm=-1"], "clip_norm must be a finite number > 0, got -1"),
    ("", ["program.budget.epsilon=x"], "budget.epsilon must be a number"),
    ("", ["worker_tls.ca=1"], "worker_tls.ca must be a string"),
    ("", ["recipe.clip_norm.x=1"], "clip_norm must be a number"),
    ("", ["platfrom.workers=2"], "unknown config key 'platfrom.workers'"),
  ],
)  # fmt: skip
def test_errors_name_the_key_as_written(tmp_path, text, overrides, message):
  base = "noise_multiplier: 1.0\nparticipation:\n  min_sep: 5\n"
  with pytest.raises(ConfigError, match=message) as e:
    _load(tmp_path, base + text, overrides)
  assert "\n" not in str(e.value)


def test_config_json_order_is_the_legacy_one_then_new_keys_in_section_order(monkeypatch):
  from fedmf.program import config as config_lib  # pylint: disable=import-outside-toplevel

  assert list(config_lib.FLAT_ORDER) == CONFIG_JSON_KEYS
  # A key added to a section later comes after the legacy keys, with no list to extend by hand.
  extra = {**config_lib.FLAT_KEYS, "new_key": ("recipe", "new_key")}
  monkeypatch.setattr(config_lib, "FLAT_KEYS", extra)
  assert list(config_lib._flat_order()) == [*CONFIG_JSON_KEYS, "new_key"]  # noqa: SLF001


def test_config_json_stays_flat_and_round_trips(tmp_path):
  c = _load(tmp_path, BY_CONCERN, ["noise_seed=7"])
  written = json.loads(json.dumps(c.to_dict()))
  assert list(written) == CONFIG_JSON_KEYS
  assert (written["task"], written["rounds"], written["budget"]) == (
    "synthetic",
    150,
    {"epsilon": 9},
  )
  assert written["participation"]["min_sep"] == 50 and written["noise_seed"] == 7
  assert config_from_dict({**written, "run_id": "x"}) == c


def test_the_docs_two_forms_are_the_same_run(tmp_path):
  import re  # pylint: disable=import-outside-toplevel
  from pathlib import Path  # pylint: disable=import-outside-toplevel

  docs = (Path(__file__).resolve().parents[2] / "docs" / "simulation.md").read_text()
  flat = re.search(r"```yaml\n# flat names\n(.*?)```", docs, re.S).group(1)
  by_concern = re.search(r"```yaml\n# by concern\n(.*?)```", docs, re.S).group(1)
  assert _load(tmp_path, flat) == _load(tmp_path, by_concern)
  assert _load(tmp_path, by_concern).program.budget.epsilon == 9.0
