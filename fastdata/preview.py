"""A picture of some samples: boxes, masks, labels and captions drawn on their images.

``fastdata preview DATASET --index 0:16 --out grid.png`` (:func:`preview`) reads samples
through the format's map-style reader (:func:`fastdata.open_dataset`; tar: ``TarIndexedDataset``) and draws them with torchvision.utils'
``draw_bounding_boxes``, ``draw_segmentation_masks`` and ``make_grid``, so a user can see that
a conversion (with ``--resize``, say) kept every box on its object and every mask on its pixels.
Each sample is scaled to fit a square cell together with its boxes and masks by
``torchvision.transforms.v2.Resize`` (masks with nearest neighbour), so the drawing shows the
stored geometry, not a copy of it; a label or caption is written in a strip under its cell.

What a value is drawn as is decided by its type: ``tv_tensors.BoundingBoxes`` boxes (named by
a ``labels`` field of the same length, with the dataset's class names), ``tv_tensors.Mask`` (or
a field named ``mask``/``masks``) masks, a ``str`` or list of ``str`` caption lines, an integer
its value; the first image-like value is the image. Anything else (JSON, arrays) is not drawn.
Only class fields (the label, ``label`` or ``cls``, and fields the manifest marks as class ids)
are written with their class names: ``label: dog (1)``, but ``image_id: 1``. Text is written in
DejaVu Sans (Latin, Greek, Cyrillic and more: ``café``), found where matplotlib installed it or
among the system's fonts, else in Pillow's default font.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import textwrap
from pathlib import Path
from typing import Any, Collection, Iterator, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from fastdata.errors import FastdataError, InvalidOptionError
from fastdata.fields import CLASS_IDS, Schema

# distinct colours (Sasha Trubetskoy's list), by class id or box index
PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (220, 190, 255),
           (170, 110, 40), (255, 250, 200), (128, 0, 0), (170, 255, 195), (128, 128, 0), (255, 215, 180),
           (0, 0, 128), (128, 128, 128)]
PADDING = 2  # pixels between cells (make_grid's padding)
LINE_HEIGHT = 13
BOX_WIDTH = 2
MASK_ALPHA = 0.5
VOID = 255  # VOC's "void" border id: not drawn
LABEL_FIELDS = ("label", "cls")  # the label's names (Schema.label): written with their class names
FONT_SIZE = 10
FONT_FILE = "DejaVuSans.ttf"


def parse_index(text: str | None, length: int) -> list[int]:
    """``"0:16"`` (a slice, default ``0:16``), ``"5"`` or ``"1,4,9"`` as indices into ``length`` samples."""
    text = "0:16" if text is None else text.strip()
    if re.fullmatch(r"-?\d*:-?\d*(:-?\d+)?", text):
        parts = [int(p) if p else None for p in text.split(":")]
        indices = list(range(length))[slice(*parts)]
    elif re.fullmatch(r"\d+(\s*,\s*\d+)*", text):
        indices = [int(p) for p in text.split(",")]
    else:
        raise InvalidOptionError(f"Invalid --index {text!r}. Use START:STOP (e.g. 0:16), one index, or a comma list.")
    outside = [i for i in indices if not 0 <= i < length]
    if outside:
        raise InvalidOptionError(f"--index {text!r}: sample {outside[0]} is out of range; the dataset has {length} "
                                 f"samples (0..{length - 1}).")
    if not indices:
        raise InvalidOptionError(f"--index {text!r} selects no sample of the {length}. Use e.g. 0:16.")
    return indices


def preview(path: str | Path, *, index: str | None = None, cell_size: int = 192,
            columns: int | None = None) -> Image.Image:
    """The grid of samples ``index`` of the converted dataset at ``path`` as a PIL image."""
    from fastdata.api import open_dataset
    from fastdata.formats import get_format, require_manifest

    manifest = require_manifest(Path(path))
    dataset = open_dataset(path)
    map_dataset = get_format(manifest["format"]).map_dataset
    if type(dataset) is not map_dataset and map_dataset is not None:  # random access (tar: TarIndexedDataset)
        dataset = map_dataset(path)
    indices = parse_index(index, len(dataset))
    names = _field_names(manifest)
    samples = [_named(dataset[i], names) for i in indices]
    return render(samples, class_names=_class_names(manifest), class_fields=_class_fields(manifest),
                  cell_size=cell_size, columns=columns)


def render(samples: Sequence[Any], *, class_names: dict[int, str] | None = None,
           class_fields: Collection[str] = LABEL_FIELDS, cell_size: int = 192,
           columns: int | None = None) -> Image.Image:
    """Draw ``samples`` (records as dicts, or tuples) in a grid of ``columns`` (default: up to 4
    a row); each cell is ``cell_size`` pixels square plus one strip for the text of all cells.
    The integers of ``class_fields`` are written with their ``class_names``; boxes are named by
    a ``labels`` field of one id per box."""
    from torchvision.utils import make_grid

    if not isinstance(cell_size, int) or cell_size < 16:
        raise InvalidOptionError(f"Invalid --cell-size {cell_size!r}. Use 16 or more pixels.")
    if columns is not None and (not isinstance(columns, int) or columns < 1):
        raise InvalidOptionError(f"Invalid --columns {columns!r}. Use a positive integer.")
    class_names = class_names or {}
    drawn = [_draw(_named(sample, None), class_names, frozenset(class_fields), cell_size) for sample in samples]
    strip = LINE_HEIGHT * max(len(lines) for _, lines in drawn) + (4 if any(lines for _, lines in drawn) else 0)
    cells = [_cell(image, lines, cell_size, strip) for image, lines in drawn]
    if len(cells) == 1:  # make_grid gives a single image back without its padding
        import torch

        grid = torch.nn.functional.pad(cells[0], (PADDING,) * 4, value=255)
    else:
        grid = make_grid(cells, nrow=grid_columns(len(cells), columns), padding=PADDING, pad_value=255)
    return Image.fromarray(grid.permute(1, 2, 0).numpy())


def cell_origin(position: int, *, columns: int, cell_size: int, strip: int = 0) -> tuple[int, int]:
    """(x, y) of the top-left pixel of cell ``position`` in the grid (for tests and tools)."""
    row, column = divmod(position, columns)
    return PADDING + column * (cell_size + PADDING), PADDING + row * (cell_size + strip + PADDING)


# --- one sample --------------------------------------------------------------------------------


def _named(sample: Any, names: list[Any] | None) -> dict[str, Any]:
    """A sample as one flat dict of named values: a dict as it is, a tuple by the names of its
    positions (the manifest's structure; else ``image``, ``label`` for a pair), a dict inside a
    tuple (``(image, {"boxes": ..., "labels": ...})``) by its keys."""
    if isinstance(sample, dict):
        return dict(sample)
    if not isinstance(sample, (tuple, list)):
        return {"image": sample}
    if names is None or len(names) != len(sample):
        names = ["image", "label"] if len(sample) == 2 else [f"field{i}" for i in range(len(sample))]
    flat: dict[str, Any] = {}
    for position, (name, value) in enumerate(zip(names, sample)):
        if isinstance(value, dict):
            flat.update(value)
        else:
            flat[name if isinstance(name, str) else f"field{position}"] = value
    return flat


def _draw(record: dict[str, Any], class_names: dict[int, str], class_fields: frozenset[str],
          cell_size: int) -> tuple[Any, list[str]]:
    """The sample's image scaled into the cell with its masks and boxes drawn, and its text lines."""
    import torch
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

    image_name = next((name for name, value in record.items() if _is_image(value)), None)
    if image_name is None:
        raise InvalidOptionError(f"Cannot preview a sample with no image (fields: {', '.join(record)}).")
    image = _as_image(record[image_name])
    boxes = {n: v for n, v in record.items() if isinstance(v, tv_tensors.BoundingBoxes)}
    masks = {n: _as_mask(v) for n, v in record.items() if n != image_name and _is_mask(n, v)}
    height, width = image.shape[-2:]
    scale = cell_size / max(height, width)
    size = [max(1, round(height * scale)), max(1, round(width * scale))]
    mode = v2.InterpolationMode.NEAREST if scale >= 1 else v2.InterpolationMode.BILINEAR
    resized = v2.Resize(size, interpolation=mode, antialias=True)(image, boxes, masks)
    image, boxes, masks = resized
    image = image.as_subclass(torch.Tensor)
    if image.shape[0] == 1:
        image = image.expand(3, -1, -1)
    image = image[:3].contiguous()
    for mask in masks.values():
        layers, colors = _mask_layers(mask.as_subclass(torch.Tensor))
        if layers.shape[0]:
            image = draw_segmentation_masks(image, layers, alpha=MASK_ALPHA, colors=colors)
    lines: list[str] = []
    for name, value in boxes.items():
        labels = _box_labels(record, name, len(value))
        xyxy = v2.functional.convert_bounding_box_format(value, new_format=tv_tensors.BoundingBoxFormat.XYXY)
        colors = [PALETTE[(label if label is not None else i) % len(PALETTE)] for i, label in enumerate(labels)]
        texts = [class_names.get(label, str(label)) if label is not None else None for label in labels]
        if len(xyxy):
            font = {"font": font_file(), "font_size": FONT_SIZE} if font_file() else {}
            image = draw_bounding_boxes(image, xyxy.as_subclass(torch.Tensor).reshape(-1, 4).float(),
                                        labels=texts if any(texts) else None, colors=colors, width=BOX_WIDTH, **font)
        lines.append(f"{name}: {len(xyxy)}")
    for name, value in record.items():
        lines += _text_lines(name, value, class_names if name in class_fields else {}, cell_size)
    return image, lines


def _is_image(value: Any) -> bool:
    from torchvision import tv_tensors

    if isinstance(value, (tv_tensors.Mask, tv_tensors.BoundingBoxes)):
        return False
    if isinstance(value, (Image.Image, tv_tensors.Image)):
        return True
    shape = tuple(getattr(value, "shape", ()))
    dtype = str(getattr(value, "dtype", ""))
    if not dtype.endswith("uint8") or len(shape) != 3:
        return False
    return shape[0] in (1, 3, 4) if hasattr(value, "permute") else shape[-1] in (1, 3, 4)


def _as_image(value: Any) -> Any:
    import torch
    from torchvision import tv_tensors
    from torchvision.transforms.v2.functional import pil_to_tensor

    if isinstance(value, Image.Image):
        return tv_tensors.Image(pil_to_tensor(value.convert("RGB") if value.mode not in ("L", "RGB") else value))
    if isinstance(value, np.ndarray):
        return tv_tensors.Image(torch.from_numpy(np.ascontiguousarray(value)).permute(2, 0, 1))
    return tv_tensors.Image(value)


def _is_mask(name: str, value: Any) -> bool:
    from torchvision import tv_tensors

    if isinstance(value, tv_tensors.Mask):
        return True
    return name in ("mask", "masks") and (isinstance(value, Image.Image) or hasattr(value, "shape"))


def _as_mask(value: Any) -> Any:
    import torch
    from torchvision import tv_tensors

    if isinstance(value, tv_tensors.Mask):
        return value
    if isinstance(value, Image.Image):
        return tv_tensors.Mask(torch.from_numpy(np.array(value.convert("I") if value.mode == "I;16" else value)))
    return tv_tensors.Mask(torch.as_tensor(np.asarray(value)))


def _mask_layers(mask: Any) -> tuple[Any, list[tuple[int, int, int]]]:
    """Boolean layers to draw and their colours: one per class id of a class-id mask ((H, W) or
    (1, H, W), 0 and 255 not drawn), or one per instance of a (K, H, W) stack of binary masks."""
    import torch

    if mask.ndim == 3 and (mask.shape[0] != 1 or mask.dtype == torch.bool):
        layers = mask.to(torch.bool)
        return layers, [PALETTE[i % len(PALETTE)] for i in range(layers.shape[0])]
    ids = [int(i) for i in torch.unique(mask) if int(i) not in (0, VOID)]
    plane = mask.reshape(mask.shape[-2:])
    layers = torch.stack([plane == i for i in ids]) if ids else torch.zeros((0, *plane.shape), dtype=torch.bool)
    return layers, [PALETTE[i % len(PALETTE)] for i in ids]


def _box_labels(record: dict[str, Any], boxes_name: str, count: int) -> list[int | None]:
    """The class id of each box: a ``labels`` field with one id per box, else none."""
    labels = record.get("labels")
    if labels is not None and hasattr(labels, "tolist"):
        values = labels.tolist()
        if isinstance(values, list) and len(values) == count and all(isinstance(v, int) for v in values):
            return values
    return [None] * count


def _text_lines(name: str, value: Any, class_names: dict[int, str], cell_size: int) -> list[str]:
    width = max(8, cell_size // 6)  # characters a line (the default font is about 6 pixels a character)
    if isinstance(value, str):
        return textwrap.wrap(f"{name}: {value}", width, max_lines=3, placeholder=" ...") or [f"{name}: "]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return [line for v in value for line in textwrap.wrap("- " + v, width, max_lines=2, placeholder=" ...")]
    label = value.item() if getattr(value, "ndim", None) == 0 else value
    if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
        label = int(label)
        shown = f"{class_names[label]} ({label})" if label in class_names else str(label)
        return [f"{name}: {shown}"]
    return []


def _cell(image: Any, lines: list[str], cell_size: int, strip: int) -> Any:
    """The drawn image at the top-left of a white ``cell_size`` square, its text in the strip below."""
    import torch

    canvas = Image.new("RGB", (cell_size, cell_size + strip), (255, 255, 255))
    canvas.paste(Image.fromarray(image.permute(1, 2, 0).numpy()), (0, 0))
    if lines:
        draw = ImageDraw.Draw(canvas)
        font = text_font()
        for number, line in enumerate(lines):
            draw.text((2, cell_size + 2 + number * LINE_HEIGHT), line, fill=(0, 0, 0), font=font)
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)


# --- what the manifest says --------------------------------------------------------------------


def _class_fields(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The fields whose integers are class ids: the label, and those the schema marks as
    ``class_ids`` (VOCDetection's ``labels``); never an ``image_id`` or a count."""
    try:
        schema = Schema.from_json(manifest["fields"]) if isinstance(manifest.get("fields"), dict) else None
    except (FastdataError, TypeError, ValueError):
        schema = None  # a damaged schema is reported by the reader
    marked = tuple(f.name for f in schema.fields if f.meta.get(CLASS_IDS) is True) if schema else ()
    return LABEL_FIELDS + marked


def _class_names(manifest: dict[str, Any]) -> dict[int, str]:
    mapping = manifest.get("class_to_idx")
    if isinstance(mapping, dict) and mapping:
        names: dict[int, str] = {}
        for name, index in mapping.items():  # a class's first name, where it has several
            names.setdefault(int(index), str(name))
        return names
    classes = manifest.get("classes")
    if isinstance(classes, list) and classes:
        return {i: str(name) for i, name in enumerate(classes)}
    categories = (manifest.get("source") or {}).get("categories")  # COCO's ids with gaps
    if isinstance(categories, dict):
        return {int(k): str(v) for k, v in categories.items() if str(k).lstrip("-").isdigit()}
    return {}


def _field_names(manifest: dict[str, Any]) -> list[Any] | None:
    """The names of a tuple sample's positions: the manifest's field structure (``["image",
    "label", "mask"]``; a dict entry where a position holds a dict), where it has one."""
    schema = manifest.get("fields")
    structure = schema.get("structure") if isinstance(schema, dict) else None
    return list(structure) if isinstance(structure, list) else None


def grid_columns(count: int, columns: int | None) -> int:
    """Columns of a grid of ``count`` cells (``columns``, else up to 4)."""
    return columns or min(count, 4) or 1




# --- the font ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def font_file() -> str | None:
    """The font file of the text strip and the box labels: DejaVu Sans (Latin with its accents,
    Greek, Cyrillic and more; Pillow's own default font draws ``é`` as a box), the copy
    matplotlib ships when it is installed, else the system's; None (Pillow's default font) when
    neither opens."""
    for candidate in _font_files():
        try:
            ImageFont.truetype(candidate, FONT_SIZE)
        except (OSError, ImportError):  # not there, or Pillow built without FreeType
            continue
        return candidate
    return None


def text_font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """:func:`font_file` at ``FONT_SIZE``, or Pillow's default font."""
    found = font_file()
    return ImageFont.load_default() if found is None else ImageFont.truetype(found, FONT_SIZE)


def _font_files() -> Iterator[str]:
    """Where DejaVu Sans may be: matplotlib's copy (found without importing matplotlib), then the
    name alone, which Pillow looks up in the system's font folders."""
    spec = importlib.util.find_spec("matplotlib")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        yield str(Path(folder) / "mpl-data" / "fonts" / "ttf" / FONT_FILE)
    yield FONT_FILE
