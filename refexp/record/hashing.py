"""Cache keys: short, stable hex digests of what determines a cached result (the SFT model, the
generated data, preference pairs, reference log-probs).

A key must be the same in every process and every Python session (``hash()`` is salted per
process) and change whenever its inputs do, so: SHA-256 of a canonical encoding, truncated to a
length that is still collision-free at the scale of one cache directory. Changing the encoding
changes every key and orphans existing caches.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable


def digest(chunks: Iterable[bytes], n: int) -> str:
    """The first ``n`` hex characters of the SHA-256 of the concatenated ``chunks``."""
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()[:n]


def stable_hash(obj: Any, n: int) -> str:
    """``n`` hex characters keyed on a JSON-able ``obj``: dict order does not matter (``sort_keys``),
    values JSON cannot encode are keyed by their ``str``."""
    return digest([json.dumps(obj, sort_keys=True, default=str).encode()], n)
