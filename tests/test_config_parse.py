"""The one config parser (fedmf/config_parse.py) and its rules in both config systems: `--set KEY=`
is null, a key given twice is refused (on the command line as in a YAML file), `--set rounds 10`
says that --set takes KEY=VALUE."""

import argparse
import math

import pytest

from fedmf import config_parse
from fedmf import yaml_files
from fedmf.cli import main as cli_main
from fedmf.cli import simulate as simulate_cli
from fedmf.config_parse import ConfigError
from fedmf.program import config as program_config
from fedmf.public_features import config as pf_config


def test_one_config_error_for_both_systems():
  with pytest.raises(ConfigError):
    program_config.load_config(None, ["rounds=two"])
  with pytest.raises(ConfigError):
    pf_config.load(None, ["dim=two"])


@pytest.mark.parametrize(
  "text, path, value",
  [
    ("rounds=10", ["rounds"], 10),
    ("privacy.delta=1e-8", ["privacy", "delta"], "1e-8"),  # YAML 1.1: a string, coerced later
    ("noise_seed=null", ["noise_seed"], None),
    ("noise_seed=", ["noise_seed"], None),  # nothing after '=': null, as `KEY:` in YAML
    ("name=a=b", ["name"], "a=b"),
    ("federated=true", ["federated"], True),
  ],
)
def test_an_override_is_a_path_and_a_yaml_scalar(text, path, value):
  assert config_parse.parse_override(text) == (path, value)


@pytest.mark.parametrize("text", ["=3", "rounds", " =1"])
def test_an_override_without_a_key_is_refused(text):
  with pytest.raises(ConfigError, match="--set expects KEY=VALUE"):
    config_parse.parse_override(text)


def test_a_mapping_or_a_list_is_one_value_only_where_a_list_is_taken():
  with pytest.raises(ConfigError, match="expected a single value"):
    config_parse.parse_override("rounds=[1, 2]")
  assert config_parse.parse_override("workers=[a, b]", list_keys=("workers",))[1] == ["a", "b"]


def test_the_argparse_type_says_what_set_takes():
  assert config_parse.override_argument("rounds=10") == "rounds=10"
  with pytest.raises(argparse.ArgumentTypeError, match="takes KEY=VALUE, got 'rounds'"):
    config_parse.override_argument("rounds")


@pytest.mark.parametrize(
  "overrides, message",
  [
    (["rounds=3", "rounds=4"], "--set rounds is given twice: give each key once"),
    (
      ["delta=1e-8", "privacy.delta=1e-7"],
      "--set privacy.delta is given twice (also as --set delta): give each key once",
    ),
    (
      ["privacy.delta=1e-8", "delta=1e-7"],
      "--set delta is given twice (also as --set privacy.delta): give each key once",
    ),
    (
      ["task=synthetic", "task.name=synthetic"],
      "--set task.name is given twice (also as --set task): give each key once",
    ),
  ],
)
def test_a_key_given_twice_on_the_command_line_is_refused(overrides, message):
  with pytest.raises(ConfigError) as refused:
    program_config.load_config(None, overrides)
  assert str(refused.value) == message


def test_public_features_refuses_a_key_given_twice_too():
  with pytest.raises(ConfigError, match="--set epsilon is given twice"):
    pf_config.load(None, ["epsilon=1", "epsilon=2"])


@pytest.mark.parametrize(
  "text, kind, expected",
  [
    ("1e-8", float, 1e-8),
    (1e3, int, 1000),
    (7, float, 7.0),
    ("x", str, "x"),
    (False, bool, False),
  ],
)
def test_scalars_are_coerced_to_their_key_type(text, kind, expected):
  assert config_parse.coerce("k", text, kind) == expected


@pytest.mark.parametrize(
  "value, kind, message",
  [
    (1.5, int, "k must be an integer, got 1.5"),
    (True, int, "k must be an integer, got true"),
    (None, float, "k must be a number, got null"),
    (math.nan, float, "k must be finite, got nan"),
    (math.inf, float, "k must be finite, got inf"),
    (10**400, float, "k must be finite"),
    ("yes", bool, "k must be true or false, got 'yes'"),
    (3, str, "k must be a string, got 3"),
  ],
)
def test_a_wrong_value_names_its_key(value, kind, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
    config_parse.coerce("k", value, kind)


def test_infinity_only_where_the_key_allows_it():
  assert config_parse.coerce("epsilon", math.inf, float, infinite=True) == math.inf  # YAML .inf
  assert config_parse.coerce("epsilon", "inf", float, infinite=True) == math.inf
  with pytest.raises(ConfigError, match="finite"):
    config_parse.coerce("epsilon", math.nan, float, infinite=True)
  assert pf_config.load(None, ["epsilon=inf"]).private is False


def test_set_key_empty_is_null_in_both_systems():
  # A key that may be unset is unset ...
  default = simulate_cli.default_config_path()
  unset = program_config.load_config(default, ["noise_seed="])
  assert unset.privacy.noise_seed is None
  assert pf_config.load(None, ["rating_offset="]).rating_offset is None
  # ... any other refuses null, naming itself.
  with pytest.raises(ConfigError, match="rounds must be an integer, got null"):
    program_config.load_config(default, ["rounds="])
  with pytest.raises(ConfigError, match="dim must be an integer, got null"):
    pf_config.load(None, ["dim="])


def test_a_yaml_key_given_twice_is_refused_with_both_lines(tmp_path):
  path = tmp_path / "c.yaml"
  path.write_text("rounds: 3\nprivacy:\n  delta: 1e-8\n  delta: 1e-7\n")
  with pytest.raises(ConfigError, match=r"key 'delta' is given twice \(lines 3 and 4\)"):
    program_config.load_config(path)
  path.write_text("base: &b {x: 1}\nother:\n  <<: *b\n  x: 2\n")  # a merge key may be overridden
  assert yaml_files.read_mapping(path, ConfigError)["other"] == {"x": 2}


@pytest.mark.parametrize("command", ["simulate", "train", "public-features"])
def test_a_forgotten_equals_sign_is_a_one_line_usage_error(command, capsys, tmp_path):
  out = ["--root" if command == "train" else "--out", str(tmp_path / "o")]
  with pytest.raises(SystemExit) as exited:
    cli_main.main([command, "--set", "rounds", "10", *out])
  assert exited.value.code == 2
  err = capsys.readouterr().err
  assert err.strip() == (
    f"fedmf {command}: error: argument --set: takes KEY=VALUE, got 'rounds': write --set "
    f"rounds=VALUE (see fedmf {command} --help)"
  )
  assert not (tmp_path / "o").exists()
