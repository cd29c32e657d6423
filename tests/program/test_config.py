"""The training config: YAML + dotted overrides, strict keys and values, the shipped configs."""

import dataclasses
from pathlib import Path

import pytest

from fedmf.config_parse import ConfigError
from fedmf.program.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, text):
  path = tmp_path / "c.yaml"
  path.write_text(text)
  return path


def test_yaml_and_overrides(tmp_path):
  path = _write(tmp_path, "rounds: 50\nnoise_multiplier: 1.5\nparticipation:\n  min_sep: 5\n")
  c = load_config(path, ["participation.model=epoch_shuffle", "rounds=60", "delta=1e-8"])
  assert (c.program.rounds, c.privacy.noise_multiplier, c.privacy.delta) == (60, 1.5, 1e-8)
  assert (c.participation.model, c.participation.min_sep) == ("epoch_shuffle", 5)
  assert load_config(path, ["noise_seed=18446744073709551615"]).privacy.noise_seed == 2**64 - 1


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["roundz=3"], "did you mean 'rounds'"),
    (["participation.min_spe=3"], "participation.min_sep"),
    (["rounds=abc"], "rounds must be an integer"),
    (["rounds=0"], "rounds must be an integer >= 1"),
    (["rounds=2.5"], "rounds must be an integer"),
    (["noise_multiplier=null"], "give target_epsilon or noise_multiplier"),
    (["noise_multiplier=-1"], "noise_multiplier"),
    (["noise_multiplier=.nan"], "noise_multiplier must be finite"),
    (["delta=1.5"], "delta"),
    (["participation.server_guard=maybe"], "true or false"),
    (["participation=3"], "section"),
    (["mechanism=tre"], "mechanism must be one of"),
    (["task=stackoverflow"], "--data-dir"),
    (["noise_seed=18446744073709551616"], "noise_seed"),
    (["warmup_fraction=0.8"], "warmup_fraction \\+ cooldown_fraction"),
    (["clients_per_round=5000"], "exceeds num_clients"),
    (["participation.model=fancy"], "participation.model"),
    (["rounds"], "KEY=VALUE"),
  ],
)
def test_bad_values_are_one_line_errors_naming_the_key(tmp_path, overrides, message):
  path = _write(tmp_path, "noise_multiplier: 1.0\nparticipation:\n  min_sep: 5\n")
  with pytest.raises(ConfigError, match=message) as e:
    load_config(path, overrides)
  assert "\n" not in str(e.value)


def test_missing_and_malformed_files(tmp_path):
  with pytest.raises(ConfigError, match="not found"):
    load_config(tmp_path / "none.yaml")
  with pytest.raises(ConfigError, match="not valid YAML"):
    load_config(_write(tmp_path, "rounds: [1, 2\n"))
  with pytest.raises(ConfigError, match="mapping"):
    load_config(_write(tmp_path, "- 1\n- 2\n"))


def test_cheap_simulation_factor():
  c = load_config(
    None,
    [
      "noise_multiplier=1",
      "participation.min_sep=5",
      "clients_per_round=10",
      "reference_clients_per_round=100",
    ],
  )
  assert c.noise_scale_factor == pytest.approx(0.1)
  assert c.cheap_simulation
  # A reference equal to the cohort trained is the run itself, not a simulation of another.
  same = dataclasses.replace(
    c, privacy=dataclasses.replace(c.privacy, reference_clients_per_round=10)
  )
  assert same.noise_scale_factor == 1.0 and not same.cheap_simulation
  none = dataclasses.replace(
    c, privacy=dataclasses.replace(c.privacy, reference_clients_per_round=None)
  )
  assert not none.cheap_simulation


def test_eval_rounds_are_every_eval_every_and_the_last():
  program = load_config(
    None, ["noise_multiplier=0", "participation.min_sep=2", "rounds=7", "eval_every=3"]
  ).program
  assert [r for r in range(7) if program.is_eval_round(r)] == [2, 5, 6]


CONFIGS = sorted(p.name for p in (ROOT / "simulations" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("name", [n for n in CONFIGS if not n.startswith("public-features-")])
def test_shipped_configs_validate(name):
  path = ROOT / "simulations" / "configs" / name
  c = load_config(path, data_dir="/nonexistent")  # StackOverflow configs need a data dir.
  assert c.program.rounds >= 1


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.startswith("public-features-")])
def test_shipped_public_features_configs_validate(name):
  from fedmf.public_features import config as pf_config  # pylint: disable=import-outside-toplevel

  assert pf_config.load(str(ROOT / "simulations" / "configs" / name), data_dir="/nonexistent")


