"""``fastdata.loader``: a DataLoader whose every batch is one vectorised read.

The DataLoader runs with ``batch_size=None`` and a :class:`BatchIndexSampler`, so the dataset
receives a whole array of indices at once (``ds[indices]``) and returns a collated batch; no
per-sample fetch, no per-sample collate, no Python int per sample from the sampler.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from fastdata.errors import InvalidOptionError
from fastdata.samplers import BatchIndexSampler


def loader(
    dataset: Any,
    batch_size: int = 256,
    shuffle: bool = True,
    num_workers: int = 0,
    drop_last: bool = False,
    seed: int | None = None,
    **dataloader_kwargs: Any,
) -> DataLoader:
    """A ``DataLoader`` that reads each batch with one ``dataset[indices]`` call.

    ``dataset`` must accept an index array and return a collated batch (every fastdata
    map-style reader does). Extra keyword arguments go to ``DataLoader`` (``pin_memory``,
    ``persistent_workers``, ``prefetch_factor``, ``multiprocessing_context``, ...).
    Reshuffle per epoch happens automatically; ``loader.sampler.set_epoch(e)`` pins it.
    """
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset):
        suggestion = _map_reader_of(dataset)
        raise InvalidOptionError(
            f"fastdata.loader needs a map-style dataset (random access by index), but got the iterable "
            f"{type(dataset).__name__}.{suggestion} Or iterate it with a plain DataLoader."
        )
    for name in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
        if name in dataloader_kwargs:
            raise InvalidOptionError(f"loader() sets {name!r} itself; pass batch_size/shuffle/drop_last directly.")
    sampler = BatchIndexSampler(len(dataset), batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    return DataLoader(dataset, batch_size=None, sampler=sampler, num_workers=num_workers, **dataloader_kwargs)


def _map_reader_of(dataset: Any) -> str:
    """" Use X(path) instead." when ``dataset`` is a fastdata reader with a map-style counterpart."""
    from fastdata.formats import all_formats

    for spec in all_formats():
        if type(dataset) is spec.dataset and spec.map_dataset is not None:
            path = getattr(dataset, "path", "PATH")
            return f" Use fastdata.{spec.map_dataset.__name__}({str(path)!r}) for the same data, map-style."
    return ""
