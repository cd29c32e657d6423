"""The deployment artifacts: every `fedmf` command line in them is accepted by fedmf's own parser,
with the config files and certificates they name; the manifests fit together; each pod passes the
Kubernetes Pod Security Standards ("baseline", and "restricted" too), checked on the objects
`kubectl kustomize` renders; and no container gets a key it does not need (issue 35)."""

from __future__ import annotations

import shutil
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


def _render(directory: Path) -> list[dict]:
  """The objects `kubectl kustomize DIRECTORY` renders. Without kubectl (it ships with this
  machine's google-cloud-cli), deploy/k8s's own resources are read as files: the kustomization
  lists them and adds only a ConfigMap (the overlay's patch is applied by kubectl only)."""
  if shutil.which("kubectl"):
    out = subprocess.run(
      ["kubectl", "kustomize", str(directory)], check=True, capture_output=True, text=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]
  if directory != DEPLOY / "k8s":
    pytest.skip("rendering an overlay needs kubectl")
  kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
  docs = []
  for name in kustomization["resources"]:
    docs += [d for d in yaml.safe_load_all((directory / name).read_text()) if d]
  return docs


def _k8s_docs() -> list[dict]:
  return [d for d in _render(DEPLOY / "k8s") if d["kind"] != "ConfigMap"]


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
  mounts = {"/certs": certs, "/opt/fedmf": ROOT, "/data": tmp_path / "root"}
  commands = _compose_commands()
  assert {c[1][0] for c in commands} == {"worker", "train"}
  for _, args in commands:
    _check(args, mounts, tmp_path)


def test_k8s_commands_parse_with_their_files(certs, tmp_path):
  mounts = {"/certs": certs, "/config": DEPLOY / "k8s", "/data": tmp_path / "root"}
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
  # The coordinator's ROOT is on its volume, at the directory the image gives its user.
  assert any(v.endswith(":/data") for v in compose["services"]["coordinator"]["volumes"])
  dockerfile = (DEPLOY / "Dockerfile").read_text()
  assert "install -d -o 10001 -g 10001 -m 0700 /data" in dockerfile and "USER 10001" in dockerfile


# ---------------------------------------------------------------------------------------------
# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards), the
# controls of "baseline" and of "restricted", on every pod template the manifests render.

