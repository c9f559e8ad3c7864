"""Small copies of torchvision datasets' real on-disk layouts, written from scratch (nothing is
downloaded), for the real torchvision classes to read.

Each ``make_*`` writes one dataset under ``root`` exactly as its download unpacks (folder names,
file names, annotation file formats) and returns what the class needs besides ``root``
(``--source-option`` values). Pixels encode the sample's index, so a lost or swapped sample shows;
masks hold a few class-id rectangles and boxes are placed on known pixels, so a test can check
that a box stays on its object after ``--resize``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

VOC_NAMES = ["2007_000032", "2007_000039", "2008_000008", "2009_000012", "2011_000003"]
VOC_OBJECTS = {  # name -> [(class, xmin, ymin, xmax, ymax)] (VOC's 1-based pixel coordinates)
    "2007_000032": [("aeroplane", 4, 3, 20, 12), ("person", 22, 10, 30, 22)],
    "2007_000039": [("tvmonitor", 2, 2, 14, 14)],
    "2008_000008": [("horse", 6, 4, 26, 20), ("person", 10, 1, 16, 10), ("dog", 1, 15, 8, 23)],
    "2009_000012": [("cat", 3, 5, 30, 22)],
    "2011_000003": [],  # no object
}
WIDTH, HEIGHT = 32, 24


def picture(index: int, height: int = HEIGHT, width: int = WIDTH) -> Image.Image:
    """An RGB image whose pixels encode ``index`` (smooth, so JPEG keeps them close)."""
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x * 7 + index * 40) % 256, (y * 9 + index * 25) % 256,
                       np.full_like(x, (index * 53) % 256)], axis=-1).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def voc_palette() -> list[int]:
    """VOC's colour map (the palette of its SegmentationClass PNGs)."""
    palette = []
    for index in range(256):
        r = g = b = 0
        value = index
        for bit in range(8):
            r |= ((value >> 0) & 1) << (7 - bit)
            g |= ((value >> 1) & 1) << (7 - bit)
            b |= ((value >> 2) & 1) << (7 - bit)
            value >>= 3
        palette += [r, g, b]
    return palette


VOC_CLASSES = ["__background__", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair",
               "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor"]


def class_mask(objects: list[tuple], height: int = HEIGHT, width: int = WIDTH, border: bool = True) -> np.ndarray:
    """Class ids painted in each object's box, with VOC's 255 'void' border around them."""
    mask = np.zeros((height, width), np.uint8)
    for name, xmin, ymin, xmax, ymax in objects:
        if border:
            mask[max(ymin - 2, 0):ymax + 1, max(xmin - 2, 0):xmax + 1] = 255
        mask[ymin - 1:ymax, xmin - 1:xmax] = VOC_CLASSES.index(name)
    return mask


def make_voc(root: Path, year: str = "2012") -> dict[str, Any]:
    """``VOCdevkit/VOC<year>``: JPEGImages, SegmentationClass (P-mode PNGs with VOC's palette),
    Annotations (XML), ImageSets/Segmentation and ImageSets/Main (train, val, trainval)."""
    base = root / "VOCdevkit" / f"VOC{year}"
    for folder in ("JPEGImages", "SegmentationClass", "Annotations", "ImageSets/Segmentation", "ImageSets/Main"):
        (base / folder).mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(VOC_NAMES):
        picture(index).save(base / "JPEGImages" / f"{name}.jpg", quality=95)
        mask = Image.fromarray(class_mask(VOC_OBJECTS[name]), "P")
        mask.putpalette(voc_palette())
        mask.save(base / "SegmentationClass" / f"{name}.png")
        (base / "Annotations" / f"{name}.xml").write_text(voc_xml(name, year))
    splits = {"train": VOC_NAMES[:3], "val": VOC_NAMES[3:], "trainval": VOC_NAMES}
    for split, names in splits.items():
        for kind in ("Segmentation", "Main"):
            (base / "ImageSets" / kind / f"{split}.txt").write_text("".join(n + "\n" for n in names))
    return {"year": year}


