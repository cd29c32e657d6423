"""Healthy workers are not dropped (issue 35): keep-alive pings the front accepts, silent chunks of
90 s, `worker_timeout_s` measured per call after warm-up, and dropped workers taken back once they
answer a health check."""

from __future__ import annotations

import contextlib
import logging
import time

import pytest

from fedmf.tff import channels
from tests.deploy.workers_helpers import make_certs, running_worker, sleepy_computation, tls_args


def test_the_fronts_ping_policy_accepts_the_coordinators_pings(monkeypatch, tmp_path):
  """gRPC's default server policy (one ping per 5 minutes without data, 2 strikes) answered the
  coordinator's 10 s pings with GOAWAY too_many_pings during a silent chunk."""
  client, server = dict(channels.CHANNEL_OPTIONS), dict(channels.SERVER_OPTIONS)
  assert client["grpc.keepalive_time_ms"] >= server["grpc.http2.min_ping_interval_without_data_ms"]
  assert server["grpc.keepalive_permit_without_calls"] == 1  # pings between chunks are fine too
  assert client["grpc.keepalive_permit_without_calls"] == 1
  assert client["grpc.http2.max_pings_without_data"] == 0  # pings go on through a silent call
  # The front's own channel to its worker_binary (gRPC's default policy there) sends no pings.
  assert not any("keepalive" in k for k, _ in channels.LOCAL_OPTIONS)
  # ... and the front's server really gets these options.
  import grpc  # pylint: disable=import-outside-toplevel

  from fedmf.tff import front  # pylint: disable=import-outside-toplevel

  seen = {}
  real = grpc.server

  def spy(*args, **kwargs):
    seen.update(dict(kwargs.get("options") or ()))
    return real(*args, **kwargs)

  monkeypatch.setattr(front.grpc, "server", spy)
  server_obj, _, _ = front.serve(f"unix:{tmp_path}/s/front.sock", "unix:/nonexistent")
  server_obj.stop(0)
  assert seen == server


def test_health_answers_what_the_worker_binary_does_now_not_a_remembered_state(tmp_path):
  """The front's health service asks its upstream at each Check (on a channel of its own). It
  used to answer from connectivity callbacks of the forwarding channel, which were seen to stop
  at CONNECTING while calls went through: a healthy worker then stayed NOT_SERVING for good."""
  import concurrent.futures  # pylint: disable=import-outside-toplevel

  import grpc  # pylint: disable=import-outside-toplevel
  from grpc_health.v1 import health_pb2  # pylint: disable=import-outside-toplevel

  from fedmf.tff import front  # pylint: disable=import-outside-toplevel

  upstream = f"unix:{tmp_path}/up/worker.sock"
  (tmp_path / "up").mkdir(mode=0o700)

  def start_upstream():  # Any gRPC server stands in for worker_binary: health asks for a connection.
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    assert server.add_insecure_port(upstream)
    server.start()
    return server

  worker = start_upstream()
  served, bound, servicer = front.serve(f"unix:{tmp_path}/s/front.sock", upstream)
  try:
    assert front.check_health(bound)
    for service in ("", front.SERVICE):  # A stale remembered state is not what Check answers.
      servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert front.check_health(bound)
    worker.stop(0).wait()
    assert not front.check_health(bound)  # Answers (NOT_SERVING) within the caller's 5 s.
    worker = start_upstream()
    assert front.check_health(bound)
  finally:
    served.stop(0)
    worker.stop(0)


@pytest.fixture(scope="module")
def tls_workers(tmp_path_factory):
  """`get(n)`: the addresses of n `fedmf worker`s over mutual TLS on loopback (started on first
  need, shared by the module's tests) and the coordinator's TLS files."""
  certs = make_certs(tmp_path_factory.mktemp("certs"))
  tls = channels.TLSFiles(
    str(certs / "ca.pem"), str(certs / "coordinator.pem"), str(certs / "coordinator.key")
  )
  addresses: list[str] = []
  with contextlib.ExitStack() as stack:

    def get(count: int):
      while len(addresses) < count:
        args = ("--listen", "127.0.0.1:0", *tls_args(certs))
        _, served = stack.enter_context(running_worker(*args))
        addresses.append(served.replace("127.0.0.1", "localhost"))
      return addresses[:count], tls

    yield get


def _first_calls_slow(sleepy, first_s: float, later_s: float):
  """A chunk call: `first_s` seconds on a worker's first call, `later_s` after; returns (call,
  the calls made as (context id, chunk index))."""
  seen: set[int] = set()
  made: list[tuple[int, int]] = []

  def call(ctx, index):
    first = id(ctx) not in seen
    seen.add(id(ctx))
    made.append((id(ctx), index))
    seconds = first_s if first else later_s
    return ctx.invoke(sleepy, int(seconds * 1e6))

  return call, made


