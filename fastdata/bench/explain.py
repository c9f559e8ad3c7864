"""Why a num_workers setting wins, in plain words: one place for ``fastdata bench``'s verdicts
and ``fastdata tune``'s explanation.

Everything here turns measured numbers into sentences; nothing measures.
"""

from __future__ import annotations

from typing import Any

from fastdata.loading.backends import BACKENDS, DEFAULT_BACKEND

# Measured rates within 5% are a tie and the simpler setting wins (fewer workers, the torch
# DataLoader): ``fastdata tune``'s choice and ``fastdata bench``'s noise floor.
TIE = 0.05


def outrun_by_none_simpler(items: list[Any], rate: Any, simplicity: Any) -> list[Any]:
    """``items`` simplest first (by ``simplicity(item)``), leaving out every item that a simpler
    one outran (a higher ``rate(item)``): the only ones a tie may go to, so neither ``bench`` nor
    ``tune`` recommends a setting slower than a simpler one it measured. The fastest is always kept.

    >>> outrun_by_none_simpler([("nw=0", 90), ("nw=1", 85), ("nw=2", 100)], lambda i: i[1], lambda i: i[0])
    [('nw=0', 90), ('nw=2', 100)]
    """
    kept, best = [], float("-inf")
    for item in sorted(items, key=simplicity):
        value = rate(item)
        if value >= best:
            kept.append(item)
            best = value
    return kept



PATH_WORDS = {
    "fast": "fastdata.loader(ds, batch_size): one ds[indices] read per batch",
    "standard": "DataLoader(ds, batch_size, shuffle=True): one ds[i] per sample, then collate",
    "stream": "DataLoader over the iterable (tar) dataset: shards read in order",
}
BASELINE_NAMES = {"folder": "the image folder", "torchvision": "the torchvision dataset"}


def row_label(entry: dict[str, Any]) -> str:
    """``npy raw fast``, ``folder standard``, ``npy raw fast [thread]`` for a summary entry."""
    parts = [entry[name] for name in ("format", "store", "read_path") if entry.get(name) and entry[name] != "-"]
    backend = entry.get("backend") or DEFAULT_BACKEND
    return " ".join(parts) + (f" [{backend}]" if backend != DEFAULT_BACKEND else "")


def _how(entry: dict[str, Any]) -> str:
    """What to train with, in the words of the API: ``npy raw through fastdata.loader (the fast path)``."""
    name = BASELINE_NAMES.get(entry["format"], " ".join(p for p in (entry["format"], entry["store"]) if p != "-"))
    backend = entry.get("backend") or DEFAULT_BACKEND
    if entry["read_path"] == "fast":
        api = "fastdata.loader" + (f"(..., backend={backend!r})" if backend != DEFAULT_BACKEND else "")
        return f"{name} through {api} (the fast path)"
    if entry["read_path"] == "stream":
        return f"{name} streamed through a DataLoader"
    return f"{name} through a plain DataLoader (the standard path)"


def bench_recommendation(picked: dict[str, Any], *, fastest: dict[str, Any], ties: list[dict[str, Any]],
                         baseline: dict[str, Any] | None, speedup: float | None) -> str:
    """``fastdata bench``'s answer: what to train with, what it is within the noise of, and the
    best num_workers for the source as it is. Entries are ``summary["recommendation"]``-shaped."""
    base = BASELINE_NAMES.get(baseline["format"], baseline["format"]) if baseline else None
    text = f"use {_how(picked)} with num_workers={picked['num_workers']}: {picked['samples_per_s']:,.0f} samples/s"
    if speedup and baseline and baseline["format"] != picked["format"]:
        text += f", {times(speedup)} {base} at its best"
    if (fastest["format"], fastest["store"], fastest["read_path"], fastest["backend"], fastest["num_workers"]) != \
            (picked["format"], picked["store"], picked["read_path"], picked["backend"], picked["num_workers"]):
        if fastest["num_workers"] != picked["num_workers"]:
            why = ", and fewer workers wins"
        elif fastest["backend"] != picked["backend"]:
            why = f", and the {BACKENDS[picked['backend']].title} backend wins"
        else:
            why = ", and no conversion wins" if baseline and picked["format"] == baseline["format"] else ""
        text += (f" ({row_label(fastest)} at num_workers={fastest['num_workers']} measured "
                 f"{fastest['samples_per_s']:,.0f}, within the noise: a tie{why})")
    others = [t for t in ties if t != fastest]
    if others:
        named = ", ".join(f"{row_label(t)} nw={t['num_workers']}" for t in others[:3])
        text += f"; also within the noise: {named}" + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    if baseline and baseline["format"] != picked["format"]:
        text += (f"; if you keep {base}, use num_workers={baseline['num_workers']} "
                 f"({baseline['samples_per_s']:,.0f} samples/s)")
    return text + "."