def voc_xml(name: str, year: str, objects: list[tuple] | None = None) -> str:
    """The annotation XML of image ``name``: its objects (``VOC_OBJECTS[name]`` unless given)."""
    objects = "".join(
        f"<object><name>{cls}</name><pose>Unspecified</pose><truncated>0</truncated><difficult>{i % 2}</difficult>"
        f"<bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>"
        for i, (cls, x0, y0, x1, y1) in enumerate(VOC_OBJECTS[name] if objects is None else objects))
    return (f"<annotation><folder>VOC{year}</folder><filename>{name}.jpg</filename>"
            f"<source><database>The VOC{year} Database</database></source>"
            f"<size><width>{WIDTH}</width><height>{HEIGHT}</height><depth>3</depth></size>"
            f"<segmented>1</segmented>{objects}</annotation>")


COCO_IMAGES = [(397133, "000000397133.jpg", 32, 24), (37777, "000000037777.jpg", 28, 20),
               (252219, "000000252219.jpg", 30, 26), (87038, "000000087038.jpg", 24, 24)]


def make_coco(root: Path) -> dict[str, Any]:
    """``images/val2017/*.jpg`` and ``annotations/instances_val2017.json`` in COCO's format:
    polygon segmentations, an uncompressed RLE crowd region, a compressed (string) RLE, and one
    image without annotations."""
    from pycocotools import mask as coco_mask

    images = root / "val2017"
    images.mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    for index, (_, file_name, width, height) in enumerate(COCO_IMAGES):
        picture(index, height, width).save(images / file_name, quality=95)
    crowd = np.zeros((20, 28), np.uint8, order="F")
    crowd[2:9, 3:12] = 1
    compressed = coco_mask.encode(np.asfortranarray(crowd))
    uncompressed_counts = _rle_counts(crowd)
    annotations = [
        {"id": 1, "image_id": 397133, "category_id": 18, "iscrowd": 0, "area": 96.0, "bbox": [4.0, 3.0, 12.0, 8.0],
         "segmentation": [[4.0, 3.0, 16.0, 3.0, 16.0, 11.0, 4.0, 11.0]]},
        {"id": 2, "image_id": 397133, "category_id": 1, "iscrowd": 0, "area": 40.5, "bbox": [20.5, 10.0, 6.0, 9.0],
         "segmentation": [[20.5, 10.0, 26.5, 10.0, 23.5, 19.0]]},
        {"id": 3, "image_id": 37777, "category_id": 1, "iscrowd": 1, "area": 63.0, "bbox": [3.0, 2.0, 9.0, 7.0],
         "segmentation": {"size": [20, 28], "counts": uncompressed_counts}},
        {"id": 4, "image_id": 37777, "category_id": 44, "iscrowd": 0, "area": 63.0, "bbox": [3.0, 2.0, 9.0, 7.0],
         "segmentation": {"size": [20, 28], "counts": compressed["counts"].decode()}},
        {"id": 5, "image_id": 252219, "category_id": 18, "iscrowd": 0, "area": 120.0, "bbox": [1.0, 2.0, 15.0, 10.0],
         "segmentation": [[1.0, 2.0, 16.0, 2.0, 16.0, 12.0, 1.0, 12.0], [20.0, 20.0, 25.0, 20.0, 25.0, 24.0]]},
    ]
    categories = [{"id": 1, "name": "person", "supercategory": "person"},
                  {"id": 18, "name": "dog", "supercategory": "animal"},
                  {"id": 44, "name": "bottle", "supercategory": "kitchen"}]
    document = {"info": {"description": "fastdata test"}, "licenses": [],
                "images": [{"id": i, "file_name": f, "width": w, "height": h} for i, f, w, h in COCO_IMAGES],
                "annotations": annotations, "categories": categories}
    ann_file = root / "annotations" / "instances_val2017.json"
    ann_file.write_text(json.dumps(document))
    return {"annFile": str(ann_file), "root": images}


