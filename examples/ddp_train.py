"""Train on a converted dataset with DistributedDataParallel: every rank reads its own share of
each epoch through ``fastdata.loader``, and a preempted job resumes mid-epoch from its checkpoint.

    torchrun --nproc_per_node 2 examples/ddp_train.py out/cifar.h5 --epochs 2 --checkpoint ckpt.pt

Run it again after an interruption (Ctrl-C, preemption, ``--stop-after``) and it continues with
the first batch no rank had finished. CPU-only machines use the ``gloo`` backend, GPUs ``nccl``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import fastdata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="a dataset written by fastdata convert")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--backend", default="process", help="fastdata.loader backend: torch, thread, process")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint.pt"))
    parser.add_argument("--save-every", type=int, default=10, help="batches between checkpoints")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this many batches (a test)")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")

    dataset = fastdata.open_dataset(args.dataset)
    if isinstance(dataset, torch.utils.data.IterableDataset):  # tar: its map-style reader
        dataset = fastdata.TarIndexedDataset(args.dataset)
    # rank and world_size come from the process group; seed=0 on every rank (or leave it out:
    # rank 0 draws one and shares it, and the checkpoint keeps it)
    loader = fastdata.loader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                             backend=args.backend, seed=0, drop_last=True)
    image_shape = dataset[0][0].shape
    classes = len(dataset.classes) or int(max(dataset.targets)) + 1  # torchvision sources may name none
    model = nn.Sequential(nn.Flatten(), nn.Linear(image_shape.numel(), classes)).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    start_epoch = 0
    if args.checkpoint.exists():
        state = torch.load(args.checkpoint, map_location=device, weights_only=False)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loaders"][rank])  # each rank continues its own share
        start_epoch = state["loaders"][rank]["epoch"]
        if rank == 0:
            say(f"resumed at epoch {start_epoch}, batch {state['loaders'][rank]['consumed']}")

    steps = 0
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed position in this epoch
        seen = 0
        for images, labels in loader:
            images = images.to(device, non_blocking=True).float().div_(255)
            loss = nn.functional.cross_entropy(model(images), labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(labels)
            steps += 1
            if steps % args.save_every == 0 or steps == args.stop_after:
                save(args.checkpoint, model, optimizer, loader, rank)
            if steps == args.stop_after:
                dist.destroy_process_group()
                return
        say(f"rank {rank} epoch {epoch}: {seen} samples")
    save(args.checkpoint, model, optimizer, loader, rank)
    dist.destroy_process_group()


def say(line: str) -> None:
    """One line in one write: the ranks share torchrun's stdout, and print's two writes interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, loader, rank: int) -> None:
    """One checkpoint for all ranks: the model and optimizer (the same everywhere under DDP) and
    every rank's loader position, gathered to rank 0, which writes it atomically."""
    loaders = [None] * dist.get_world_size()
    dist.all_gather_object(loaders, loader.state_dict())
    if rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "loaders": loaders}
        torch.save(state, path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
    dist.barrier()


if __name__ == "__main__":
    main()
