#!/usr/bin/env python3
"""One client step of an LSTM preset as TFF's worker runs it: a TF Session with Grappler off.

TFF 0.87's worker_binary runs every computation in a `tensorflow::Session` whose options turn the
graph optimizer off (`disable_meta_optimizer`, `OptimizerOptions.L0`, no JIT; TFF's
cc/core/impl/executors/session_provider.cc). This script builds the client step (forward, gradients,
SGD update) of --model on one batch (16 × 20 tokens, 10,000 words) in a TF1 graph and runs it:

  * in sessions like the worker's (Grappler off) and like plain TF's (Grappler on), with 1 and 2
    intra-op threads, interleaved; per arm the median process CPU time and wall time of a step;
  * once traced (FULL_TRACE, the worker-like session): the time per op type, so the non-matmul
    share of a step is visible.

  .venv/bin/python benchmarks/client_step_ops.py [--model lstm-paper] [--seconds 4]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The sibling script that builds the same client step (as benchmarks/audit_engines.py imports its
# sibling: a package named `benchmarks` in site-packages would shadow `from benchmarks import`).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from client_step_profile import LENGTH, seeded_batch, seeded_model, sgd_step  # noqa: E402


def _cpu() -> float:
  t = os.times()
  return t.user + t.system


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--model", default="lstm-paper")
  parser.add_argument("--vocab", type=int, default=10_000)
  parser.add_argument("--seconds", type=float, default=4.0)
  args = parser.parse_args(argv)

  import tensorflow as tf
  from tensorflow.core.protobuf import rewriter_config_pb2

  xs, ys = seeded_batch(args.vocab)
  graph = tf.Graph()
  with graph.as_default():
    model, loss_fn = seeded_model(args.model, args.vocab)
    x = tf.compat.v1.placeholder(tf.int32, [None, LENGTH])
    y = tf.compat.v1.placeholder(tf.int32, [None, LENGTH])
    train = tf.group(*sgd_step(model, loss_fn, x, y, dense=True)[1])
    init = tf.compat.v1.global_variables_initializer()
    matmul_types = {"MatMul", "_MklMatMul", "BatchMatMulV2", "_MklBatchMatMulV2", "_FusedMatMul"}

  def session(grappler: bool, threads: int):
    config = tf.compat.v1.ConfigProto(
      intra_op_parallelism_threads=threads, inter_op_parallelism_threads=2
    )
    if not grappler:  # TFF's worker: session_provider.cc get_session_options()
      config.graph_options.rewrite_options.disable_meta_optimizer = True
      config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
      config.graph_options.optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.OFF
    else:
      config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.ON
    sess = tf.compat.v1.Session(graph=graph, config=config)
    sess.run(init)
    return sess

  feed = {x: xs, y: ys}
  arms = {
    f"{'grappler-on ' if g else 'worker-like'} intra {t}": session(g, t)
    for g in (False, True)
    for t in (1, 2)
  }
  for sess in arms.values():
    for _ in range(2):
      sess.run(train, feed)
  wall = {k: [] for k in arms}
  cpu = {k: [] for k in arms}
  deadline = time.perf_counter() + args.seconds * len(arms)
  while time.perf_counter() < deadline:
    for k, sess in arms.items():
      c0, t0 = _cpu(), time.perf_counter()
      for _ in range(5):
        sess.run(train, feed)
      wall[k].append((time.perf_counter() - t0) / 5)
      cpu[k].append((_cpu() - c0) / 5)

  def med(v):
    return sorted(v)[len(v) // 2]

  base = med(cpu["worker-like intra 2"])
  print(f"{args.model} client step (batch 16 × 20); load {os.getloadavg()[0]:.2f}")
  for k in arms:
    print(
      f"  {k}: CPU {med(cpu[k]) * 1e3:6.1f} ms (×{med(cpu[k]) / base:.2f})  wall median "
      f"{med(wall[k]) * 1e3:6.1f} ms  best {min(wall[k]) * 1e3:6.1f} ms"
    )
  # Time per op type in the worker-like session, 1 intra-op thread (ops run one after another).
  sess = arms["worker-like intra 1"]
  by_type = collections.Counter()
  types = {op.name: op.type for op in graph.get_operations()}
  runs = 5
  for _ in range(runs):
    meta = tf.compat.v1.RunMetadata()
    sess.run(
      train,
      feed,
      options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
      run_metadata=meta,
    )
    for dev in meta.step_stats.dev_stats:
      for node in dev.node_stats:
        name = node.node_name.split(":")[0]
        by_type[types.get(name, name)] += node.op_end_rel_micros - node.op_start_rel_micros
  total = sum(by_type.values())
  mm = sum(v for k, v in by_type.items() if k in matmul_types)
  print(
    f"  traced (worker-like, intra 1): {total / runs / 1e3:.1f} ms of op time per step, matmul "
    f"{mm / total:.0%}; top op types:"
  )
  for k, v in by_type.most_common(14):
    print(f"    {k:28s} {v / runs / 1e3:7.2f} ms  {v / total:5.1%}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
