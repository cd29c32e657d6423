"""Shared by the `fedmf worker` tests: certificates, starting a worker, TFF calls through it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

from tests import netns

ROOT = Path(__file__).resolve().parents[2]


def make_certs(directory: Path, *names: str, env: Optional[dict] = None) -> Path:
  subprocess.run(
    ["bash", str(ROOT / "deploy/certs/make-certs.sh"), str(directory), *names],
    check=True,
    capture_output=True,
    env=None if env is None else {**os.environ, **env},
  )
  return directory


def sign_client(certs: Path, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
  """A client certificate signed by certs/ca.key: (pem, key)."""
  key, csr, ext, pem = (certs / f"{name}.{s}" for s in ("key", "csr", "ext", "pem"))
  subprocess.run(
    ["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
     "-subj", subject, "-keyout", str(key), "-out", str(csr)],
    check=True, capture_output=True,
  )  # fmt: skip
  ext.write_text(extensions + "\n")
  subprocess.run(
    ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(certs / "ca.pem"), "-CAkey",
     str(certs / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out",
     str(pem)],
    check=True, capture_output=True,
  )  # fmt: skip
  os.chmod(key, 0o600)
  return pem, key


def tls_args(certs: Path) -> list[str]:
  return [
    "--tls-cert", str(certs / "worker.pem"), "--tls-key", str(certs / "worker.key"),
    "--tls-client-ca", str(certs / "ca.pem"),
  ]  # fmt: skip


def worker_command(*args: str) -> list[str]:
  return [sys.executable, "-m", "fedmf.cli.main", "worker", *args]


@contextlib.contextmanager
def running_worker(*args: str, env: Optional[dict] = None, **popen) -> Iterator[tuple]:
  """A `fedmf worker` that printed its ready line: (process, served address). Stopped on exit."""
  proc = subprocess.Popen(
    worker_command(*args),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=None if env is None else {**os.environ, **env},
    **popen,
  )
  try:
    line = netns.read_line(proc, 120)
    match = re.search(r"serving on (\S+) ", line)
    if not match:
      proc.kill()
      raise RuntimeError(f"fedmf worker did not start: {line!r} {proc.communicate()[1][-2000:]}")
    yield proc, match.group(1)
  finally:
    if proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def credentials(certs: Path, name: str = "coordinator", key: Optional[Path] = None):
  import grpc  # pylint: disable=import-outside-toplevel

  return grpc.ssl_channel_credentials(
    (certs / "ca.pem").read_bytes(),
    (key or certs / f"{name}.key").read_bytes(),
    (certs / f"{name}.pem").read_bytes(),
  )


def executor_call(target: str, creds=None, timeout: float = 10):
  """(status code, details) of one TFF executor call: the worker's own answer (NOT_FOUND: "no
  cardinality provided", the request crossed the front), or the connection's failure."""
  import grpc  # pylint: disable=import-outside-toplevel
  from tensorflow_federated.proto.v0 import executor_pb2, executor_pb2_grpc

  channel = grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target)
  try:
    stub = executor_pb2_grpc.ExecutorGroupStub(channel)
    stub.GetExecutor(executor_pb2.GetExecutorRequest(), timeout=timeout)
    return grpc.StatusCode.OK, ""
  except grpc.RpcError as e:
    return e.code(), e.details()
  finally:
    channel.close()


def sleepy_computation():
  """A TFF computation that sleeps `micros` microseconds on the worker, sending nothing (the
  channel stays silent), then returns 1. tf.data's sleep transformation: no CPU is burnt."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import tensorflow_federated as tff  # pylint: disable=import-outside-toplevel
  from tensorflow.python.data.experimental.ops import testing  # pylint: disable=import-outside-toplevel

  @tff.tensorflow.computation(tf.int64)
  def sleepy(micros):
    data = tf.data.Dataset.range(1).apply(testing.sleep(micros))
    return data.reduce(tf.constant(0, tf.int64), lambda total, x: total + x + 1)

  return sleepy
