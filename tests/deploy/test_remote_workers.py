"""`fedmf worker` on emulated hosts (network namespaces), over mutual TLS, driven by `fedmf train`.

The acceptance of the scale-out issue: two workers, each in a namespace with an address of its own,
mTLS on; the trained model is the in-process one bit for bit; plaintext clients and clients with a
certificate of another CA are refused; a worker killed with SIGKILL mid-run neither hangs the
coordinator nor makes it release the round, and a rerun after the worker is back ends with the
uninterrupted run's model.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from tests.helpers import settings
from tests import netns

ROOT = Path(__file__).resolve().parents[2]
TINY = [
  "num_clients=60",
  "vocab_size=40",
  "clients_per_round=4",
  "clients_per_call=1",
  "max_sentences_per_client=16",
  "test_sentences=64",
  "eval_every=3",
  "participation.min_sep=3",
  "noise_seed=3",
  "noise_multiplier=1.0",
  "rounds=6",
  "checkpoint_every=2",
]
PORT = 8470


def _certs(directory: Path, *names: str) -> Path:
  subprocess.run(
    ["bash", str(ROOT / "deploy/certs/make-certs.sh"), str(directory), *names],
    check=True,
    capture_output=True,
  )
  return directory


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
  netns.require()
  base = tmp_path_factory.mktemp("remote")
  with netns.hosts(2, tag="w") as hosts:
    certs = _certs(base / "certs", *[h.address for h in hosts])
    other = _certs(base / "other-ca", "localhost")
    os.environ["FEDMF_CACHE_DIR"] = str(base / "cache")
    try:
      yield {"hosts": hosts, "certs": certs, "other": other, "base": base}
    finally:
      os.environ.pop("FEDMF_CACHE_DIR", None)


def _train(root: Path, extra: list[str], capsys) -> tuple[int, str]:
  args = ["train", "--root", str(root), "--no-progress"]
  for item in settings(TINY, extra):
    args += ["--set", item]
  code = cli_main.main(args)
  return code, capsys.readouterr().err


def _tls(certs: Path, cert: str = "coordinator") -> list[str]:
  return [
    f"worker_tls.ca={certs / 'ca.pem'}",
    f"worker_tls.cert={certs / (cert + '.pem')}",
    f"worker_tls.key={certs / (cert + '.key')}",
  ]


def _workers(*hosts: netns.Host) -> str:
  return "workers=[" + ", ".join(f"'{h.address}:{PORT}'" for h in hosts) + "]"


def _weights(root: Path):
  with np.load(root / "release" / "final_model.npz") as f:
    return [f[k] for k in f.files]


@pytest.fixture(scope="module")
def reference(setting):
  root = setting["base"] / "in-process"
  args = ["train", "--root", str(root), "--no-progress"]
  for item in TINY:
    args += ["--set", item]
  assert cli_main.main(args) == 0
  return _weights(root)


def test_two_remote_workers_over_mtls_give_the_in_process_model(setting, reference, capsys):
  a, b = setting["hosts"]
  workers = [
    netns.start_worker(a, setting["certs"], PORT),
    netns.start_worker(b, setting["certs"], PORT),
  ]
  try:
    code, err = _train(
      setting["base"] / "remote", [_workers(a, b), *_tls(setting["certs"])], capsys
    )
    assert code == 0, err
    for x, y in zip(reference, _weights(setting["base"] / "remote")):
      np.testing.assert_array_equal(x, y)
  finally:
    for proc in workers:
      proc.send_signal(signal.SIGTERM)
      assert proc.wait(timeout=30) == 143
  assert not subprocess.run(["ip", "netns", "pids", a.name], capture_output=True, text=True).stdout


def _executor_call(target: str, credentials=None):
  """The status of one TFF executor call: the worker's own answer, or the connection's failure."""
  import grpc  # pylint: disable=import-outside-toplevel
  from tensorflow_federated.proto.v0 import executor_pb2, executor_pb2_grpc

  channel = (
    grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
  )
  try:
    stub = executor_pb2_grpc.ExecutorGroupStub(channel)
    stub.GetExecutor(executor_pb2.GetExecutorRequest(), timeout=10)
    return grpc.StatusCode.OK
  except grpc.RpcError as e:
    return e.code()
  finally:
    channel.close()


def test_a_worker_refuses_plaintext_and_foreign_certificates(setting):
  import grpc  # pylint: disable=import-outside-toplevel

  a, _ = setting["hosts"]
  certs, other = setting["certs"], setting["other"]
  worker = netns.start_worker(a, certs, PORT)
  target = f"{a.address}:{PORT}"
  try:
    read = lambda p: Path(p).read_bytes()  # noqa: E731
    good = grpc.ssl_channel_credentials(
      read(certs / "ca.pem"), read(certs / "coordinator.key"), read(certs / "coordinator.pem")
    )
    # The right certificate reaches TFF's executor, which answers this empty request itself
    # ("no cardinality provided"): the request crossed the front.
    assert _executor_call(target, good) == grpc.StatusCode.NOT_FOUND
    assert _executor_call(target) == grpc.StatusCode.UNAVAILABLE  # plaintext: no handshake
    foreign = grpc.ssl_channel_credentials(  # Trusts the worker, but signed by another CA.
      read(certs / "ca.pem"), read(other / "coordinator.key"), read(other / "coordinator.pem")
    )
    assert _executor_call(target, foreign) == grpc.StatusCode.UNAVAILABLE
    no_cert = grpc.ssl_channel_credentials(read(certs / "ca.pem"))
    assert _executor_call(target, no_cert) == grpc.StatusCode.UNAVAILABLE
  finally:
    worker.send_signal(signal.SIGINT)
    assert worker.wait(timeout=30) == 130


def _kill_after_rows(root: Path, proc: subprocess.Popen, rows: int) -> threading.Thread:
  def watch():
    journal = root / "journal.csv"
    netns.wait_until(
      lambda: journal.exists() and len(journal.read_text().splitlines()) - 1 >= rows, 600
    )
    proc.kill()

  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


def _released(root: Path) -> int:
  with open(root / "journal.csv") as f:
    return len(list(csv.DictReader(f)))


def test_a_lost_worker_stops_the_run_and_a_rerun_resumes_to_the_same_model(
  setting, reference, capsys
):
  a, _ = setting["hosts"]
  certs = setting["certs"]
  root = setting["base"] / "lost"
  extra = [_workers(a), *_tls(certs), "worker_timeout_s=60"]
  worker = netns.start_worker(a, certs, PORT)
  watcher = _kill_after_rows(root, worker, 3)
  code, err = _train(root, extra, capsys)
  watcher.join()
  assert code == 1, err
  lines = [line for line in err.splitlines() if line.startswith("fedmf train: error")]
  assert len(lines) == 1 and f"{a.address}:{PORT}" in lines[0], err
  released = _released(root)
  assert 3 <= released < 6  # Stopped mid-run, no round past the one that failed.
  netns.start_worker(a, certs, PORT)  # The worker is back: the rerun resumes and finishes.
  code, err = _train(root, extra, capsys)
  assert code == 0, err
  for x, y in zip(reference, _weights(root)):
    np.testing.assert_array_equal(x, y)


def test_chunks_of_a_lost_worker_go_to_the_other_one(setting, reference, capsys, caplog):
  a, b = setting["hosts"]
  certs = setting["certs"]
  root = setting["base"] / "failover"
  for proc in list(a.processes) + list(b.processes):
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  netns.start_worker(a, certs, PORT)
  victim = netns.start_worker(b, certs, PORT)
  watcher = _kill_after_rows(root, victim, 2)
  code, err = _train(root, [_workers(a, b), *_tls(certs)], capsys)
  watcher.join()
  assert code == 0, err
  assert f"{b.address}:{PORT} lost" in caplog.text
  for x, y in zip(reference, _weights(root)):
    np.testing.assert_array_equal(x, y)
