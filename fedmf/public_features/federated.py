"""Federated SSP (the paper's Algorithm 8, App. F) as TFF computations; the noise is added inside
the aggregation, so what is placed at SERVER is already the noisy statistics.

Distributor: the released item side ṽ (and the DP item counts n̂) are broadcast to the clients.
Client k (`client_rows`): its UserUpdate with its own bias (App. E.1) on its own ratings, ū =
[Clip(u_k, Γ_u), β], ȳ = Clip(y − o − c_k, Γ_y), its weights w_i from n̂ (App. E.1; the
normalization needs only its own items), and one row per rated item: the upper triangle of
w_i ū ūᵀ / s_A beside w_i ȳ_i ū / s_b, i.e. its contribution in units of the sensitivities (norm
≤ √2: A and b are two Gaussian mechanisms with the same σ, one Gaussian with μ² = 2/σ²).
Aggregator (`ScatterNoiseFactory`, a `tff.aggregators` factory on fedmf's DP machinery): clips each
client's rows jointly to √2 (`fedmf.tff.clipping`, the bound the accounting assumes, enforced even
for a client that does not follow the protocol), scatter-adds them into the dense item statistics
(`tff.federated_aggregate`) and adds the Gaussian noise σ·N (`fedmf.tff.dp_mean.noised_mean`).
Server: receives Â, b̂ (in sensitivity units), rescales them, and runs the same ItemUpdate as
the centralized AM-SSP (`algorithms.train` with `releaser()`).

Clients are batched into TFF calls of `clients_per_call` (as `fedmf simulate` chunks its cohorts):
one release is several `next` calls of the aggregation process. Its state holds the running total,
which starts as the noise itself, and the calls left; its result is the noisy total on the
release's last call (zeros before). The state is the aggregator's own, secret as fedmf's noise
seeds are: in a deployment the secure aggregator keeps it; the server gets only the results.

The noise is drawn on the host from the run's noise generator, in the same order as the
centralized path, and handed to the aggregator (as `fedmf.tff.host_noise.HostNoiseFactory`), so
both paths release the same statistics for the same seed (up to float summation order). The item
counts are released the same way (each client's capped indicator rows, scaled by 1/√cap).
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.public_features import statistics
from fedmf.public_features.algorithms import Releaser
from fedmf.public_features.data import Ratings
from fedmf.tff import dp_mean
from fedmf.tff import clipping
from fedmf.tff import context as tff_context

CLIENT_TYPE = tff.StructType(
  [
    ("items", tff.TensorType(np.int32, [None])),
    ("labels", tff.TensorType(np.float64, [None])),
    ("count_items", tff.TensorType(np.int32, [None])),
  ]
)
CLIENTS_PER_CALL = 256  # default users per TFF call (docs/benchmarks.md §5: the speed measured)


def rows_type(width: int) -> tff.StructType:
  """What a client sends the aggregator: the items it rated and one row per item."""
  return tff.StructType(
    [
      ("items", tff.TensorType(np.int32, [None])),
      ("rows", tff.TensorType(np.float64, [None, width])),
    ]
  )


class ScatterNoiseFactory(tff.aggregators.UnweightedAggregationFactory):
  """Clip each client's rows jointly, scatter-add them into (num_items, width), add the noise.

  The process's state is OrderedDict(total=float64[num_items, width], calls_left=int32): the
  running noisy total of a release and the calls it still takes. `start(unit_noise, scale, calls)`
  is the state that begins a release (total = scale·z, through fedmf's DP-mean arithmetic; the
  rows are in units of their sensitivities, so scale is the noise multiplier σ); each `next` adds
  one call's clipped rows; the last returns the total as its result and resets the state.
  Measurements: the clients of the call and how many were clipped.
  """

  def __init__(self, num_items: int, width: int, clip_norm: float):
    self.num_items, self.width = int(num_items), int(width)
    self._clip = float(dp_mean.dp_mean_arguments(0.0, clip_norm, 1.0)[0])
    total_type = tff.TensorType(np.float64, [self.num_items, self.width])
    self.state_type = tff.StructType(
      [("total", total_type), ("calls_left", tff.TensorType(np.int32))]
    )

    @tff.tensorflow.computation(total_type, tff.TensorType(np.float64), tff.TensorType(np.int32))
    def start(unit_noise, scale, calls):
      # The DP sum's arithmetic (fedmf.tff.dp_mean.noised_mean): (0 + scale·z) / 1.
      (total,) = dp_mean.noised_mean([tf.zeros_like(unit_noise)], [unit_noise], scale, 1.0)
      return collections.OrderedDict(total=total, calls_left=calls)

    self.start = start

  def create(self, value_type) -> tff.templates.AggregationProcess:
    m, width, clip = self.num_items, self.width, self._clip
    total_type = tff.TensorType(np.float64, [m, width])

    @tff.tensorflow.computation
    def init_tf():
      return collections.OrderedDict(
        total=tf.zeros([m, width], tf.float64), calls_left=tf.constant(0, tf.int32)
      )

    @tff.tensorflow.computation(value_type)
    def clip_tf(value):
      (rows,), was_clipped, _ = clipping.clip_update([value["rows"]], clip)
      return collections.OrderedDict(items=value["items"], rows=rows), was_clipped

    @tff.tensorflow.computation
    def zero():
      return tf.zeros([m, width], tf.float64)

    @tff.tensorflow.computation(total_type, clip_tf.type_signature.result[0])
    def accumulate(total, value):
      return tf.tensor_scatter_nd_add(total, value["items"][:, None], value["rows"])

    @tff.tensorflow.computation(total_type, total_type)
    def merge(a, b):
      return a + b

    @tff.tensorflow.computation(total_type)
    def report(total):
      return total

    @tff.tensorflow.computation(init_tf.type_signature.result, total_type)
    def server_tf(state, chunk):
      total = state["total"] + chunk
      left = state["calls_left"] - 1
      last = left <= 0
      finite = tf.debugging.Assert(
        tf.reduce_all(tf.math.is_finite(total)), ["fedmf: the noisy statistics are not finite"]
      )
      with tf.control_dependencies([finite]):
        result = tf.where(last, total, tf.zeros_like(total))
      new_state = collections.OrderedDict(
        total=tf.where(last, tf.zeros_like(total), total), calls_left=tf.maximum(left, 0)
      )
      return new_state, result

    @tff.federated_computation
    def init_fn():
      return tff.federated_eval(init_tf, tff.SERVER)

    @tff.federated_computation(
      tff.FederatedType(init_tf.type_signature.result, tff.SERVER),
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      clipped, was_clipped = tff.federated_map(clip_tf, value)
      chunk = tff.federated_aggregate(clipped, zero(), accumulate, merge, report)
      new_state, result = tff.federated_map(server_tf, (state, chunk))
      ones = tff.federated_map(_one, was_clipped)
      measurements = collections.OrderedDict(
        clients=tff.federated_sum(ones), clipped_count=tff.federated_sum(was_clipped)
      )
      return tff.templates.MeasuredProcessOutput(
        state=new_state, result=result, measurements=tff.federated_zip(measurements)
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


@tff.tensorflow.computation(np.int32)
def _one(_):
  return tf.constant(1, tf.int32)


def _upper_indices(width: int) -> np.ndarray:
  return np.stack(np.triu_indices(width), axis=1).astype(np.int32)


@functools.lru_cache(maxsize=8)
def count_rows_computation(max_items_per_user: int):
  """Client k's capped indicator rows, scaled to unit sensitivity (÷ √cap)."""

  @tff.tensorflow.computation(CLIENT_TYPE)
  def rows(data):
    items = data["count_items"]
    scale = tf.constant(1.0 / np.sqrt(max_items_per_user), tf.float64)
    return collections.OrderedDict(items=items, rows=tf.fill([tf.size(items), 1], scale))

  return rows


