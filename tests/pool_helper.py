"""A watch on a ModelPool's loaded models, for tests of jobs that must hold few models at once."""
from __future__ import annotations

import contextlib


class LoadWatch:
    """Wraps `pool.load` while active: `peak` is the largest number of models the pool held loaded at once
    (counted after every load), `names` the names loaded, in order."""

    def __init__(self, pool):
        self.pool = pool
        self.peak = len(pool.loaded())
        self.names: list[str] = []

    @contextlib.contextmanager
    def watching(self):
        """Count the pool's loaded models after every `load` inside the block."""
        original = self.pool.load

        def load(name, *args, **kwargs):
            model = original(name, *args, **kwargs)
            self.names.append(name)
            self.peak = max(self.peak, len(self.pool.loaded()))
            return model

        self.pool.load = load
        try:
            yield self
        finally:
            del self.pool.load
