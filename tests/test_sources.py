"""Image-folder scanning follows torchvision's ImageFolder, minus hidden paths, plus loop safety."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from conftest import pattern, save
from fastdata.errors import EmptySourceError, FastdataError, SourceNotFoundError
from fastdata.sources import IMG_EXTENSIONS, scan_folder


def visible_image(root: Path):
    def is_valid_file(path: str) -> bool:
        parts = Path(path).relative_to(root).parts
        return path.lower().endswith(IMG_EXTENSIONS) and not any(p.startswith(".") for p in parts)

    return is_valid_file


def test_scan_matches_imagefolder(mixed_folder: Path) -> None:
    keys, labels, class_to_idx = scan_folder(mixed_folder)
    reference = ImageFolder(str(mixed_folder), is_valid_file=visible_image(mixed_folder))
    assert [(str(mixed_folder / k), y) for k, y in zip(keys, labels)] == reference.samples
    assert class_to_idx == reference.class_to_idx == {"cat": 0, "dog": 1}
    assert keys == [
        "cat/B.JPG", "cat/a.png", "cat/gray.png",
        "dog/palette.png", "dog/rgba.PNG", "dog/écureuil-ü.png", "dog/nested/deep.jpeg",
    ]


def test_hidden_files_and_folders_are_ignored(uniform_folder: Path) -> None:
    save(Image.fromarray(pattern(12, 10, 99)), uniform_folder / ".hiddenclass" / "x.png")
    save(Image.fromarray(pattern(12, 10, 98)), uniform_folder / "ant" / ".cache" / "y.png")
    keys, _, class_to_idx = scan_folder(uniform_folder)
    assert list(class_to_idx) == ["ant", "bee", "cow"]
    assert len(keys) == 12 and not any("/." in k for k in keys)


def test_symlinked_folder_visited_once_and_loops_end(uniform_folder: Path) -> None:
    os.symlink(uniform_folder / "ant", uniform_folder / "ant" / "loop")
    os.symlink(uniform_folder / "bee", uniform_folder / "cow" / "bees")
    keys, labels, _ = scan_folder(uniform_folder)
    ant = [k for k in keys if k.startswith("ant/")]
    assert ant == ["ant/0.png", "ant/1.png", "ant/2.png", "ant/3.png"]
    # the bee folder is reachable twice (as a class and through cow/bees): counted under both
    # classes once each, like ImageFolder, but never recursed into forever
    assert [k for k in keys if k.startswith("cow/bees/")] == [f"cow/bees/{i}.png" for i in range(4)]
    assert len(keys) == 16 and labels.count(2) == 8


def test_missing_and_empty_sources(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        scan_folder(tmp_path / "nope")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.png").write_bytes(b"")
    with pytest.raises(EmptySourceError, match="has no class folders.*ImageFolder layout"):
        scan_folder(tmp_path / "flat")
    (tmp_path / "noimg" / "cls").mkdir(parents=True)
    (tmp_path / "noimg" / "cls" / "readme.txt").write_text("x")
    with pytest.raises(EmptySourceError, match="no images with extensions"):
        scan_folder(tmp_path / "noimg")
    assert issubclass(SourceNotFoundError, FileNotFoundError) and issubclass(SourceNotFoundError, FastdataError)


def test_a_file_fastdata_does_not_read_is_refused_naming_every_kind_of_source(tmp_path: Path) -> None:
    from conftest import run_fastdata

    (tmp_path / "data.csv").write_text("path,label\n")
    result = run_fastdata("convert", tmp_path / "data.csv", tmp_path / "o.npy")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"fastdata: error: Source {str(tmp_path / 'data.csv')!r} is not a folder, nor a file fastdata reads. Give an "
        "image folder (one sub-folder per class), WebDataset shards (.tar files, or a folder of them), Parquet files "
        "(a .parquet file, a folder or glob of them, hf://datasets/ORG/NAME), a datasets save_to_disk folder, a "
        "dataset written by 'fastdata convert', a torchvision dataset such as 'torchvision:CIFAR10', or module:name "
        "(a map-style Dataset in your own module).\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv"]


def test_empty_class_folder_keeps_its_index_and_warns(uniform_folder: Path) -> None:
    (uniform_folder / "bat").mkdir()
    with pytest.warns(UserWarning, match="'bat' hold no images"):
        keys, labels, class_to_idx = scan_folder(uniform_folder)
    assert class_to_idx == {"ant": 0, "bat": 1, "bee": 2, "cow": 3}
    assert sorted(set(labels)) == [0, 2, 3]


def test_images_beside_class_folders_are_refused_naming_how_many_and_the_fix(tmp_path: Path, capsys) -> None:
    import fastdata
    from fastdata.cli import main
    from fastdata.errors import SourceLayoutError

    root = tmp_path / "photos"
    for index in range(24):
        save(Image.fromarray(pattern(12, 10, index)), root / f"{index:02d}.jpg")
    save(Image.fromarray(pattern(12, 10, 99)), root / "holiday" / "x.jpg")
    (root / "notes.txt").write_text("not an image: no matter")
    assert len(ImageFolder(str(root))) == 1  # what torchvision makes of it: 24 images left out, silently
    message = (f"{str(root)!r} holds 24 image(s) at its top level ('00.jpg', '01.jpg', '02.jpg', ...) beside its 1 "
               "class folder(s) ('holiday'); only images inside class folders are samples (ImageFolder layout: "
               "photos/cat/001.jpg), so these 24 would be left out. Move them into a class folder (e.g. "
               f"{str(root / 'unlabelled')!r}), or out of {str(root)!r} to use only the class folders.")
    for scan in (scan_folder, fastdata.FolderDataset):
        with pytest.raises(SourceLayoutError) as caught:
            scan(root)
        assert str(caught.value) == message and isinstance(caught.value, ValueError)
    out = tmp_path / "out.npy"
    assert main(["convert", str(root), str(out), "--quiet"]) == 1
    assert capsys.readouterr().err == f"fastdata: error: {message}\n"
    assert not out.exists()
    (root / "unlabelled").mkdir()
    for index in range(24):
        (root / f"{index:02d}.jpg").rename(root / "unlabelled" / f"{index:02d}.jpg")
    assert main(["convert", str(root), str(out), "--quiet"]) == 0
    assert len(fastdata.open_dataset(out)) == 25