@functools.lru_cache(maxsize=8)
def statistics_rows_computation(
  num_items: int,
  dim: int,
  reg_user: float,
  reg_user_bias: float,
  clip_user: float,
  clip_label: float,
  bias_scale: float | None,
):
  """Client k's rows: its UserUpdate (with its bias), clipping, weights, its contribution to A
  (upper triangle) and b, in units of the sensitivities s_A, s_b."""
  width = dim + (bias_scale is not None)
  upper = _upper_indices(width)
  s_a, s_b = statistics.sensitivities(1.0, clip_user, clip_label, bias_scale)
  side_type = tff.TensorType(np.float64, [num_items, width])
  counts_type = tff.TensorType(np.float64, [num_items])

  @tff.tensorflow.computation(CLIENT_TYPE, side_type, counts_type)
  def rows(data, item_side, counts):
    items = data["items"]
    side = tf.gather(item_side, items)
    y = data["labels"]
    one = tf.constant(1.0, tf.float64)
    if bias_scale is None:
      design, target = side, y
      reg = tf.fill([dim], tf.constant(reg_user, tf.float64))
    else:
      design = tf.concat([side[:, :dim], tf.ones_like(side[:, :1])], axis=1)
      target = y - bias_scale * side[:, dim]
      reg = tf.concat(
        [
          tf.fill([dim], tf.constant(reg_user, tf.float64)),
          [tf.constant(reg_user_bias, tf.float64)],
        ],
        axis=0,
      )
    # UserUpdate (App. E.1): the ridge solution on the client's own ratings, in closed form.
    gram = tf.matmul(design, design, transpose_a=True) + tf.linalg.diag(reg)
    solved = tf.linalg.solve(gram, tf.matmul(design, target[:, None], transpose_a=True))[:, 0]
    u = solved[:dim]
    norm = tf.maximum(tf.norm(u), tf.constant(1e-300, tf.float64))
    u_bar = u * tf.minimum(one, clip_user / norm)  # Clip(u, Γ_u)
    residual = y
    if bias_scale is not None:
      u_bar = tf.concat([u_bar, [tf.constant(bias_scale, tf.float64)]], axis=0)
      residual = y - solved[dim]
    y_bar = tf.clip_by_value(residual, -clip_label, clip_label)
    # Weights (App. E.1): n̂^(-1/4), normalized so that the client's squared weights sum to 1.
    raw = tf.pow(tf.gather(counts, items), tf.constant(-0.25, tf.float64))
    w = raw / tf.sqrt(tf.reduce_sum(raw * raw))
    outer = tf.gather_nd(u_bar[:, None] * u_bar[None, :], upper)
    a_rows = w[:, None] * outer[None, :] / s_a
    b_rows = (w * y_bar)[:, None] * u_bar[None, :] / s_b
    return collections.OrderedDict(items=items, rows=tf.concat([a_rows, b_rows], axis=1))

  return rows


