"""``fastdata preview``: a grid of samples with their boxes, masks, labels and captions drawn."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastdata.cli.common import add_command


def add_parser(commands) -> None:
    parser = add_command(
        commands, "preview", help="draw some samples of a converted dataset (boxes, masks, captions) into a PNG",
        description="Draw samples of PATH (any format) in a grid, with their boxes, masks, labels and captions "
        "drawn by torchvision.utils, and write it to --out: a quick look that a conversion (with --resize, say) "
        "kept every box on its object.",
        examples="""
  fastdata preview out/voc.npy --out grid.png                 # samples 0..15
  fastdata preview out/coco.h5 --index 100:108 --out coco.png --cell-size 256
  fastdata preview out/photos-tar --index 3,17,42 --out three.png --columns 3
""")
    parser.add_argument("path", metavar="PATH", help="a dataset written by 'fastdata convert'")
    parser.add_argument("--out", required=True, metavar="PNG", help="the picture to write (PNG)")
    parser.add_argument("--index", default="0:16", metavar="START:STOP",
                        help="which samples: START:STOP, one index, or a comma list")
    parser.add_argument("--cell-size", type=int, default=192, metavar="PIXELS",
                        help="each sample is scaled to fit a square of this many pixels")
    parser.add_argument("--columns", type=int, default=None, metavar="N", help="cells a row (default: up to 4)")
    parser.set_defaults(run=run_preview)


def run_preview(args: argparse.Namespace) -> int:
    # imported here, not at module level: torchvision and the readers load only when a preview is drawn,
    # so the CLI starts light
    from fastdata.preview import preview

    out = Path(args.out)
    if out.suffix.lower() != ".png":
        from fastdata.errors import InvalidOptionError

        raise InvalidOptionError(f"--out {args.out!r} is not a .png file. Give a name ending in .png, e.g. grid.png.")
    picture = preview(args.path, index=args.index, cell_size=args.cell_size, columns=args.columns)
    partial = out.with_name(out.name + ".partial")
    picture.save(partial, format="PNG")
    partial.replace(out)
    print(f"wrote {out} ({picture.width}x{picture.height})")
    return 0
