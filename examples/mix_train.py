"""Train on a weighted mix of two converted datasets, log the loss per source, and resume mid-epoch
with another batch size (or world size) from the loader's state.

    python examples/mix_train.py out/a.npy out/b-shards --weights 3,1 --stop-after 5 --state state.pt
    python examples/mix_train.py out/a.npy out/b-shards --weights 3,1 --state state.pt --batch-size 48

The first run stops after 5 batches and saves where it was; the second (here with another batch
size) reads the samples of that epoch the first had not read, each once, then goes on with the next
epochs. A tar dataset is read map-style (``TarIndexedDataset``): a mix needs random access.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import fastdata


def open_map_style(path: str):
    dataset = fastdata.open_dataset(path)
    if isinstance(dataset, torch.utils.data.IterableDataset):  # tar: its map-style reader
        dataset = fastdata.TarIndexedDataset(path)
    return dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+", help="datasets written by fastdata convert (images of one size)")
    parser.add_argument("--weights", default=None, help="comma-separated, one per dataset (default: all 1)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--backend", default="thread", help="fastdata.loader backend: torch, thread, process")
    parser.add_argument("--state", type=Path, default=Path("mix-state.pt"))
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this many batches, saving the state")
    args = parser.parse_args()

    weights = [float(w) for w in args.weights.split(",")] if args.weights else [1.0] * len(args.datasets)
    mix = fastdata.mix([open_map_style(p) for p in args.datasets], weights, seed=0, with_source=True)
    loader = fastdata.loader(mix, batch_size=args.batch_size, seed=0, num_workers=args.num_workers,
                             backend=args.backend)
    start_epoch = 0
    if args.state.exists():
        state = torch.load(args.state, weights_only=False)
        loader.load_state_dict(state)  # any batch size, world size, backend or num_workers
        start_epoch = state["epoch"]
        print(f"resumed at epoch {start_epoch}, after {state['consumed']} batches of {state['batch_size']}")

    images, _, _ = mix[[0]]
    model = nn.Sequential(nn.Flatten(), nn.Linear(images[0].numel(), 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = 0
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed position within this epoch
        totals, counts = torch.zeros(len(weights)), torch.zeros(len(weights))
        for images, labels, sources in loader:
            losses = nn.functional.cross_entropy(model(images.float() / 255), labels, reduction="none")
            optimizer.zero_grad()
            losses.mean().backward()
            optimizer.step()
            totals.index_add_(0, sources, losses.detach())  # the loss per source, for logging
            counts.index_add_(0, sources, torch.ones_like(losses))
            batches += 1
            if args.stop_after is not None and batches == args.stop_after:
                torch.save(loader.state_dict(), args.state)
                print(f"stopped after {batches} batches; state saved to {args.state}")
                return
        per_source = ", ".join(f"source {k}: {int(n)} samples, loss {t / max(n, 1):.3f}"
                               for k, (t, n) in enumerate(zip(totals.tolist(), counts.tolist())))
        print(f"epoch {epoch}: {per_source}")
    args.state.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
