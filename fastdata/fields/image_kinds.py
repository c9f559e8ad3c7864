"""The spatial kinds: ``image`` (extra images, stored like the sample's image) and ``mask`` (8-bit
class ids, stored lossless: raw uint8 rows or PNG), moved with the image by torchvision's kernels
under ``--resize``/``--center-crop``, decoded when read, given back as ``tv_tensors``."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from PIL import Image

from fastdata.errors import ShapeMismatchError, fix_option
from fastdata.fields.array_kind import ShapedKind, check_member_array, npy_bytes
from fastdata.fields.kinds import FieldError, Hint, Stored, as_numpy, describe_type, is_array, is_tensor, tv_type
from fastdata.fields.schema import Field
from fastdata.images import FIELD_CHANNELS, encode, pixels, to_mode, to_pil

MASK_MODES = ("L", "P", "1")
_ORIGINAL_SUFFIXES = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff")


def raw_bytes(f: Field, array: np.ndarray, sample: str) -> bytes:
    """A raw-stored field's bytes, or a clear error where its size is not the planned one."""
    if array.shape != f.shape:
        raise ShapeMismatchError(
            f"{sample}: field {f.name!r} is {array.shape[0]}x{array.shape[1]} (HxW) but raw storage planned "
            f"{f.shape[0]}x{f.shape[1]}. Use {fix_option('resize', 'HxW')}, or {fix_option('resize', 'S')} with "
            f"{fix_option('center_crop', 'HxW')}, or {fix_option('store', 'encoded')}."
        )
    return array.tobytes()


class SpatialKind(ShapedKind):
    """Pixels of the sample's canvas: uint8, raw (a fixed shape) or encoded (variable bytes)."""

    spatial = True

    def check(self, f: Field, value: Any, where: str) -> Any:
        if isinstance(value, Image.Image):
            return value
        if not is_array(value):
            raise FieldError(f"{where} is a {describe_type(value)}, but the first samples have a {f.kind} there.")
        array = as_numpy(value)
        if array.dtype != np.uint8:
            raise FieldError(f"{where} is {f.kind} of dtype {array.dtype}; {f.kind}s are uint8. Convert it in "
                             "the dataset (e.g. value.to(torch.uint8)).")
        return self.checked_array(f, value, array, where)

    def checked_array(self, f: Field, value: Any, array: np.ndarray, where: str) -> Any:
        return to_pil(value)

    def digest(self, f: Field, value: Any) -> bytes:
        return f"{value.mode} {value.size}\n".encode() + value.tobytes()

    def store(self, f: Field, value: Any) -> bytes:
        return value if isinstance(value, bytes) else np.ascontiguousarray(value, dtype=np.uint8).tobytes()

    def extension(self, f: Field) -> str:
        if f.encoding == "raw":
            return "npy"
        if f.encoding == "original":  # a source's own file (a WebDataset member): its name says its type
            last = f.name.rsplit(".", 1)[-1].lower()
            return last if last in _ORIGINAL_SUFFIXES else "img"
        return self.encoded_extension(f)

    def encoded_extension(self, f: Field) -> str:
        return f.encoding if f.encoding in ("png",) else ("jpg" if f.encoding == "jpeg" else "img")

    def member(self, f: Field, stored: bytes) -> bytes:
        if f.encoding != "raw":
            return bytes(stored)
        return npy_bytes(np.frombuffer(stored, np.uint8).reshape(f.shape), f.dtype)

    def from_member(self, f: Field, data: bytes | memoryview) -> bytes | memoryview:
        if f.encoding != "raw":
            return data
        import io

        member = io.BytesIO(bytes(data))
        array = np.load(member, allow_pickle=False)
        check_member_array(f, array)  # never cast: a member that no longer fits is damage
        return np.ascontiguousarray(array, dtype=np.dtype(f.dtype).newbyteorder("<")).tobytes()

    def value_from_member(self, data: bytes) -> Any:
        import io

        image = Image.open(io.BytesIO(data))
        image.load()
        return image

    def moves_with_image(self, f: Field) -> bool:
        return True

    def stacks(self, f: Field) -> bool:
        return True


