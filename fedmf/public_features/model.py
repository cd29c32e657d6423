"""The two-tower model with biases that alternating minimization trains (App. E.1, with biases).

r̂_kj = o + c_k + u_k · v_j + β e_j, where o is a public offset (`rating_offset`), (v_j, e_j) the
released item side ṽ_j (the encoder's output, or DP-ALS's per-item solution: its last coordinate
is the item bias, learned through the private statistics with the user side [Clip(u_k), β]), and
(u_k, c_k) each user's own embedding and bias, solved locally from ṽ (never released). Without
biases, ṽ_j = v_j and r̂_kj = o + u_k · v_j (the paper's model).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedmf.public_features import users as users_lib
from fedmf.public_features.data import Ratings


@dataclass(frozen=True)
class Model:
  item_side: np.ndarray  # ṽ (m, d + 1 with biases): what the server releases
  user_vectors: np.ndarray  # u (n, d)
  user_biases: np.ndarray  # c (n,), 0 without biases
  offset: float  # o
  bias_scale: float | None  # β; None: a model without biases

  @property
  def dim(self) -> int:
    return int(self.user_vectors.shape[1])

  @property
  def item_vectors(self) -> np.ndarray:
    return self.item_side[:, : self.dim]

  @property
  def item_biases(self) -> np.ndarray | None:
    """β e_j, or None without biases."""
    return None if self.bias_scale is None else self.bias_scale * self.item_side[:, self.dim]

  def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    pred = np.einsum("nd,nd->n", self.user_vectors[users], self.item_vectors[items])
    pred += self.offset + self.user_biases[users]
    if self.bias_scale is not None:
      pred += self.item_biases[items]
    return pred

  def scores(self, user_vectors: np.ndarray) -> np.ndarray:
    """(users, m) ranking scores u·v + β e (a user's own bias does not change their ranking)."""
    out = user_vectors @ self.item_vectors.T
    return out if self.bias_scale is None else out + self.item_biases


def fit(
  item_side: np.ndarray,
  ratings: Ratings,
  num_users: int,
  offset: float,
  bias_scale: float | None,
  reg_user: float,
  reg_user_bias: float,
) -> Model:
  """The model of released item side ṽ: every user's (u_k, c_k) from their ratings (UserUpdate)."""
  dim = item_side.shape[1] - (bias_scale is not None)
  item_biases = None if bias_scale is None else bias_scale * item_side[:, dim]
  u, c = users_lib.fit_users(
    item_side[:, :dim],
    item_biases,
    ratings.users,
    ratings.items,
    ratings.values - offset,
    num_users,
    reg_user,
    reg_user_bias,
  )
  return Model(item_side, u, c, offset, bias_scale)