def backends_sentence(row: str, workers: int, ratios: dict[str, float]) -> str:
    """What fastdata's backends change on one row, in one line: ``ratios`` are each backend's
    samples/s at ``workers`` workers over num_workers=0's (``torch`` is the DataLoader's)."""
    def verb(ratio: float, plural: bool = False) -> str:
        return ("keep" if ratio < 1 else "reach") + ("" if plural else "s" if ratio < 1 else "es")

    dataloader = next((b for b in ratios if b in BACKENDS and BACKENDS[b].dataloader_options), None)
    ours = sorted((b for b in ratios if b != dataloader), key=lambda b: -ratios[b])
    first = ours[0]
    text = (f"on {row} at {workers} worker{'s' if workers != 1 else ''}, fastdata's {first} backend "
            f"{verb(ratios[first])} {ratios[first]:.2f}x the rate of num_workers=0")
    text += "".join(f" and its {backend} backend {ratios[backend]:.2f}x" for backend in ours[1:])
    if dataloader is not None:
        text += f", where the DataLoader's workers {verb(ratios[dataloader], plural=True)} {ratios[dataloader]:.2f}x"
    return text + "."


def remote_sentence(row: str, cache: str, remote: tuple[int, float], local: tuple[int, float], largest: int) -> str:
    """How reading from a URL shifts the best num_workers of ``row`` (``fastdata bench URL``):
    ``remote`` and ``local`` are (best num_workers, its samples/s) read from the URL through a
    ``cache`` ("cold": emptied before each epoch; "warm") and from the local copy."""
    (workers, rate), (local_workers, local_rate) = remote, local
    how = ("a cold cache: every shard downloaded while it is read" if cache == "cold"
           else "a warm cache: every shard already downloaded")
    text = (f"from the URL ({how}), {row} is best at num_workers={workers} ({rate:,.0f}/s, "
            f"{rate / local_rate:.2f}x the local copy's best) against num_workers={local_workers} on the local copy "
            f"({local_rate:,.0f}/s): ")
    if workers > local_workers:
        text += ("a worker waiting on the network leaves the CPU to the others, so more workers overlap the downloads "
                 "with decoding (I/O-bound reads reward more workers)")
    elif workers == local_workers:
        text += ("no shift: waiting on the downloads does not change which num_workers wins on this machine"
                 if cache == "cold" else "no shift: with every shard cached the read is a local one")
    else:
        text += ("fewer workers win from the URL here: its workers cost more than they overlap (each opens its own "
                 "connection to the store and waits for its first shard); the row's 'why:' line below gives the costs")
    if workers == largest and workers > local_workers:
        text += "; still rising at the largest num_workers tried, so try more"
    return text + "."


def ms(value: float) -> str:
    """A per-batch duration with the precision it needs: 0.016 ms, 1.4 ms, 30 ms."""
    if value < 0.095:
        return f"{value:.3f} ms"
    if value < 9.95:
        return f"{value:.1f} ms"
    return f"{value:,.0f} ms"


def times(ratio: float) -> str:
    """A speed-up with the precision it needs: 1.8x, 28x, 282x."""
    return f"{ratio:.1f}x" if ratio < 9.95 else f"{ratio:,.0f}x"


def duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def why_best_workers(*, best: int, read_ms: float | None, transfer_ms: float | None, largest: int,
                     first_parallel: int | None = None, startup_s: float | None = None,
                     epoch_s: float | None = None) -> str:
    """Why ``best`` num_workers wins a row of ``fastdata bench``: the read cost per batch at
    num_workers=0, the transfer cost of a worker, and worker start-up against the epoch."""
    cost = ms(transfer_ms) + "/batch" if transfer_ms is not None else "unmeasured"
    if best > 0:
        workers = f"{best} worker" + ("s" if best > 1 else "")
        verb = "overlaps" if best == 1 else "overlap"
        why = (f"a batch takes {ms(read_ms)} to read and decode in one process, so {workers} "
               f"{verb} it (transfer costs {cost})" if read_ms else f"{workers} {verb} the reads")
        if best == largest:
            why += "; still rising at the largest num_workers tried"
        return why
    if read_ms and first_parallel is not None and (transfer_ms is None or read_ms > 2 * transfer_ms):
        if startup_s is not None and epoch_s is not None and startup_s > 0.1 * epoch_s:
            return (f"starting workers costs {duration(startup_s)} per epoch (num_workers={first_parallel}) against "
                    f"a {duration(epoch_s)} epoch in one process, more than overlapping a {ms(read_ms)}/batch "
                    "read saves; longer epochs or persistent_workers=True change that")
        return (f"a {ms(read_ms)}/batch read does not pay for workers here (transfer {cost}; "
                "with few cores, workers compete with the main process)")
    return f"workers only add transfer cost ({cost}) to a {ms(read_ms or 0.0)}/batch read"


def startup_sentence(backend: str, workers: int, one_s: float, epoch_s: float) -> str:
    """Worker start-up against the epoch: ``one_s`` was measured with one worker (its first batch),
    and ``workers`` start one after the other, so together they take about ``workers`` times that."""
    noun = BACKENDS[backend].worker_noun(workers)
    total = f"about {duration(workers * one_s)} ({workers} x {duration(one_s)}, measured for one)" if workers > 1 \
        else f"about {duration(one_s)}"
    return (f"Starting {workers} {noun} takes {total}; persistent_workers=True pays that once instead of at the start "
            f"of every epoch (an epoch takes about {duration(epoch_s)}).")


