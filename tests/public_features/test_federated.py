"""Federated SSP (Algorithm 8) through TFF: the noise is added inside the aggregation process, the
statistics equal the centralized ones for the same seed, whatever the clients per call."""

import numpy as np
import pytest

from fedmf.public_features import algorithms
from fedmf.public_features import data

federated = pytest.importorskip("fedmf.public_features.federated")
tff = pytest.importorskip("tensorflow_federated")


@pytest.fixture(scope="module")
def context():
  from fedmf.tff.context import local_execution_context  # pylint: disable=g-import-not-at-top

  with local_execution_context():  # an owned context, uninstalled after (TFF's default untouched)
    yield


def _dataset():
  rng = np.random.default_rng(0)
  spec = data.SyntheticSpec(num_users=120, num_items=15, num_people=40, dim=3)
  ratings, features = data.synthetic_ratings(spec, rng)
  # A user's repeated rating: the federated clients merge it as the centralized release does.
  ratings = data.Ratings(
    np.append(ratings.users, ratings.users[0]),
    np.append(ratings.items, ratings.items[0]),
    np.append(ratings.values, 3.0),
  )
  return data.random_split("synthetic", ratings, features, spec.num_users, 0.1, 0.1, rng, 0.0)


@pytest.mark.parametrize("algorithm, clients_per_call", [("am-ssp", 7), ("dp-bias", 1000)])
def test_federated_and_centralized_release_the_same_statistics(
  context, algorithm, clients_per_call
):
  dataset = _dataset()
  hyper = algorithms.Hyperparameters(
    dim=0 if algorithm == "dp-bias" else 3, outer_steps=2, item_steps=20, max_items_per_user=4
  )
  central = algorithms.train(dataset, algorithm, 5.0, 1e-5, 7, hyper, keep_released=True)
  fed = algorithms.train(
    dataset,
    algorithm,
    5.0,
    1e-5,
    7,
    hyper,
    releaser=federated.releaser(clients_per_call),
    keep_released=True,
  )
  assert len(central.released) == len(fed.released) == 2
  for c, f in zip(central.released, fed.released):
    np.testing.assert_allclose(f.a, c.a, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(f.b, c.b, rtol=1e-9, atol=1e-9)
    assert np.abs(c.a).max() > 1.0  # the noise is there (not two empty releases)
  c_rmse, f_rmse = central.metrics[-1]["test_rmse"], fed.metrics[-1]["test_rmse"]
  assert f_rmse == pytest.approx(c_rmse, rel=1e-6)


def test_the_aggregation_process_adds_the_noise_and_the_server_gets_only_its_result(context):
  """The release computation hands the clients' rows to a tff.aggregators process, whose SERVER
  result is the noisy sum; no sum is computed outside it."""
  rows_fn = federated.count_rows_computation(2)
  release, factory = federated.release_computation(rows_fn, 5, 1, 1.0, False)
  process = factory.create(federated.rows_type(1))
  assert isinstance(factory, tff.aggregators.UnweightedAggregationFactory)
  assert isinstance(process, tff.templates.AggregationProcess)
  result = release.type_signature.result
  assert result.result.placement is tff.SERVER and result.state.placement is tff.SERVER
  # Structure: the release is the clients' map, then the process's `next` as built by the factory.
  body = release.to_building_block().compact_representation()
  aggregation = process.next.to_building_block().compact_representation()
  assert aggregation[aggregation.index("(") :] in body  # the process's body, verbatim
  outside = body.replace(aggregation[aggregation.index("(") :], "")
  for intrinsic in ("federated_sum", "federated_aggregate", "federated_mean", "federated_secure"):
    assert intrinsic not in outside
  # Behaviour: two calls of one release; the first result is withheld, the last is sum + noise.
  clients = [
    {
      "items": np.array([0, 1], np.int32),
      "labels": np.zeros(2),
      "count_items": np.array([0, 1], np.int32),
    },
    {
      "items": np.array([1], np.int32),
      "labels": np.zeros(1),
      "count_items": np.array([1], np.int32),
    },
  ]
  z = np.arange(5, dtype=np.float64)[:, None]
  state = factory.start(z, 3.0, 2)
  first = release(state, clients[:1])
  np.testing.assert_array_equal(np.asarray(first.result), 0.0)  # nothing released yet
  last = release(first.state, clients[1:])
  exact = np.array([1, 2, 0, 0, 0.0])[:, None] / np.sqrt(2)
  np.testing.assert_allclose(np.asarray(last.result), exact + 3.0 * z, atol=1e-12)
  assert int(last.measurements["clients"]) == 1
  # A client whose rows exceed the bound is clipped to it (the sensitivity holds regardless).
  rows = {"items": np.array([0], np.int32), "rows": np.array([[5.0]])}
  out = process.next(factory.start(np.zeros((5, 1)), 0.0, 1), [rows])
  assert float(np.asarray(out.result)[0, 0]) == pytest.approx(1.0)
  assert int(out.measurements["clipped_count"]) == 1
