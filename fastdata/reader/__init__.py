"""The output contract shared by every reader, its options, and the map-style reader base.

A dataset with fields beyond ``(image, label)`` (its manifest has a schema) gives each sample as
its source returned it, a tuple or a dict of tv_tensors and values (:mod:`fastdata.reader.records`,
docs/fields.md). Otherwise a reader returns ``(image, label)``: the image a uint8 CHW tensor by default (a view of HWC
storage, so its memory format is channels-last), an HWC ndarray with ``image_format="numpy"``
or a PIL image with ``"pil"``; the label an ``int``. Indexing with a list/array of indices
returns a collated batch from one vectorised read; ``__getitems__`` serves torch's standard
batched fetch. Files are opened lazily in each process, never inherited across fork.

:class:`ReaderOptions` is every option a reader takes besides its path, as one frozen,
validated dataclass: it turns pixels and labels into samples or a collated batch, for map-style
and iterable readers alike. A reader with options of its own subclasses it (its ``Options``).
What a format's reader implements is :class:`fastdata.formats.base.Reader` (the readers of
converted datasets subclass :class:`fastdata.formats.dataset.StoredDataset`);
:class:`fastdata.reader.decoding.Decoder` is the one decode path (encoded bytes -> pixels, or a
:class:`~fastdata.errors.CorruptDataError` naming the sample).

Its modules: :mod:`~fastdata.reader.options` (:class:`ReaderOptions`, the output contract),
:mod:`~fastdata.reader.output` (:class:`ReaderOutput`, what every reader keeps of it),
:mod:`~fastdata.reader.mapstyle` (:class:`MapDataset`, the map-style base),
:mod:`~fastdata.reader.decoding` (the read-time decode), :mod:`~fastdata.reader.fused` (the
fused training-time crop decode), :mod:`~fastdata.reader.region` (its region decode, TurboJPEG 3)
and :mod:`~fastdata.reader.records` (samples with fields).
The public names of the first three are importable from here.
"""

from fastdata.reader.mapstyle import MapDataset
from fastdata.reader.options import IMAGE_FORMATS, ReaderOptions, allocated, stack
from fastdata.reader.output import ReaderOutput

__all__ = ["IMAGE_FORMATS", "MapDataset", "ReaderOptions", "ReaderOutput", "allocated", "stack"]