def test_a_slow_first_call_drops_nobody_and_a_timed_out_worker_comes_back(tls_workers, caplog):
  """Scaled down (worker_timeout_s = 2 s): a first call of 3 s (compilation and tracing take
  that role in a real run) is within the warm-up allowance; a later call of 3 s is a timeout,
  its chunk goes to the other worker, and at a next round the dropped worker answers its
  health check and takes chunks again. The exact numbers of the issue run in the slow test."""
  from fedmf.tff import workers  # pylint: disable=import-outside-toplevel

  caplog.set_level(logging.WARNING, "fedmf.workers")
  sleepy = sleepy_computation()
  addresses, tls = tls_workers(2)
  with workers.WorkerPool(addresses, tls=tls, timeout_s=2.0) as pool:
    call, _ = _first_calls_slow(sleepy, first_s=3.0, later_s=0.05)
    assert pool.map_chunks(call, 4) == [1, 1, 1, 1]
    assert [w.lost for w in pool.workers] == [None, None]
    slow = _slow_chunk(sleepy, index=0, seconds=3.0)  # a timeout; its retry elsewhere is fast
    assert pool.map_chunks(slow, 4) == [1, 1, 1, 1]
    lost = [w for w in pool.workers if w.lost]
    assert len(lost) == 1 and "worker_timeout_s = 2 s" in lost[0].lost
    fast = _slow_chunk(sleepy, index=-1, seconds=0)
    # Rounds until the dropped one is back: the next one, unless a loaded machine makes its first
    # health check miss the 2 s the front waits for worker_binary; the next probe comes 10 s later
    # (workers._PROBE_FIRST_S). (The 1-in-15 failure here was the front answering NOT_SERVING for
    # good from stale connectivity callbacks: test_health_answers_what_the_worker_binary_does_now.)
    deadline = time.monotonic() + 30
    while True:
      assert pool.map_chunks(fast, 4) == [1, 1, 1, 1]
      if not any(w.lost for w in pool.workers) or time.monotonic() > deadline:
        break
      time.sleep(0.6)
    assert [w.lost for w in pool.workers] == [None, None]
  assert "is back (it answers its health check" in caplog.text


def _slow_chunk(sleepy, index: int, seconds: float):
  """Chunk `index` takes `seconds` on its first attempt only; every other call 0.05 s."""
  attempts: list[int] = []

  def call(ctx, i):
    slow = i == index and i not in attempts
    attempts.append(i)
    return ctx.invoke(sleepy, int((seconds if slow else 0.05) * 1e6))

  return call


@pytest.mark.slow
def test_worker_timeout_20_s_with_a_first_call_of_30_s_drops_nobody(tls_workers):
  from fedmf.tff import workers  # pylint: disable=import-outside-toplevel

  sleepy = sleepy_computation()
  addresses, tls = tls_workers(4)
  with workers.WorkerPool(addresses[2:], tls=tls, timeout_s=20.0) as pool:
    call, made = _first_calls_slow(sleepy, first_s=30.0, later_s=0.5)
    assert pool.map_chunks(call, 6) == [1] * 6
    assert [w.lost for w in pool.workers] == [None, None]
    assert len({ctx for ctx, _ in made}) == 2  # both workers ran chunks


@pytest.mark.slow
def test_five_silent_chunks_of_95_s_over_mutual_tls_are_not_dropped(tls_workers, capfd):
  """Five remote workers, each given one chunk that sends nothing for 95 s; the coordinator pings
  every 10 s throughout. Before the fix the fronts answered with GOAWAY too_many_pings after
  about 30 s and the coordinator dropped them ("unreachable for 5 s")."""
  from fedmf.tff import workers  # pylint: disable=import-outside-toplevel

  sleepy = sleepy_computation()
  addresses, tls = tls_workers(5)
  with workers.WorkerPool(addresses, tls=tls, timeout_s=600.0) as pool:
    warm = _slow_chunk(sleepy, index=-1, seconds=0)
    assert pool.map_chunks(warm, 5) == [1] * 5  # one round to warm every worker up
    silent = lambda ctx, i: ctx.invoke(sleepy, 95_000_000)  # noqa: E731
    assert pool.map_chunks(silent, 5) == [1] * 5
    assert [w.lost for w in pool.workers] == [None] * 5
  # gRPC core logs a GOAWAY on this process's stderr (seen with the old policy on a 40 s chunk).
  assert "too_many_pings" not in capfd.readouterr().err