_BASELINE_CAPABILITIES = {
  "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
  "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
_SAFE_SYSCTLS = {
  "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
  "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
  "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
  "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
_RESTRICTED_VOLUMES = {
  "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
  "secret",
}  # fmt: skip


def _containers(pod: dict) -> list[dict]:
  return [c for key in ("initContainers", "containers", "ephemeralContainers")
          for c in pod.get(key, [])]  # fmt: skip


def pod_security_violations(pod: dict, level: str) -> list[str]:
  """What in a pod spec breaks the Pod Security Standard `level` ("baseline" or "restricted")."""
  bad = []
  pod_sc = pod.get("securityContext", {})
  for key in ("hostNetwork", "hostPID", "hostIPC"):
    if pod.get(key):
      bad.append(f"{key}: true")
  if pod_sc.get("windowsOptions", {}).get("hostProcess"):
    bad.append("hostProcess")
  for volume in pod.get("volumes", []):
    if "hostPath" in volume:
      bad.append(f"hostPath volume {volume['name']}")
    kinds = set(volume) - {"name"}
    if level == "restricted" and not kinds <= _RESTRICTED_VOLUMES:
      bad.append(f"volume {volume['name']} of type {sorted(kinds)}")
  for sysctl in pod_sc.get("sysctls", []):
    if sysctl["name"] not in _SAFE_SYSCTLS:
      bad.append(f"sysctl {sysctl['name']}")
  contexts = [("pod", pod_sc)] + [
    (c["name"], c.get("securityContext", {})) for c in _containers(pod)
  ]
  for name, sc in contexts:
    if sc.get("seccompProfile", {}).get("type") == "Unconfined":
      bad.append(f"{name}: seccomp Unconfined")
    if sc.get("appArmorProfile", {}).get("type") == "Unconfined":
      bad.append(f"{name}: AppArmor Unconfined")
    selinux = sc.get("seLinuxOptions", {})
    if selinux.get("type") not in (None, "", "container_t", "container_init_t", "container_kvm_t"):
      bad.append(f"{name}: SELinux type {selinux['type']}")
    if selinux.get("user") or selinux.get("role"):
      bad.append(f"{name}: SELinux user/role")
  for container in _containers(pod):
    sc, name = container.get("securityContext", {}), container["name"]
    if sc.get("privileged"):
      bad.append(f"{name}: privileged")
    added = set(sc.get("capabilities", {}).get("add", []))
    if not added <= _BASELINE_CAPABILITIES:
      bad.append(f"{name}: adds capabilities {sorted(added - _BASELINE_CAPABILITIES)}")
    if sc.get("procMount", "Default") != "Default":
      bad.append(f"{name}: procMount {sc['procMount']}")
    if any(p.get("hostPort") for p in container.get("ports", [])):
      bad.append(f"{name}: hostPort")
    if level == "restricted":
      if sc.get("allowPrivilegeEscalation") is not False:
        bad.append(f"{name}: allowPrivilegeEscalation is not false")
      if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        bad.append(f"{name}: does not drop ALL capabilities")
      if added - {"NET_BIND_SERVICE"}:
        bad.append(f"{name}: adds {sorted(added)}")
      non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
      if non_root is not True or sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
        bad.append(f"{name}: may run as root")
      seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
      if seccomp not in ("RuntimeDefault", "Localhost"):
        bad.append(f"{name}: seccomp profile {seccomp}")
  return bad


def _pods(docs: list[dict]) -> list[tuple[str, dict]]:
  kinds = ("StatefulSet", "Job", "Deployment", "DaemonSet", "ReplicaSet", "CronJob")
  return [(d["metadata"]["name"], _pod_spec(d)) for d in docs if d["kind"] in kinds]


def test_the_pod_security_check_catches_what_issue_35_found():
  """The old StatefulSet (root, SYS_ADMIN, no seccomp, no allowPrivilegeEscalation) fails."""
  old = {
    "containers": [
      {
        "name": "worker",
        "securityContext": {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}},
      }
    ]
  }
  assert pod_security_violations(old, "baseline") == ["worker: adds capabilities ['SYS_ADMIN']"]
  assert len(pod_security_violations(old, "restricted")) >= 5
  assert pod_security_violations({"hostNetwork": True, "containers": []}, "baseline")


@pytest.mark.parametrize("directory", ["k8s", "k8s-containerd"])
def test_every_pod_passes_baseline_and_restricted(directory):
  docs = _render(DEPLOY / directory)
  pods = _pods(docs)
  assert {name for name, _ in pods} == {"fedmf-worker", "fedmf-train"}
  for name, pod in pods:
    for level in ("baseline", "restricted"):
      assert pod_security_violations(pod, level) == [], (name, level)
    for container in pod["containers"]:
      sc = container["securityContext"]
      assert sc["readOnlyRootFilesystem"] is True
      assert container["resources"]["requests"] and container["resources"]["limits"]
    assert pod["automountServiceAccountToken"] is False


def test_the_kustomization_renders_with_kubectl():
  if not shutil.which("kubectl"):
    pytest.skip("kubectl is not installed (the objects are still checked, read as files)")
  kinds = sorted(d["kind"] for d in _render(DEPLOY / "k8s"))
  assert kinds.count("NetworkPolicy") == 3 and "PodDisruptionBudget" in kinds
  assert "ConfigMap" in kinds and "PersistentVolumeClaim" in kinds


def test_workers_are_probed_on_the_health_service_and_have_a_disruption_budget():
  docs = {(d["kind"], d["metadata"]["name"]): d for d in _k8s_docs()}
  workers = docs[("StatefulSet", "fedmf-worker")]
  (container,) = _pod_spec(workers)["containers"]
  args = container["args"]
  health_port = int(args[args.index("--health-listen") + 1].rsplit(":", 1)[1])
  for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
    assert container[probe]["grpc"]["port"] == health_port
  pdb = docs[("PodDisruptionBudget", "fedmf-worker")]
  assert pdb["spec"]["selector"] == workers["spec"]["selector"]
  assert pdb["spec"]["maxUnavailable"] == 1
  egress = {
    name: d["spec"] for (kind, name), d in docs.items()
    if kind == "NetworkPolicy" and "Egress" in d["spec"]["policyTypes"]
  }  # fmt: skip
  assert egress["fedmf-worker-egress"]["egress"] == []  # workers open no connection
  to_workers = egress["fedmf-coordinator-egress"]["egress"][0]
  assert to_workers["to"][0]["podSelector"] == {"matchLabels": {"app": "fedmf-worker"}}


def _secret_items(pod: dict) -> set[str]:
  return {
    item["path"] for v in pod.get("volumes", []) if "secret" in v for item in v["secret"]["items"]
  }


def test_no_container_gets_a_key_it_does_not_need():
  docs = {(d["kind"], d["metadata"]["name"]): d for d in _k8s_docs()}
  assert _secret_items(_pod_spec(docs[("StatefulSet", "fedmf-worker")])) == {
    "ca.pem", "worker.pem", "worker.key",
  }  # fmt: skip
  assert _secret_items(_pod_spec(docs[("Job", "fedmf-train")])) == {
    "ca.pem", "coordinator.pem", "coordinator.key",
  }  # fmt: skip
  compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
  mounted = {
    name: {Path(v.split(":")[1]).name for v in svc.get("volumes", []) if v.startswith("./certs")}
    for name, svc in compose["services"].items()
  }
  assert mounted["worker-0"] == mounted["worker-1"] == {"ca.pem", "worker.pem", "worker.key"}
  assert mounted["coordinator"] == {"ca.pem", "coordinator.pem", "coordinator.key"}
  for name, svc in compose["services"].items():
    assert svc["user"] == "10001:10001" and svc["cap_drop"] == ["ALL"], name
    assert svc["read_only"] is True and "cap_add" not in svc, name


def test_the_readme_names_the_certificates_kubernetes_workers_need():
  text = (DEPLOY / "README.md").read_text()
  assert "fedmf-worker-0.fedmf-worker" in text and "fedmf-worker-1.fedmf-worker" in text
