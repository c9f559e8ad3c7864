"""The timed pass of the loader comparison (benchmarks/fused_loaders.py and peer_loaders.py): one
epoch's seconds and CPU seconds (the exits of the worker processes it started included), the busy
training step run after each batch, and the wait for a library's threads to go idle between epochs."""

from __future__ import annotations

import multiprocessing
import time

import torch

STEP: list = []  # the busy training step run after each batch (set by --step-ms)


def cpu_s() -> float:
    """CPU seconds of this process and of its finished (reaped) children: worker processes
    that end with their epoch (no persistent workers) are counted too."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed_epoch(batches) -> tuple[float, int, float]:
    """(seconds, samples, CPU seconds of this process and its reaped workers) of one pass over
    ``batches``, the training step (if any) run after each batch. The seconds end with the loop;
    the CPU seconds include the exit of worker processes the epoch started and did not wait for
    (fastdata's process backend asks its workers to stop and goes on): they are waited for, and
    reaped, after the clock stops."""
    before = {process.pid for process in multiprocessing.active_children()}
    start, cpu_start, count = time.perf_counter(), cpu_s(), 0
    for images, _ in batches:
        count += len(images)
        for step in STEP:
            step()
    seconds = time.perf_counter() - start
    reap_new_children(before)
    return seconds, count, cpu_s() - cpu_start


def reap_new_children(before: set[int], limit_s: float = 10.0) -> None:
    """Wait (at most ``limit_s``) until the worker processes started since ``before`` was taken
    have exited; ``active_children()`` reaps those that have, so their CPU time is counted."""
    deadline = time.monotonic() + limit_s
    while any(process.pid not in before for process in multiprocessing.active_children()):
        if time.monotonic() > deadline:
            return
        time.sleep(0.002)


def training_step(step_ms: float, count: int = 0):
    """A CPU-bound stand-in for a training step: a fixed number of 384x384 float32 matmuls on
    torch's default threads, that number calibrated once (before any loader runs) to take
    ``step_ms`` in this process, or ``count`` when given (``--isolate`` calibrates in the parent
    and gives every epoch's process the same count). It releases the GIL, like a real step's
    torch ops. Returns the step and its count."""
    weights = torch.randn(384, 384)
    activations = torch.randn(384, 384)

    def run(count: int) -> None:
        for _ in range(count):
            torch.mm(activations, weights)

    run(20)
    if not count:
        start = time.perf_counter()
        run(200)
        count = max(1, round(200 * step_ms / 1000 / (time.perf_counter() - start)))
    return (lambda: run(count)), count


def quiesce(limit_s: float = 10.0) -> None:
    """Wait (at most ``limit_s``) until no thread of this process uses CPU: a library's threads
    still working ahead after its epoch (DALI's prefetch) would otherwise be timed in the next
    configuration's epoch. The main thread sleeps here, so any CPU time is another thread's."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = time.process_time()
        time.sleep(0.2)
        if time.process_time() - before < 0.01:
            return
