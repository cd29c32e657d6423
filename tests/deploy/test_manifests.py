"""The deployment artifacts: every `fedmf` command line in them is accepted by fedmf's own parser,
with the config files and certificates they name, and the manifests fit together."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from fedmf.cli import main as cli_main
from fedmf.cli import simulate as simulate_cli
from fedmf.cli import worker as worker_cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
  out = tmp_path_factory.mktemp("certs")
  subprocess.run(
    ["bash", str(DEPLOY / "certs/make-certs.sh"), str(out), "worker-0", "worker-1"],
    check=True,
    capture_output=True,
  )
  return out


def _compose_commands() -> list[tuple[str, list[str]]]:
  doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
  return [(name, [str(a) for a in svc["command"]]) for name, svc in doc["services"].items()]


def _k8s_docs() -> list[dict]:
  docs = []
  for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
    if path.name in ("kustomization.yaml", "train.yaml"):
      continue
    docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
  return docs


def _pod_spec(doc: dict) -> dict:
  return doc["spec"]["template"]["spec"]


def _k8s_commands() -> list[tuple[str, list[str]]]:
  found = []
  for doc in _k8s_docs():
    if doc["kind"] in ("StatefulSet", "Job", "Deployment"):
      for container in _pod_spec(doc)["containers"]:
        assert container["image"].startswith("fedmf")
        found.append((doc["metadata"]["name"], [str(a) for a in container["args"]]))
  return found


def _map(args: list[str], mounts: dict[str, Path]) -> list[str]:
  out = []
  for arg in args:
    for inside, outside in mounts.items():
      if arg.startswith(inside + "/") or arg == inside:
        arg = str(outside) + arg[len(inside) :]
    out.append(arg)
  return out


def _check(args: list[str], mounts: dict[str, Path], tmp_path: Path) -> None:
  parsed = cli_main.build_parser().parse_args(_map(args, mounts))  # SystemExit if refused
  if parsed.command == "worker":
    worker_cli.check_args(parsed)  # listen address and TLS files
  elif parsed.command in ("train", "simulate"):
    config = Path(parsed.config)
    text = config.read_text()
    for inside, outside in mounts.items():  # the config's own paths, as mounted
      text = text.replace(f" {inside}/", f" {outside}/")
    copy = tmp_path / config.name
    copy.write_text(text)
    parsed.config = str(copy)
    simulate_cli.load(parsed)  # validates every key, reads the certificates
  else:
    raise AssertionError(f"unexpected fedmf command {parsed.command}")


def test_compose_commands_parse_with_their_files(certs, tmp_path):
  mounts = {"/certs": certs, "/opt/fedmf": ROOT, "/root-dir": tmp_path / "root"}
  commands = _compose_commands()
  assert {c[1][0] for c in commands} == {"worker", "train"}
  for _, args in commands:
    _check(args, mounts, tmp_path)


def test_k8s_commands_parse_with_their_files(certs, tmp_path):
  mounts = {"/certs": certs, "/config": DEPLOY / "k8s", "/root-dir": tmp_path / "root"}
  commands = _k8s_commands()
  assert {c[1][0] for c in commands} == {"worker", "train"}
  for _, args in commands:
    _check(args, mounts, tmp_path)


def test_the_manifests_fit_together():
  docs = {(d["kind"], d["metadata"]["name"]): d for d in _k8s_docs()}
  service = docs[("Service", "fedmf-worker")]
  workers = docs[("StatefulSet", "fedmf-worker")]
  assert service["spec"]["clusterIP"] == "None" and workers["spec"]["serviceName"] == "fedmf-worker"
  port = service["spec"]["ports"][0]["port"]
  # The coordinator names exactly the StatefulSet's pods through the headless Service.
  config = yaml.safe_load((DEPLOY / "k8s" / "train.yaml").read_text())
  expected = [f"fedmf-worker-{i}.fedmf-worker:{port}" for i in range(workers["spec"]["replicas"])]
  assert config["workers"] == expected
  # Only the coordinator's pods may reach the workers' port.
  policy = docs[("NetworkPolicy", "fedmf-worker-ingress")]["spec"]
  assert policy["podSelector"]["matchLabels"] == workers["spec"]["template"]["metadata"]["labels"]
  (rule,) = policy["ingress"]
  job = docs[("Job", "fedmf-train")]
  assert (
    rule["from"][0]["podSelector"]["matchLabels"] == job["spec"]["template"]["metadata"]["labels"]
  )
  assert [p["port"] for p in rule["ports"]] == [port]
  # ROOT on a claim that exists, so a rescheduled pod resumes.
  volumes = {v["name"]: v for v in _pod_spec(job)["volumes"]}
  assert volumes["root"]["persistentVolumeClaim"]["claimName"] in {
    n for k, n in docs if k == "PersistentVolumeClaim"
  }
  # Compose: the coordinator names the worker services on the port they listen on.
  compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
  cluster = yaml.safe_load((DEPLOY / "configs" / "cluster-train.yaml").read_text())
  for address in cluster["workers"]:
    host, _, p = address.rpartition(":")
    assert host in compose["services"]
    assert f"0.0.0.0:{p}" in compose["services"][host]["command"]
  assert "ports" not in compose["services"]["worker-0"]  # published on no host interface