@functools.lru_cache(maxsize=8)
def release_computation(
  rows_fn, num_items: int, width: int, clip_norm: float, with_item_side: bool
):
  """(aggregator state@SERVER, clients' data@CLIENTS[, ṽ@SERVER, n̂@SERVER]) -> the aggregation
  process's output: the clients compute their rows; the process clips, sums and noises them.
  Returns the computation and its factory."""
  factory = ScatterNoiseFactory(num_items, width, clip_norm)
  process = factory.create(rows_type(width))
  state_type = tff.FederatedType(factory.state_type, tff.SERVER)
  data_type = tff.FederatedType(CLIENT_TYPE, tff.CLIENTS)
  if not with_item_side:

    @tff.federated_computation(state_type, data_type)
    def release_counts(state, data):
      return process.next(state, tff.federated_map(rows_fn, data))

    return release_counts, factory
  side_type = rows_fn.type_signature.parameter[1]
  counts_type = rows_fn.type_signature.parameter[2]

  @tff.federated_computation(
    state_type,
    data_type,
    tff.FederatedType(side_type, tff.SERVER),
    tff.FederatedType(counts_type, tff.SERVER),
  )
  def release_statistics(state, data, item_side, counts):
    rows = tff.federated_map(
      rows_fn, (data, tff.federated_broadcast(item_side), tff.federated_broadcast(counts))
    )
    return process.next(state, rows)

  return release_statistics, factory