def _rle_counts(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE: run lengths in column-major order, starting with zeros."""
    flat = mask.flatten(order="F")
    counts, current, run = [], 0, 0
    for value in flat:
        if value != current:
            counts.append(run)
            current, run = value, 0
        run += 1
    counts.append(run)
    return counts


PET_IDS = [("Abyssinian_1", 1, 1, 1), ("Abyssinian_10", 1, 1, 1), ("american_bulldog_100", 2, 2, 1),
           ("Bengal_11", 6, 1, 6), ("beagle_12", 11, 2, 3)]


def make_pets(root: Path) -> dict[str, Any]:
    """``oxford-iiit-pet/images/*.jpg``, ``annotations/trimaps/*.png`` (L: 1 pet, 2 background,
    3 border) and ``annotations/trainval.txt`` / ``test.txt`` (``id class species breed``)."""
    base = root / "oxford-iiit-pet"
    (base / "images").mkdir(parents=True, exist_ok=True)
    (base / "annotations" / "trimaps").mkdir(parents=True, exist_ok=True)
    for index, (image_id, *_) in enumerate(PET_IDS):
        picture(index).save(base / "images" / f"{image_id}.jpg", quality=95)
        trimap = np.full((HEIGHT, WIDTH), 2, np.uint8)
        trimap[4 + index:18, 6:26 - index] = 3
        trimap[6 + index:16, 8:24 - index] = 1
        Image.fromarray(trimap, "L").save(base / "annotations" / "trimaps" / f"{image_id}.png")
    lines = [" ".join(map(str, row)) + "\n" for row in PET_IDS]
    (base / "annotations" / "trainval.txt").write_text("".join(lines[:3]))
    (base / "annotations" / "test.txt").write_text("".join(lines[3:]))
    return {}


FLICKR8K = {"1000268201_693b08cb0e": ["A child in a pink dress is climbing up a set of stairs .",
                                      "A girl going into a wooden building .", "A little girl climbing into a playhouse .",
                                      "A little girl climbing the stairs to her playhouse .",
                                      "A little girl in a pink dress going into a wooden cabin ."],
            "1001773457_577c3a7d70": ["A black dog and a spotted dog are fighting", "Two dogs on pavement",
                                      "Deux chiens jouent à côté de la route", "犬が二匹遊んでいる",
                                      "Two dogs of different breeds looking at each other"],
            "1002674143_1b742ab4b8": ["A little girl covered in paint sits in front of a painted rainbow .",
                                      "A small girl in the grass plays with fingerpaints .",
                                      "There is a girl with pigtails sitting in front of a rainbow painting .",
                                      "Young girl with pigtails painting outside in the grass .",
                                      "A girl paints a rainbow ."]}


def make_flickr8k(root: Path) -> dict[str, Any]:
    """``Flicker8k_Dataset/*.jpg`` and the HTML caption page torchvision's Flickr8k parses
    (a table: each image's Flickr link, then its captions as list items)."""
    images = root / "Flicker8k_Dataset"
    images.mkdir(parents=True, exist_ok=True)
    rows = []
    for index, (name, captions) in enumerate(FLICKR8K.items()):
        picture(index).save(images / f"{name}.jpg", quality=95)
        photo_id = name.split("_")[0]
        items = "".join(f"<li>{caption}</li>" for caption in captions)
        rows.append(f'<tr><td><a href="http://www.flickr.com/photos/user/{photo_id}/">'
                    f"http://www.flickr.com/photos/user/{photo_id}/</a></td></tr><tr><td><ul>{items}</ul></td></tr>")
    rows.append("<tr><td>Image Not Found</td></tr><tr><td><ul><li>lost caption</li></ul></td></tr>")
    page = "<html><body><table>" + "".join(rows) + "</table></body></html>"
    ann_file = root / "Flickr8k.html"
    ann_file.write_text(page)
    return {"ann_file": str(ann_file), "root": images}


FLICKR30K = {"1000092795.jpg": ["Two young guys with shaggy hair look at their hands while hanging out in the yard .",
                                "Two young , White males are outside near many bushes .",
                                "Two men in green shirts are standing in a yard .",
                                "A man in a blue shirt standing in a garden .",
                                "Two friends enjoy time spent together ."],
             "10002456.jpg": ["Several men in hard hats are operating a giant pulley system .",
                              "Workers look down from up above on a piece of equipment .",
                              "Two men working on a machine wearing hard hats .",
                              "Four men on top of a tall structure .", "Three men on a large rig ."]}


def make_flickr30k(root: Path) -> dict[str, Any]:
    """``flickr30k-images/*.jpg`` and ``results_20130124.token`` (``image.jpg#N<TAB>caption``)."""
    images = root / "flickr30k-images"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for index, (name, captions) in enumerate(FLICKR30K.items()):
        picture(index).save(images / name, quality=95)
        lines += [f"{name}#{n}\t{caption}\n" for n, caption in enumerate(captions)]
    ann_file = root / "results_20130124.token"
    ann_file.write_text("".join(lines))
    return {"ann_file": str(ann_file), "root": images}


CELEBA_ATTRS = ["5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs", "Big_Lips",
                "Big_Nose", "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows", "Chubby",
                "Double_Chin", "Eyeglasses", "Goatee", "Gray_Hair", "Heavy_Makeup", "High_Cheekbones", "Male",
                "Mouth_Slightly_Open", "Mustache", "Narrow_Eyes", "No_Beard", "Oval_Face", "Pale_Skin",
                "Pointy_Nose", "Receding_Hairline", "Rosy_Cheeks", "Sideburns", "Smiling", "Straight_Hair",
                "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick", "Wearing_Necklace",
                "Wearing_Necktie", "Young"]
CELEBA_PARTITION = [0, 0, 0, 1, 1, 2, 2]  # (a split of one image fails in torchvision: iteration over a 0-d tensor)


def make_celeba(root: Path) -> dict[str, Any]:
    """``celeba/img_align_celeba/*.jpg`` and its five text files, in the real files' spacing
    (a count line, a header line, then rows). torchvision checks each text file's MD5 against
    the real download's; these files cannot match, so tests replace only that check."""
    base = root / "celeba"
    (base / "img_align_celeba").mkdir(parents=True, exist_ok=True)
    names = [f"{i + 1:06d}.jpg" for i in range(len(CELEBA_PARTITION))]
    rng = np.random.default_rng(5)
    attrs = rng.choice([-1, 1], size=(len(names), 40))
    attr_rows = [f"{n} " + " ".join(f"{v:2d}" for v in row) for n, row in zip(names, attrs)]
    (base / "list_attr_celeba.txt").write_text(f"{len(names)}\n" + " ".join(CELEBA_ATTRS) + "\n"
                                               + "\n".join(attr_rows) + "\n")
    (base / "identity_CelebA.txt").write_text("".join(f"{n} {2880 + i % 3}\n" for i, n in enumerate(names)))
    boxes = [(95 + i, 71, 226 - i, 313) for i in range(len(names))]
    (base / "list_bbox_celeba.txt").write_text(
        f"{len(names)}\nimage_id x_1 y_1 width height\n"
        + "".join(f"{n:<20}{x:>6}{y:>6}{w:>6}{h:>6}\n" for n, (x, y, w, h) in zip(names, boxes)))
    (base / "list_landmarks_align_celeba.txt").write_text(
        f"{len(names)}\nlefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x leftmouth_y "
        "rightmouth_x rightmouth_y\n"
        + "".join(f"{n:<20}" + "".join(f"{v:>6}" for v in (9 + i, 10, 20, 10, 15, 14, 10, 19, 21, 19 + i)) + "\n"
                  for i, n in enumerate(names)))
    (base / "list_eval_partition.txt").write_text("".join(f"{n} {p}\n" for n, p in zip(names, CELEBA_PARTITION)))
    for index, name in enumerate(names):
        picture(index, 28, 24).save(base / "img_align_celeba" / name, quality=95)
    return {}


SBD_NAMES = ["2008_000002", "2008_000003", "2008_000007", "2008_000009"]


def make_sbd(root: Path) -> dict[str, Any]:
    """The unpacked ``benchmark_RELEASE/dataset`` folder: ``img/*.jpg``, ``cls/*.mat`` (MATLAB
    struct ``GTcls`` with ``Segmentation`` and 20 sparse ``Boundaries``), ``train.txt``, ``val.txt``."""
    import scipy.io
    import scipy.sparse

    (root / "img").mkdir(parents=True, exist_ok=True)
    (root / "cls").mkdir(exist_ok=True)
    for index, name in enumerate(SBD_NAMES):
        picture(index).save(root / "img" / f"{name}.jpg", quality=95)
        segmentation = class_mask(VOC_OBJECTS[VOC_NAMES[index]], border=False)
        boundaries = np.empty((20, 1), dtype=object)
        for cls in range(20):
            region = segmentation == cls + 1
            edge = region & ~np.pad(region, 1)[2:, 1:-1]  # the bottom edge of each region
            boundaries[cls, 0] = scipy.sparse.csc_matrix(edge.astype(np.uint8))
        present = np.array([[c] for c in sorted(set(np.unique(segmentation)) - {0})], np.uint8)
        scipy.io.savemat(root / "cls" / f"{name}.mat", {"GTcls": {
            "Segmentation": segmentation, "Boundaries": boundaries, "CategoriesPresent": present}})
    (root / "train.txt").write_text("".join(n + "\n" for n in SBD_NAMES[:3]))
    (root / "val.txt").write_text(SBD_NAMES[3] + "\n")
    return {}


CITYSCAPES = {"train": [("aachen", "aachen_000000_000019"), ("aachen", "aachen_000001_000019"),
                        ("bochum", "bochum_000000_000313")],
              "val": [("frankfurt", "frankfurt_000000_000294")]}


def make_cityscapes(root: Path) -> dict[str, Any]:
    """``leftImg8bit/<split>/<city>/*_leftImg8bit.png`` and ``gtFine/<split>/<city>/`` with
    ``*_gtFine_labelIds.png`` (L), ``*_gtFine_instanceIds.png`` (16-bit: class id, or
    class id * 1000 + instance for things), ``*_gtFine_color.png`` (RGBA) and ``*_gtFine_polygons.json``."""
    index = 0
    for split, frames in CITYSCAPES.items():
        for city, frame in frames:
            images = root / "leftImg8bit" / split / city
            targets = root / "gtFine" / split / city
            images.mkdir(parents=True, exist_ok=True)
            targets.mkdir(parents=True, exist_ok=True)
            picture(index).save(images / f"{frame}_leftImg8bit.png")
            labels = np.full((HEIGHT, WIDTH), 7, np.uint8)  # road
            labels[:6] = 23  # sky
            labels[8:20, 4 + index:14 + index] = 26  # a car
            labels[10:22, 20:24] = 24  # a person
            instances = labels.astype(np.int32)
            instances[8:20, 4 + index:14 + index] = 26000
            instances[10:22, 20:22] = 24000
            instances[10:22, 22:24] = 24001
            Image.fromarray(labels, "L").save(targets / f"{frame}_gtFine_labelIds.png")
            Image.fromarray(instances.astype(np.uint16)).save(targets / f"{frame}_gtFine_instanceIds.png")
            color = np.zeros((HEIGHT, WIDTH, 4), np.uint8)
            color[..., 3] = 255
            color[labels == 26, 2] = 142
            Image.fromarray(color, "RGBA").save(targets / f"{frame}_gtFine_color.png")
            polygons = {"imgHeight": HEIGHT, "imgWidth": WIDTH, "objects": [
                {"label": "car", "polygon": [[4 + index, 8], [13 + index, 8], [13 + index, 19], [4 + index, 19]]}]}
            (targets / f"{frame}_gtFine_polygons.json").write_text(json.dumps(polygons))
            index += 1
    return {}


def make_coco_captions(root: Path) -> dict[str, Any]:
    """``val2017/*.jpg`` and ``annotations/captions_val2017.json`` (COCO's caption format)."""
    info = make_coco(root)
    captions = [{"id": 100 * position + n, "image_id": image_id, "caption": f"caption {n} of image {image_id}"}
                for position, (image_id, *_) in enumerate(COCO_IMAGES) for n in range(5)]
    document = {"info": {"description": "fastdata test"}, "licenses": [],
                "images": [{"id": i, "file_name": f, "width": w, "height": h} for i, f, w, h in COCO_IMAGES],
                "annotations": captions}
    ann_file = root / "annotations" / "captions_val2017.json"
    ann_file.write_text(json.dumps(document))
    return {"annFile": str(ann_file), "root": info["root"]}
