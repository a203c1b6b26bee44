"""What two KV pools must agree on before blocks move between them, and the one name for it.

A block is the keys and values one model computed for 16 (block_size) tokens, laid out one way. A decode
node can continue from a prefill node's blocks only when both run the same model (the served name and the
same weights: two checkpoints of one architecture have the same shapes and different KV) with the same
dtype and layout. The transfer checks it at the handshake and at each send (transfer/kv_connector.py); the
router pairs only nodes that agree, which is what keeps a model rollout from mixing old and new nodes
(docs/kubernetes.md, rollouts). Torch-free: the router imports it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

# In the order a mismatch is reported.
COMPATIBILITY_FIELDS = (
    "model", "weights", "dtype", "block_size", "layout", "num_layers", "num_kv_heads", "head_dim",
)


def kv_identity(pool: Mapping[str, object]) -> str:
    """The fields as one string: nodes whose pools have equal identities may exchange blocks."""
    return json.dumps([pool.get(name) for name in COMPATIBILITY_FIELDS])
