"""``num_workers=0`` on the ``thread`` and ``process`` backends: every batch computed in the
calling thread, in order, with nothing between the sampler and the dataset."""

from __future__ import annotations

from typing import Any, Iterator

from fastdata.loading.base import BatchLoader


class SerialLoader(BatchLoader):
    backend = "serial"

    def epoch_iter(self) -> Iterator[Any]:
        for indices in self.epoch_batches():
            yield self.pinned(self.fetch(indices))
