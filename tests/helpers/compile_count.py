"""A torch.compile backend that counts compilations (rollout.static_decode's tests)."""

from __future__ import annotations


class CountingBackend:
    """Counts the graphs dynamo hands it and runs each as traced (``gm.forward``: eager, no code generation)."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward
