"""The platform keys: workers (count or addresses), worker_tls, worker_timeout_s, worker_isolation."""

import subprocess
from pathlib import Path

import pytest

from fedmf.config_parse import ConfigError
from fedmf.program.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
  out = tmp_path_factory.mktemp("certs")
  subprocess.run(
    ["bash", str(ROOT / "deploy/certs/make-certs.sh"), str(out), "localhost"],
    check=True,
    capture_output=True,
  )
  return out


def _load(tmp_path, text, overrides=()):
  path = tmp_path / "c.yaml"
  path.write_text("noise_multiplier: 1.0\nparticipation:\n  min_sep: 5\n" + text)
  return load_config(path, list(overrides))


def test_workers_as_a_count_or_addresses(tmp_path, certs):
  assert _load(tmp_path, "workers: 3\n").platform.workers == 3
  c = _load(tmp_path, "workers: ['unix:/run/w0.sock', 'unix:///run/w1.sock']\n")
  assert c.platform.workers == ("unix:/run/w0.sock", "unix:///run/w1.sock")  # No TLS needed.
  tls = f"worker_tls:\n  ca: {certs}/ca.pem\n  cert: {certs}/coordinator.pem\n  key: {certs}/coordinator.key\n"
  c = _load(tmp_path, "workers: ['10.1.2.3:8470', '[fd00::1]:8470']\n" + tls)
  assert c.platform.tls_files.ca == f"{certs}/ca.pem"
  c = _load(tmp_path, "", ["workers=[10.1.2.3:8470]", *tls_overrides(certs)])
  assert c.platform.workers == ("10.1.2.3:8470",)
  assert _load(tmp_path, "worker_timeout_s: 30\n").platform.worker_timeout_s == 30.0


def tls_overrides(certs):
  return [
    f"worker_tls.ca={certs}/ca.pem",
    f"worker_tls.cert={certs}/coordinator.pem",
    f"worker_tls.key={certs}/coordinator.key",
  ]


@pytest.mark.parametrize(
  "text, message",
  [
    ("workers: -1\n", "workers must be an integer >= 0"),
    ("workers: []\n", "non-empty list"),
    ("workers: ['nohost']\n", "must be 'host:port'"),
    ("workers: ['h:99999']\n", "no valid port"),
    ("workers: [8470]\n", "'host:port' or 'unix:PATH' strings"),
    ("workers: ['h:1', 'h:1']\n", "twice"),
    ("workers: ['10.1.2.3:8470']\n", "is a TCP address, where plaintext would let anyone"),
    # Loopback too: every local user could reach a plaintext worker (issue 35).
    ("workers: ['127.0.0.1:8470']\n", "let every local user run code on it: give worker_tls"),
    ("workers: ['localhost:8470']\n", "or serve that worker on a Unix socket"),
    ("workers: ['unix:relative.sock']\n", "give unix:/ABSOLUTE/PATH"),
    ("workers: ['unix:/a.sock', 'unix:/a.sock']\n", "twice"),
    ("worker_timeout_s: 0\n", "worker_timeout_s must be a finite number > 0"),
    ("worker_isolation: open\n", "worker_isolation must be one of"),
    ("clients_per_call: 0\n", "clients_per_call must be an integer >= 1"),
    ("worker_tls:\n  ca: /nonexistent/ca.pem\n", "needs exactly ca, cert and key"),
  ],
)
def test_bad_platform_values_are_one_line_errors(tmp_path, text, message):
  with pytest.raises(ConfigError, match=message) as e:
    _load(tmp_path, text)
  assert "\n" not in str(e.value)


def test_unreadable_or_non_pem_certificates_are_named(tmp_path, certs):
  bad = tmp_path / "not.pem"
  bad.write_text("hello")
  for ca, expected in ((tmp_path / "missing.pem", "cannot read"), (bad, "is not a PEM file")):
    text = (
      f"workers: ['10.1.2.3:8470']\nworker_tls:\n  ca: {ca}\n  cert: {certs}/coordinator.pem\n"
      f"  key: {certs}/coordinator.key\n"
    )
    with pytest.raises(ConfigError, match=expected) as e:
      _load(tmp_path, text)
    assert str(ca) in str(e.value)


@pytest.mark.parametrize(
  "settings, expected",
  [
    (["model=lstm-paper", "clients_per_round=100"], 20),  # the model's chunks of 20
    (["model=lstm-paper", "clients_per_round=10"], 10),  # one chunk: the round's clients
    (["model=lstm-small", "clients_per_round=100"], 50),
    (["model=lstm-paper", "clients_per_round=100", "clients_per_call=4"], 4),
    (["model=lstm-paper", "clients_per_round=3", "clients_per_call=8"], 3),
  ],
)
def test_concurrent_clients_are_the_clients_of_one_call(settings, expected):
  config = load_config(None, ["noise_multiplier=0", "participation.min_sep=5", *settings])
  assert config.concurrent_clients == expected


def test_the_platform_gives_the_runner_and_writes_into_no_run():
  """The logic/platform split: `platform.round_runner` returns the runner the run is built with
  (the same runner without a pool); nothing in platform.py assigns to another object's attribute."""
  import ast

  from fedmf.program import platform

  runner = object()
  assert platform.round_runner(runner, 8, None) is runner
  tree = ast.parse((ROOT / "fedmf" / "program" / "platform.py").read_text())
  writes = [
    node.lineno
    for node in ast.walk(tree)
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
    if isinstance(target, ast.Attribute)
  ]
  assert writes == []
  assert not hasattr(platform, "attach")