class ImageKind(SpatialKind):
    """PIL images and ``tv_tensors.Image``; extra images get the image's geometry and storage."""

    name, default_name, infer_rank = "image", "image", 20
    stored = Stored(("uint8",), ("raw", "png", "jpeg", "original"), tuple(FIELD_CHANNELS), "spatial", 3)
    tv_tensors = ("Image",)

    def infer(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        tv = tv_type(value)
        if tv == "Image" or isinstance(value, Image.Image) or hint.kind == self.name:
            plain = tv is None and is_tensor(value) and value.ndim == 2  # (H, W), given back so (PhotoTour)
            meta = {"tv_tensor": "Image"} if tv == "Image" else ({"as": "tensor"} if plain else {})
            return Field(name, "image", dtype="uint8", meta=meta)
        return None

    def planned(self, f: Field, plan: Any, probe: Any, keeps_file: bool) -> Field:
        mode = probe.mode if isinstance(probe, Image.Image) and probe.mode in FIELD_CHANNELS else plan.mode
        if keeps_file:
            return Field(f.name, f.kind, "uint8", None, "original", mode, f.meta)
        shape = None
        if plan.store == "raw":
            width, height = plan.geometry.output_size(*probe.size) if probe is not None else (0, 0)
            shape = (height, width, FIELD_CHANNELS[mode])
        lossy = plan.encoding == "jpeg" and mode != "RGBA"  # JPEG has no alpha: an RGBA field stays PNG
        encoding = "raw" if plan.store == "raw" else ("jpeg" if lossy else "png")
        return Field(f.name, "image", "uint8", shape, encoding, mode, f.meta)

    def converted(self, f: Field, value: Any, plan: Any, sample: str) -> bytes:
        image = plan.geometry.apply(to_mode(value, f.mode))
        if f.encoding == "raw":
            return raw_bytes(f, pixels(image), sample)
        return encode(image, f.encoding, plan.jpeg_quality)

    def decoded(self, f: Field, opened: Image.Image, image_format: str) -> Any:
        value = opened.convert(f.mode) if f.mode and opened.mode != f.mode else opened
        if image_format == "pil":
            return value
        array = np.array(value, dtype=np.uint8)
        return array[:, :, None] if array.ndim == 2 else array

    def read_value(self, f: Field, stored: Any, image_format: str, canvas: Any) -> Any:
        if isinstance(stored, Image.Image):
            return stored
        array = np.asarray(stored)
        if image_format == "numpy":
            return array
        if image_format == "pil":
            return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
        import torch
        from torchvision import tv_tensors  # torchvision only for datasets with fields

        if f.meta.get("as") == "tensor":  # the source's plain (H, W) tensor
            return torch.from_numpy(array[:, :, 0])
        return tv_tensors.Image(torch.from_numpy(array).permute(2, 0, 1))

    def batch_tensor(self, f: Field, tensor: Any) -> Any:
        return tensor[..., 0] if f.meta.get("as") == "tensor" else tensor.permute(0, 3, 1, 2)


class MaskKind(SpatialKind):
    """``tv_tensors.Mask``, PIL images hinted ``"mask"``, palette images after the sample's image:
    class ids, stored lossless (raw uint8 (H, W) or PNG in mode L, a palette kept in the schema)."""

    name, default_name, infer_rank = "mask", "mask", 10
    stored = Stored(("uint8",), ("raw", "png", "original"), (None, "L", "P", "1"), "spatial", 2)
    tv_tensors = ("Mask",)

    def infer(self, name: str, value: Any, hint: Hint, sample: str, image_field: str | None) -> Field | None:
        # a colour image hinted a mask holds no class ids: it is an image, as it is unhinted
        hinted = hint.kind == self.name and (value.mode in MASK_MODES if isinstance(value, Image.Image) else is_array(value))
        palette = hint.kind is None and image_field is not None and isinstance(value, Image.Image) and value.mode == "P"
        if not (tv_type(value) == "Mask" or hinted or palette):
            return None
        mode = value.mode if isinstance(value, Image.Image) else None
        meta = {"tv_tensor": "Mask"}
        if isinstance(value, Image.Image) and value.mode == "P" and value.getpalette():
            meta["palette"] = list(value.getpalette())
        return Field(name, "mask", dtype="uint8", mode=mode, meta=meta)

    def checked_array(self, f: Field, value: Any, array: np.ndarray, where: str) -> Any:
        if array.ndim == 3 and array.shape[0] == 1:
            array = array[0]
        if array.ndim != 2:
            raise FieldError(f"{where} is a mask of shape {array.shape}; a mask is (H, W) or (1, H, W).")
        return Image.fromarray(np.ascontiguousarray(array), "L")

    def encoded_extension(self, f: Field) -> str:
        return "png"

    def planned(self, f: Field, plan: Any, probe: Any, keeps_file: bool) -> Field:
        if keeps_file:
            return Field(f.name, f.kind, "uint8", None, "original", probe.mode, f.meta)
        height, width = plan.shape[:2] if plan.shape else (None, None)
        encoding = "raw" if plan.store == "raw" else "png"
        return Field(f.name, "mask", "uint8", (height, width) if plan.store == "raw" else None, encoding, f.mode, f.meta)

    def check_beside_image(self, f: Field, value: Any, size: tuple[int, int], image: str, sample: str) -> None:
        if value.size != size:
            width, height = size
            raise FieldError(f"{sample}: field {f.name!r} is a {value.width}x{value.height} mask but its image "
                             f"{image!r} is {width}x{height} (WxH); a mask has its image's size.")
        if value.mode not in MASK_MODES:
            raise FieldError(f"{sample}: field {f.name!r} is a mask in mode {value.mode!r}; masks are 8-bit class "
                             "ids (mode 'L' or 'P'). Convert it in the dataset.")

    def moved(self, f: Field, value: Any, move: Callable[[Any], Any], size: tuple[int, int]) -> Any:
        """Nearest neighbour on the class ids (never colour-converted); a palette kept."""
        import torch
        from torchvision import tv_tensors

        mode, palette = value.mode, value.getpalette() if value.mode == "P" else None
        array = np.array(value.convert("L") if mode == "1" else value, dtype=np.uint8)
        result = move(tv_tensors.Mask(torch.from_numpy(array)))
        image = Image.fromarray(result.numpy().astype(np.uint8, copy=False), "L")
        return _as_palette(image, palette) if mode == "P" else image

    def converted(self, f: Field, value: Any, plan: Any, sample: str) -> bytes:
        if f.encoding == "raw":
            array = np.array(value.convert("L") if value.mode == "1" else value, dtype=np.uint8)
            return raw_bytes(f, array, sample)
        # PNG of the class ids in mode L (a P mask's palette is in the schema): stock webdataset's
        # decode("l8") then reads the ids themselves, where it would colour-convert a palette image
        ids = value.convert("L") if value.mode == "1" else value
        if ids.mode == "P":
            ids = Image.frombytes("L", ids.size, ids.tobytes())
        return encode(ids, "png")

    def decoded(self, f: Field, opened: Image.Image, image_format: str) -> Any:
        return np.array(opened, dtype=np.uint8)

    def read_value(self, f: Field, stored: Any, image_format: str, canvas: Any) -> Any:
        if isinstance(stored, Image.Image):
            return stored
        array = np.asarray(stored)
        if image_format == "numpy":
            return array
        if image_format == "pil":
            image = Image.fromarray(np.ascontiguousarray(array), "L")
            if f.mode == "P":
                image = _as_palette(image, f.meta.get("palette"))
            return image
        import torch
        from torchvision import tv_tensors

        return tv_tensors.Mask(torch.from_numpy(np.ascontiguousarray(array)))


def _as_palette(image: Image.Image, palette: list[int] | None) -> Image.Image:
    """An ``L`` image of palette indices as a ``P`` image with ``palette`` (indices unchanged)."""
    result = Image.frombytes("P", image.size, image.tobytes())
    if palette:
        result.putpalette(palette)
    return result

