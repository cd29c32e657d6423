"""The public item encoder of the paper's experiments (App. E.1, "Model Architecture"), in numpy.

v(x_j) = concat_c(X_c[j] E_c) W + b: one embedding table E_c per feature category (rows of X_c are
averaged bags of words, so multivalent features average their embeddings), concatenated into R^{Cd}
and a dense layer to R^d (R^{d+1} with biases: the last output is the item bias, and its entry of
b the global offset learned through the private statistics). Because X_c is sparse, the backward pass touches only the active features
(the gradient sparsity of the paper's §3.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from fedmf.public_features.data import ItemFeatures


@dataclass(frozen=True)
class EncoderParams:
  embeddings: tuple[np.ndarray, ...]  # per category, (vocabulary, d)
  dense: np.ndarray  # (C d, d)
  bias: np.ndarray  # (d,)

  def flat(self) -> np.ndarray:
    return np.concatenate([e.ravel() for e in self.embeddings] + [self.dense.ravel(), self.bias])

  def like(self, flat: np.ndarray) -> EncoderParams:
    """Parameters of the same shapes read from a flat vector (the inverse of `flat`)."""
    out, at = [], 0
    for e in (*self.embeddings, self.dense, self.bias):
      out.append(flat[at : at + e.size].reshape(e.shape))
      at += e.size
    return EncoderParams(tuple(out[:-2]), out[-2], out[-1])

  @property
  def size(self) -> int:
    return int(sum(e.size for e in self.embeddings) + self.dense.size + self.bias.size)


def init_encoder(
  features: ItemFeatures, dim: int, rng, scale: float = 0.3, out_dim: int | None = None
) -> EncoderParams:
  """Random data-independent initialization (public: it costs no privacy): embeddings of width
  `dim`, outputs of width `out_dim` (default `dim`); outputs beyond `dim` (the item bias) start
  at 0."""
  out_dim = dim if out_dim is None else out_dim
  embeddings = tuple(rng.normal(0.0, scale, (b.shape[1], dim)) for b in features.bags)
  width = dim * len(features.bags)
  dense = rng.normal(0.0, 1.0 / np.sqrt(width), (width, dim))
  dense = np.hstack([dense, np.zeros((width, out_dim - dim))])
  return EncoderParams(embeddings, dense, np.zeros(out_dim))


def hidden(features: ItemFeatures, params: EncoderParams) -> np.ndarray:
  """The concatenated averaged embeddings, (m, C d)."""
  return np.concatenate([b @ e for b, e in zip(features.bags, params.embeddings)], axis=1)


def forward(features: ItemFeatures, params: EncoderParams) -> np.ndarray:
  """Item embeddings v_j, (m, d), float64."""
  return hidden(features, params) @ params.dense + params.bias


def backward(
  features: ItemFeatures, params: EncoderParams, grad_items: np.ndarray
) -> EncoderParams:
  """Σ_j (∂v_j/∂θ)ᵀ grad_items[j]: the chain rule of Prop. 1, eq. (4), through the encoder."""
  h = hidden(features, params)
  grad_hidden = grad_items @ params.dense.T
  d = params.embeddings[0].shape[1]
  grads = tuple(b.T @ grad_hidden[:, c * d : (c + 1) * d] for c, b in enumerate(features.bags))
  return EncoderParams(grads, h.T @ grad_items, grad_items.sum(axis=0))


def per_user_gradients(
  features: ItemFeatures,
  params: EncoderParams,
  owner: np.ndarray,
  num_rows: int,
  items: np.ndarray,
  grad_items: np.ndarray,
) -> sparse.csr_matrix:
  """Flat per-user gradients (num_rows, |θ|), sparse: row r is Σ_{i: owner[i]=r}
  (∂v_{items[i]}/∂θ)ᵀ grad_items[i] (for DP-SGD's per-user clipping). Only the embedding rows of
  features active for the user's items are nonzero, so wide vocabularies stay cheap."""
  n, d = len(items), params.embeddings[0].shape[1]
  out_dim = params.dense.shape[1]
  grad_hidden = grad_items @ params.dense.T
  rows, cols, vals = [], [], []
  offset = 0
  for c, b in enumerate(features.bags):
    x = b[items].tocoo()  # (n, vocabulary), the active features of each example's item
    rows.append(np.repeat(owner[x.row], d))
    cols.append((offset + x.col[:, None] * d + np.arange(d)).ravel())
    vals.append((x.data[:, None] * grad_hidden[x.row, c * d : (c + 1) * d]).ravel())
    offset += b.shape[1] * d
  h = hidden(features, params)[items]
  width = h.shape[1]
  rows.append(np.repeat(owner, width * out_dim))
  cols.append(np.tile(offset + np.arange(width * out_dim), n))
  vals.append(np.einsum("nh,nd->nhd", h, grad_items).ravel())
  offset += width * out_dim
  rows.append(np.repeat(owner, out_dim))
  cols.append(np.tile(offset + np.arange(out_dim), n))
  vals.append(grad_items.ravel())
  offset += out_dim
  out = sparse.coo_matrix(
    (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(num_rows, offset)
  )
  return out.tocsr()  # duplicates (several examples of one user) are summed