def client_datasets(train: Ratings, labels: np.ndarray, max_items_per_user: int, seed: int):
  """Each user's (items, labels, items counted): what client k holds. A user's repeated ratings of
  an item are merged (`Ratings.merged`); users without ratings drop out."""
  train = Ratings(train.users, train.items, np.asarray(labels, np.float64)).merged()
  kept = np.zeros(len(train), dtype=bool)
  kept[statistics.count_contributions(train.users, train.items, max_items_per_user, seed)] = True
  order = np.argsort(train.users, kind="stable")
  bounds = np.flatnonzero(np.diff(train.users[order])) + 1
  out = []
  for rows in np.split(order, bounds):
    if rows.size:
      out.append(
        collections.OrderedDict(
          items=train.items[rows].astype(np.int32),
          labels=train.values[rows],
          count_items=train.items[rows[kept[rows]]].astype(np.int32),
        )
      )
  return out


def use_own_context() -> None:
  """Installs fedmf's owned local TFF context as the default (programs; closed at exit)."""
  tff_context.ensure_context()


def _release(computation, factory, unit_noise, scale, data, clients_per_call, *extra):
  """One release over every client, `clients_per_call` per TFF call: the last call's result."""
  chunks = [data[i : i + clients_per_call] for i in range(0, len(data), clients_per_call)] or [[]]
  state = factory.start(unit_noise, float(scale), len(chunks))
  for chunk in chunks:
    output = computation(state, chunk, *extra)
    state = output.state
  return np.asarray(output.result)


def releaser(clients_per_call: int = CLIENTS_PER_CALL) -> Releaser:
  """A `Releaser` whose counts and statistics come from TFF clients through the aggregation
  process; it runs in the current TFF context (`fedmf.tff.context.local_execution_context()`, or
  `use_own_context()` once in a program)."""
  state: dict = {}

  def clients(train, labels, max_items_per_user, seed):
    """The clients' data, built once per run (the labels are fixed during a run)."""
    key = (id(train), labels is None, max_items_per_user, seed)
    if state.get("key") != key:
      values = np.zeros(len(train)) if labels is None else labels
      state["key"], state["data"] = key, client_datasets(train, values, max_items_per_user, seed)
    return state["data"]

  def counts(train, num_items, max_items_per_user, noise_multiplier, seed, noise_rng):
    state["max_items_per_user"], state["seed"] = max_items_per_user, seed
    data = clients(train, None, max_items_per_user, seed)
    # The draw of statistics.noisy_item_counts (one N(0, 1) per item); std σ_c in units of √cap.
    unit = noise_rng.standard_normal(num_items)[:, None]
    rows_fn = count_rows_computation(max_items_per_user)
    computation, factory = release_computation(rows_fn, num_items, 1, 1.0, False)
    total = _release(computation, factory, unit, noise_multiplier, data, clients_per_call)
    return np.maximum(total[:, 0] * np.sqrt(max_items_per_user), 1.0)

  def stats(item_side, train, num_users, counts, hyper, noise_multiplier, noise, labels):
    del num_users  # each client knows only itself
    data = clients(train, labels, state.get("max_items_per_user", 1), state.get("seed", 0))
    beta = hyper.user_bias_scale
    m, width = item_side.shape
    dim = width - (beta is not None)
    clip = hyper.user_clip(dim)
    rows_fn = statistics_rows_computation(
      m, dim, hyper.reg_user, hyper.reg_user_bias, clip, hyper.clip_label, beta
    )
    upper = _upper_indices(width)
    unit = np.concatenate([noise.a[:, upper[:, 0], upper[:, 1]], noise.b], axis=1)
    computation, factory = release_computation(rows_fn, m, unit.shape[1], float(np.sqrt(2)), True)
    total = _release(
      computation,
      factory,
      unit,
      noise_multiplier,  # σ per unit of sensitivity: the rows are in units of s_A and s_b
      data,
      clients_per_call,
      np.asarray(item_side, np.float64),
      np.asarray(counts, np.float64),
    )
    s_a, s_b = statistics.sensitivities(1.0, clip, hyper.clip_label, beta)
    a = np.zeros((m, width, width))
    a[:, upper[:, 0], upper[:, 1]] = total[:, : len(upper)] * s_a
    a = a + np.transpose(np.triu(a, 1), (0, 2, 1))  # the release's upper triangle, symmetrized
    return statistics.Statistics(a, total[:, len(upper) :] * s_b)

  return Releaser(counts, stats)