def tune_paragraph(m: Any, choice: Any) -> str:
    """The paragraph ``fastdata tune`` prints: what was measured and why ``choice`` wins.

    ``m`` is a :class:`fastdata.tuning.Measurements`, ``choice`` a
    :class:`fastdata.tuning.Recommendation`."""
    batch = m.batch_size
    parts = [f"num_workers=0: a batch of {batch} takes {ms(m.fetch_ms)} to fetch in this process"]
    if m.standard_fetch_ms is not None and m.standard_fetch_ms > 1.5 * m.fetch_ms:
        parts[-1] += (f" with one dataset[indices] call (DataLoader(batch_size={batch}) fetches and collates "
                      f"sample by sample: {ms(m.standard_fetch_ms)})")
    unresolved = m.hand_over_below_noise
    rows = sorted(BACKENDS.values(), key=lambda row: not row.crosses_process)  # those that cross a process first
    crossings = [f"{ms(m.transfer_ms[row.name])} for {row.workers_name}" for row in rows
                 if row.name in m.transfer_ms and row.name not in unresolved]
    crossings += [f"too little to tell from this machine's noise for {row.workers_name}"
                  for row in rows if row.name in unresolved]
    if crossings:
        parts[-1] += "; handing it from a worker to the training loop costs " + ", ".join(crossings)
    parts[-1] += "."
    torch_cost = next((cost for b, cost in m.transfer_ms.items() if BACKENDS[b].dataloader_options), None)
    if choice.num_workers == 0:
        if torch_cost is not None and torch_cost >= m.fetch_ms:
            parts.append("The fetch is cheaper than the hand-over, so any worker makes loading slower.")
            if m.standard_fetch_ms is not None and m.standard_fetch_ms > 1.5 * m.fetch_ms:
                parts.append(f"What helps instead is fetching whole batches: fastdata.loader(dataset, "
                             f"batch_size={batch}) reads each batch with one indexed call, "
                             f"{m.standard_fetch_ms / m.fetch_ms:.0f}x less work than per-sample fetching "
                             "and collating.")
        elif m.usable_cores <= 1:
            parts.append("With one usable core, workers only take time from the training loop.")
        else:
            parts.append("Workers do not repay their hand-over and start-up here.")
    else:
        noun = BACKENDS[choice.backend].worker_noun(choice.num_workers)
        verb = "overlaps" if choice.num_workers == 1 else "overlap"
        parts.append(f"{choice.num_workers} {noun} {verb} the fetch "
                     f"(this process may use {m.usable_cores} core{'s' if m.usable_cores != 1 else ''}"
                     f"{'' if m.usable_cores == m.cpu_count else f' of os.cpu_count()={m.cpu_count}'}).")
        in_process = BACKENDS[choice.backend].shares_gil
        if in_process and m.thread_speedup is not None and m.thread_speedup >= 1.3:
            parts.append(f"Threads pay off because the fetch releases the GIL (2 threads fetched "
                         f"{m.thread_speedup:.1f}x as fast as one) and nothing crosses a process boundary.")
        elif in_process and m.thread_speedup is not None:
            parts.append(f"Threads won the probes although 2 threads fetched only {m.thread_speedup:.1f}x as fast as "
                         "one (the fetch holds the GIL): what they save is the hand-over (nothing crosses a process "
                         "boundary).")
        elif m.thread_speedup is not None and m.thread_speedup < 1.3:
            parts.append(f"Threads would not help: the fetch holds the GIL (2 threads fetched "
                         f"{m.thread_speedup:.1f}x as fast as one).")
    if m.step_ms > 0:
        loop_ms = choice.step_ms_effective
        wait = choice.wait_fraction if choice.wait_fraction is not None else choice.predicted_wait_fraction
        parts.append(f"With a {ms(loop_ms)} training step the loop waits for data {wait:.0%} of the time"
                     + (" anyway." if choice.num_workers == 0 and wait < 0.05 else "."))
    if choice.num_workers > 0:
        startup = m.startup_s.get(choice.backend)
        if startup is not None and choice.persistent_workers:
            parts.append(startup_sentence(choice.backend, choice.num_workers, startup, m.epoch_s))
    if m.pickle_error:
        parts.append(f"Worker processes started with {m.start_method} (the default on Windows and macOS) "
                     f"need a picklable dataset, and this one is not ({m.pickle_error}); define transforms "
                     "as module-level functions or classes instead of lambdas and open files in "
                     "__getitem__, not __init__. Until then only threads or num_workers=0 work.")
    c = choice.conversion
    if c and c.get("error"):
        parts.append(f"A probe conversion to {c['format']} ({c['store']}) failed: {c['error']}")
    elif c and c.get("speedup"):
        parts.append(f"Converting the source to {c['format']} ({c['store']}) is predicted to read at "
                     f"{c['predicted_samples_per_s']:,.0f} samples/s, {c['speedup']:.1f}x the best here "
                     f"(from a probe conversion of {c['probe_samples']:,} samples; the whole conversion "
                     f"would take about {duration(c['predicted_conversion_s'])} on one process).")
    return " ".join(parts)
