"""FFCV's and DALI's loaders for the loader comparison (benchmarks/fused_loaders.py, run from
benchmarks/bench_fused.py --loader): each built as its library's documentation builds it, the same
crop, flip and batch as fastdata's path, its first (untimed) epoch run on first use."""

from __future__ import annotations

from bench_fused import SIZE
from epoch_timing import timed_epoch


def ffcv_available() -> bool:
    try:
        import ffcv  # noqa: F401
    except ImportError:
        return False
    return True


def write_ffcv(source: str, out: str, max_side: int | None) -> None:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision.datasets import ImageFolder

    fields = {"image": RGBImageField(write_mode="jpg", max_resolution=max_side, jpeg_quality=90), "label": IntField()}
    DatasetWriter(out, fields, num_workers=2).from_indexed_dataset(ImageFolder(source))


def ffcv_loader(path: str, threads: int, batch_size: int):
    """A function giving the same ffcv Loader each epoch (built, and one epoch run, on first use)."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.decoders import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

    made = []

    def epoch():
        if not made:
            pipelines = {"image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip(), ToTensor(),
                                   ToTorchImage()],
                         "label": [IntDecoder(), ToTensor()]}
            made.append(Loader(path, batch_size=batch_size, num_workers=threads, order=OrderOption.RANDOM,
                               os_cache=True, drop_last=False, pipelines=pipelines))
            timed_epoch(made[0])  # numba compiles the pipeline in the first epoch: untimed
        return made[0]

    return epoch


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def dali_loader(source: str, threads: int, batch_size: int):
    """A function giving one epoch of a CPU-only DALI pipeline, built inside the timed epoch (its
    start-up counted, as a fresh loader's workers are); one untimed epoch on first use loads
    DALI's libraries. A pipeline kept across epochs cannot be timed per epoch: it runs ahead into
    the next epoch (its prefetch queue), so a later epoch's first batches, on a set of two
    batches all of it, would be computed while the script waits between configurations."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=source, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE, antialias=True)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return fn.transpose(images, perm=[2, 0, 1]), labels

    def batches():
        built = pipe()
        built.build()
        iterator = DALIGenericIterator(built, ["image", "label"], reader_name="reader", auto_reset=False,
                                       last_batch_policy=LastBatchPolicy.PARTIAL)
        for batch in iterator:
            yield batch[0]["image"], batch[0]["label"]

    warmed = []

    def epoch():
        if not warmed:
            timed_epoch(batches())
            warmed.append(True)
        return batches()

    return epoch