def test_stackoverflow_data_is_found_where_tff_and_keras_leave_it(tmp_path, monkeypatch):
  """Issue 26, B.7: without --data-dir, TFF's cache (~/.tff) holds stackoverflow.sqlite and Keras's
  datasets directory the word counts; the error names the place looked and the TFF call."""
  from fedmf.config_parse import ConfigError
  from fedmf.program.config import load_config

  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.delenv("KERAS_HOME", raising=False)
  with pytest.raises(ConfigError) as e:
    load_config(None, ["task=stackoverflow", "target_epsilon=8", "participation.min_sep=5"])
  message = str(e.value)
  assert str(tmp_path / ".tff" / "stackoverflow.sqlite") in message
  assert "stackoverflow.load_data()" in message and "--data-dir" in message
  (tmp_path / ".tff").mkdir()
  (tmp_path / ".tff" / "stackoverflow.sqlite").write_bytes(b"")
  config = load_config(None, ["task=stackoverflow", "target_epsilon=8", "participation.min_sep=5"])
  assert config.task.data_dir == str(tmp_path / ".tff")

  from fedmf.tasks import stackoverflow as sod

  datasets = tmp_path / ".keras" / "datasets"
  datasets.mkdir(parents=True)
  (datasets / sod.WORD_COUNT_NAME).write_text("the 10\nof 7\nand 3\n")
  assert list(sod.read_word_counts(str(tmp_path / ".tff"), 2).items()) == [("the", 10), ("of", 7)]


DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "simulations" / "configs" / "default.yaml"


def test_a_file_key_the_overrides_make_moot_gives_way():
  """Issue 38 item 18: the default config sets participation.min_sep 50; switching it to the hours
  timer on the command line used to be refused for a min_sep the user never wrote."""
  config = load_config(
    DEFAULT_CONFIG, ["participation.timer_unit=hours", "participation.timer_hours=30"]
  )
  assert config.participation.timer_unit == "hours"
  assert config.participation.timer_hours == 30
  assert config.participation.min_sep is None
  # The same for a mechanism override that makes a file's bands moot.
  config = load_config(DEFAULT_CONFIG, ["mechanism=bandmf", "bands=8"])
  assert config.privacy.bands == 8
  config = load_config(DEFAULT_CONFIG, [])  # The file alone keeps its min_sep.
  assert config.participation.min_sep == 50


def test_a_moot_key_that_cannot_give_way_names_the_exact_override(tmp_path):
  train = Path(__file__).resolve().parents[2] / "deploy" / "configs" / "train.yaml"
  with pytest.raises(ConfigError) as e:
    load_config(train, ["participation.min_sep=5"])  # The user's own: refused, not dropped.
  assert str(e.value) == (
    "participation.min_sep has no effect here (the hours timer counts participation.timer_hours):"
    " remove --set participation.min_sep=5, or change the setting"
  )
  path = tmp_path / "c.yaml"  # A file that is inconsistent on its own.
  path.write_text(
    "target_epsilon: 8\nparticipation:\n  model: timer\n  timer_unit: hours\n  min_sep: 50\n"
  )
  for overrides in ([], ["rounds=10"]):
    with pytest.raises(ConfigError) as e:
      load_config(path, overrides)
    assert str(e.value).endswith(
      f"it comes from {path}: add --set participation.min_sep=null, or change the setting"
    )
  assert load_config(path, ["participation.min_sep=null"]).participation.min_sep is None


@pytest.mark.parametrize(
  "settings,groups",
  [
    (["mechanism=bandmf", "bands=3"], 3),  # one group per band
    (["mechanism=dpsgd"], 1),
    (["mechanism=blt"], None),  # no default: a ConfigError naming participation.min_sep
    (["mechanism=bandmf", "bands=3", "participation.partitions=5"], "given"),
  ],
)
def test_cyclic_poisson_groups_are_resolved_by_the_config(settings, groups):
  config = load_config(
    None,
    [
      "noise_multiplier=1",
      "participation.model=cyclic-poisson",
      "participation.sampling_probability=0.1",
      *settings,
    ],
  )
  if groups == "given":  # partitions give min_sep: nothing to resolve
    assert config.poisson_groups is None
  elif groups is None:
    with pytest.raises(ConfigError, match="needs participation.min_sep"):
      config.poisson_groups
  else:
    assert config.poisson_groups == groups
  timer = load_config(None, ["noise_multiplier=1", "participation.min_sep=5"])
  assert timer.poisson_groups is None
