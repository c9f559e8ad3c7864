"""The search behind ``num_workers="auto"``: pure functions from measured windows to decisions.

The loader (:mod:`fastdata.loading.autoloader`) measures the loop in *windows* of a few batches
(how long the loop waited in ``next()``, its own step between ``next()`` calls, the producers'
time per batch, the CPU busy of the process tree, the workers' memory) and hands each finished
:class:`Window` to :func:`decide`, with the :class:`Search` so far and the :class:`Budget`. The
answer is the next search state and, when the setting should change, a :class:`Decision`. The
loader applies it between two batches; nothing here touches a thread, a process or a clock, so
the search is tested on simulated windows for any number of cores.

The search is a hill climb on samples/s with back-off and hysteresis:

* Start where the loader starts (``num_workers=0`` unless told otherwise: the first batch is never
  delayed), and measure it for two windows. A loop that waits in ``next()`` less than :data:`WAIT_TARGET` of its time has nothing
  to gain: stay (or, with workers, try fewer: a worker costs memory and the CPU a step may need).
* Otherwise add workers, doubling the step after each gain of at least :data:`GAIN` (1, 2, 4, ...
  on a 64-core machine), and stop adding once the wait is under :data:`WAIT_TARGET`, the cores are
  busy, or the budget is reached. A step that gains less is undone, then half of it is tried.
* The serial loop's windows choose the backend to climb with: processes where its fetch computes
  for milliseconds a batch (the process tree busy while the loop waits), threads where it waits on
  I/O or is a quick gather (:func:`_first_backend`).
* Threads may go to twice the cores while the cores are busy (kept only if they gain: the loop's
  own thread and GIL-held stretches leave a share idle), and further only while the process tree
  leaves cores idle (the work waits on I/O); worker processes never exceed the cores. Where a
  climb stops with the loop still waiting, the other backend is tried once with the same count,
  and kept only if faster (:func:`_other_backend`).
* A trial is kept only when a second window at it confirms the first (the two pooled still beat
  ``best`` by the margin): on a shared machine one lucky window is common. A trial that would start
  workers from the serial loop for a gain under :data:`CLEAR` is then parked and the serial loop
  measured once more (A, B, B, A): it is kept only if it still beats the better of the two
  measurements, so that a rate that drifted during the trial, or two lucky windows in a row, do not
  start workers that cost more than they give. A trial that loses is undone at its first window, so
  the loop falls back at once to the better setting it measured.
* During a climb, a time to produce a batch that moves :data:`PHASE`-fold between two windows (a
  cache that warmed) starts the search again, as at the start, from ``num_workers=0``: what the
  climb found so far belongs to the other phase.
* Settled, each window is compared with the one it settled on: when the step, the rate, the time
  (or CPU) to produce a batch or the wait moves by more than :data:`RECHECK` for
  :data:`RECHECK_WINDOWS` windows in a row (a slower step, a warm cache), the search starts again:
  from the current setting where the step moved, from ``num_workers=0`` where the data did.
* A switch from threads to processes (whose windows do not show the time to produce a batch) is
  kept only after the threads are measured again, which shows a phase that ended under the trial.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from fastdata.loading.measures import (  # noqa: F401 (the search's vocabulary, re-exported)
    MIN_THREADS, THREADS_PER_CORE, Budget, Decision, Setting, Window, log_entry, pooled,
)

WAIT_TARGET = 0.05  # the loop waits for data less than this share of its time: enough workers
GAIN = 0.05  # a change that adds workers must gain this much to be kept
KEEP = 0.03  # a change that removes workers is kept if it loses less than this
RECHECK = 0.3  # settled: a step, time to produce or wait that moves this much (relative) starts a new climb
RECHECK_RATE = 1.0  # ... or a rate that moves this much (a shared machine's rate is noisy: only a doubling)
RECHECK_WINDOWS = 3  # ... for this many windows in a row
STEP_FLOOR_S = 0.001  # a step that moves by less than this per batch is the machine's noise
BUSY = 0.85  # the process tree uses this share of the cores: no more workers
GIL_BUSY = 0.75  # threads that keep fewer busy cores than this share of theirs are held by the GIL
PROCESS_MIN_FETCH_S = 0.002  # a fetch shorter than this per batch is not worth a process hand-over
BUSY_THREADS_PER_CORE = 2  # threads may go this far past the cores while they are busy (kept only if it gains)
PHASE = 20.0  # during a climb, a time to produce a batch that moves this many times: a new phase, a new climb
CLEAR = 1.5  # a trial from num_workers=0 that gains less than this is checked against nw=0 measured again


@dataclass(frozen=True)
class Search:
    """Where the climb is. ``best`` is the setting kept so far and ``best_window`` what it measured;
    ``trial`` the setting being measured, if any, ``direction`` +1 (adding) or -1 (removing) and
    ``step`` its distance from ``best``. ``floor``/``ceiling``: worker counts of this backend found
    worse than ``best`` (the climb bisects between them). ``settled``: the window it settled on."""

    best: Setting
    best_window: Window | None = None
    trial: Setting | None = None
    step: int = 1
    direction: int = 1
    floor: int = -1
    ceiling: int | None = None
    settled: Window | None = None
    moved: int = 0  # settled windows in a row that moved by more than RECHECK
    tried: frozenset = field(default_factory=frozenset)  # backends climbed in this search
    went_down: bool = False  # removing workers was tried in this search
    worker_bytes: int | None = None  # the memory one worker process adds, once one was measured
    flight_bytes: int | None = None  # the memory of one worker's batches in flight, once a batch was seen
    pending: Window | None = None  # the trial's first window, that would keep it: awaiting confirmation
    recheck: tuple[Setting, Window] | None = None  # a confirmed trial parked while ``best`` is measured again

    @property
    def current(self) -> Setting:
        return self.trial or self.best


def start(setting: Setting) -> Search:
    """The search at the loader's first batch."""
    return Search(best=setting, tried=frozenset({setting.backend}))


def decide(search: Search, window: Window, budget: Budget) -> tuple[Search, Decision | None]:
    """The next search state and the change to make (None: keep the setting), from the window just
    measured at ``search.current``. Pure: same arguments, same answer. Invariant: after a decision,
    ``search.current`` is the decision's setting."""
    if window.worker_bytes:
        search = dataclasses.replace(search, worker_bytes=window.worker_bytes)
    if window.flight_bytes:
        search = dataclasses.replace(search, flight_bytes=window.flight_bytes)
    current = search.current
    most = _most(budget, current.backend, search)
    if current.num_workers > most:  # over the memory budget (or a bound that came with a resumed state)
        each = budget.worker_cost(current.backend, search.worker_bytes, search.flight_bytes)
        over = f"over the budget: {current.num_workers} workers of {each / 2**20:.0f} MiB each, " \
               f"{budget.memory_bytes / 2**20:.0f} MiB allowed"
        if search.trial is not None and search.best.num_workers <= _most(budget, search.best.backend, search):
            return _settle(dataclasses.replace(search, trial=None), window,  # back to what fits
                           f"undone {search.best.num_workers} -> {current.num_workers} ({current.backend}): {over}")
        fewer = current.with_workers(most)
        return Search(best=fewer, tried=search.tried, ceiling=most + 1, **_memory(search)), Decision(fewer, over)
    if search.settled is not None:
        return _watch(search, window, budget)
    if search.best_window is not None and _phase_changed(search.best_window, window):
        serial = Setting(budget.backends[0], 0, current.prefetch)  # what was found belongs to another phase
        before, now = search.best_window.produce_per_batch_s, window.produce_per_batch_s
        reason = f"re-check: a batch takes {1000 * before:.1f} -> {1000 * now:.1f} ms to produce: starting again " \
                 f"from num_workers=0"
        return dataclasses.replace(start(serial), **_memory(search)), Decision(serial, reason)
    if search.best_window is None:  # the start is measured twice, as a kept trial is
        return dataclasses.replace(search, best_window=window, trial=None), None
    if search.recheck is not None:  # ``best`` measured again: the trial's windows against the better of its two
        trial, trial_window = search.recheck
        better = max(search.best_window, window, key=lambda w: w.samples_per_s)
        again = dataclasses.replace(search, best_window=better, trial=trial, recheck=None)
        return _verdict(again, trial_window, budget, rechecked=True)
    if search.trial is None:
        both = pooled(search.best_window, window)
        return _first(dataclasses.replace(search, best_window=both), both, budget)
    return _judge(search, window, budget)


def _memory(search: Search) -> dict[str, int | None]:
    """What was measured of a worker's memory (a new search keeps it)."""
    return {"worker_bytes": search.worker_bytes, "flight_bytes": search.flight_bytes}


def _most(budget: Budget, backend: str, search: Search) -> int:
    return budget.limit(backend, search.worker_bytes, search.flight_bytes)


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


def _first(search: Search, window: Window, budget: Budget) -> tuple[Search, Decision | None]:
    """The first window of a climb: go up if the loop waits, down if it does not and has workers."""
    if window.wait_fraction < WAIT_TARGET:
        if search.best.num_workers > 0:
            return _down(search, f"wait in next() {_pct(window.wait_fraction)} of the loop: trying fewer workers")
        return _settle(search, window, f"wait in next() {_pct(window.wait_fraction)} of the loop: no workers needed")
    chosen = _first_backend(search, window, budget)
    return _up(chosen, window, budget, step=_first_step(search.best, window),
               why=_backend_why(chosen.best.backend, window) if chosen.best.num_workers == 0 and
               {"thread", "process"} <= set(budget.backends) else "")


def _first_backend(search: Search, window: Window, budget: Budget) -> Search:
    """From ``num_workers=0``, the backend to climb with: worker processes where the serial loop
    measured a fetch that computes (the process tree busy while the loop waited) and takes long
    enough to make a process pay; threads otherwise (a fetch that waits on I/O, a quick gather).
    A process computes its batch beside the loop without sharing the GIL with it or with the other
    workers; a climb that stalls still tries the other backend (:func:`_other_backend`)."""
    best, produce = search.best, window.produce_per_batch_s
    if best.num_workers or not {"thread", "process"} <= set(budget.backends):
        return search
    computes = produce is not None and produce >= PROCESS_MIN_FETCH_S and window.busy_cores is not None \
        and window.busy_cores >= GIL_BUSY * window.wait_fraction  # else the fetch mostly waits, or is quick
    backend = "process" if computes else "thread"
    if backend == best.backend:
        return search
    return dataclasses.replace(search, best=Setting(backend, 0, best.prefetch), tried=frozenset({backend}))


def _backend_why(backend: str, window: Window) -> str:
    """What the log says about :func:`_first_backend`'s choice: the serial loop's measurements."""
    produce, busy = window.produce_per_batch_s, window.busy_cores
    measured = ", ".join(([] if produce is None else [f"{produce * 1000:.1f} ms a batch"])
                         + ([] if busy is None else [f"{busy:.1f} cores busy"]))
    if backend == "process":
        return (f"; processes: the serial loop's fetch computes ({measured}), and a process computes beside the "
                "loop without sharing its GIL")
    return (f"; threads: the serial loop's fetch waits or is quick ({measured}), and a thread hands a batch over "
            "for less than a process")


def _first_step(best: Setting, window: Window) -> int:
    """Workers to add first. From ``num_workers=0`` one worker only overlaps the fetch with the
    step, so where the step is a small share of the loop (under 10%) one cannot gain: try two."""
    return 2 if best.num_workers == 0 and window.wait_fraction > 0.9 else 1


def _limit(search: Search, window: Window, budget: Budget) -> int:
    """The most workers the climb may try from ``best`` (budget, cores, what was found worse)."""
    best = search.best
    most = _most(budget, best.backend, search)
    if best.num_workers > 0 and _cores_busy(window, budget):
        if best.backend != "thread":
            most = min(most, best.num_workers)  # busy cores: no more worker processes
        elif best.num_workers >= BUSY_THREADS_PER_CORE * budget.cores:
            most = min(most, best.num_workers)  # threads far beyond the cores only while cores are idle
        else:  # the loop's own thread and GIL-held stretches leave a busy core's share idle now and then
            most = min(most, BUSY_THREADS_PER_CORE * budget.cores)
    if search.ceiling is not None:
        most = min(most, search.ceiling - 1)
    return most


def _up(search: Search, window: Window, budget: Budget, *, step: int, why: str = "") -> tuple[Search, Decision | None]:
    """Try ``step`` more workers than ``best`` (fewer if the limit says so), else what is left;
    ``why``: the reason's end (why this backend)."""
    best = search.best
    most = _limit(search, window, budget)
    target = min(best.num_workers + step, most)
    if target <= best.num_workers:
        return _exhausted(search, window, budget, f"no more {best.backend} workers to try ({most} at most, "
                                                   f"{budget.cores} cores)", stalled=best.num_workers or None)
    return _try(search, best.with_workers(target), +1, target - best.num_workers,
                f"wait in next() {_pct(window.wait_fraction)} of the loop: trying more workers{why}")


def _down(search: Search, reason: str) -> tuple[Search, Decision | None]:
    """Try half-way between ``best`` and the largest count found too few."""
    best = search.best.num_workers
    target = best - max(1, (best - search.floor) // 2)
    if target == 1 and search.floor < 0:  # the serial loop first: one worker is a regime of its own
        target = 0
    return _try(dataclasses.replace(search, went_down=True), search.best.with_workers(target), -1, best - target,
                reason)


def _exhausted(search: Search, window: Window, budget: Budget, reason: str, *,
               stalled: int | None = None) -> tuple[Search, Decision | None]:
    """Nothing more upwards: the other backend where ``stalled`` workers (measured in ``window``)
    gained nothing, else fewer workers (once per climb, and only where no smaller count was
    measured: a climb that came up from one kept its step because it gained), else settle."""
    other = None if stalled is None else _other_backend(search, window, budget, stalled)
    if other is not None:
        return other
    if search.floor < 0 < search.best.num_workers and not search.went_down:  # nothing below measured yet
        return _down(search, f"{reason}: trying fewer")
    return _settle(search, window, reason)


def _cores_busy(window: Window, budget: Budget) -> bool:
    return window.busy_cores is not None and window.busy_cores >= BUSY * budget.cores


def _try(search: Search, setting: Setting, direction: int, step: int, reason: str) -> tuple[Search, Decision]:
    return (dataclasses.replace(search, trial=setting, direction=direction, step=step, pending=None),
            Decision(setting, reason))


def _settle(search: Search, window: Window, reason: str) -> tuple[Search, Decision | None]:
    """Stop at ``best`` (the decision undoes a trial under way)."""
    settled = dataclasses.replace(search, trial=None, settled=search.best_window or window, moved=0, pending=None)
    return settled, Decision(search.best, f"settled: {reason}")


def _keeps(search: Search, ratio: float) -> bool:
    """Whether a trial that measured ``ratio`` times ``best``'s rate is worth keeping."""
    if search.trial.backend != search.best.backend:
        return ratio > 1  # another backend: kept if it is faster at all
    return ratio >= (1 - KEEP if search.direction < 0 else 1 + GAIN)


def _ratio(before: Window, after: Window) -> float:
    return after.samples_per_s / before.samples_per_s if before.samples_per_s > 0 else math.inf


def _judge(search: Search, window: Window, budget: Budget) -> tuple[Search, Decision | None]:
    """A trial's window against the best one's: keep the trial (once a second window confirms it)
    or undo it (at once)."""
    if search.pending is not None:
        window = pooled(search.pending, window)
        search = dataclasses.replace(search, pending=None)
    elif _keeps(search, _ratio(search.best_window, window)):
        return dataclasses.replace(search, pending=window), None  # one more window at the trial first
    return _verdict(search, window, budget)


def _verdict(search: Search, window: Window, budget: Budget, *,
             rechecked: bool = False) -> tuple[Search, Decision | None]:
    """Keep the trial or undo it, from its (pooled) ``window`` against ``best_window``. A trial
    that would start workers from the serial loop for a gain under :data:`CLEAR` is first parked,
    the serial loop measured again for a window, and the trial judged against the better of the
    two measurements (A, B, B, A: a rate that drifts over the trial, or two lucky windows in a row
    on a shared machine, no longer start workers that cost CPU and memory for nothing). A switch to
    a backend whose windows do not show the time to produce a batch (worker processes) is parked
    the same way, whatever its gain: measured again, ``best`` shows whether the dataset's phase
    changed during the trial (:func:`_phase_changed`; a slow phase that ended under the trial
    would otherwise keep the processes for beating the slow phase's rate)."""
    best_window, trial, best = search.best_window, search.trial, search.best
    ratio = _ratio(best_window, window)
    change = f"{best.num_workers} -> {trial.num_workers} ({trial.backend}): {_rate_words(best_window, window)}"
    modest = best.num_workers == 0 and ratio < CLEAR
    unseen = trial.backend != best.backend and best_window.produce_s is not None and window.produce_s is None
    if not rechecked and _keeps(search, ratio) and (modest or unseen):
        parked = dataclasses.replace(search, trial=None, recheck=(trial, window))
        return parked, Decision(best, f"{change}: measuring {best.num_workers} ({best.backend}) again "
                                      f"before keeping it")
    if trial.backend != best.backend:
        if _keeps(search, ratio):
            kept = Search(best=trial, best_window=window, tried=search.tried | {trial.backend},
                          went_down=True, **_memory(search))  # its count: the other's climb
            return _more_or_settle(kept, window, budget, f"kept {change}")
        return _settle(dataclasses.replace(search, trial=None), window, f"undone {change}")
    if search.direction < 0:
        if _keeps(search, ratio):
            kept = dataclasses.replace(search, best=trial, best_window=window, trial=None, ceiling=best.num_workers)
            if trial.num_workers > kept.floor + 1:
                return _down(kept, f"kept {change}; trying fewer")
            return _settle(kept, window, f"kept {change}")
        lower = dataclasses.replace(search, trial=None, floor=trial.num_workers)
        if best.num_workers - lower.floor > 1:
            return _down(lower, f"undone {change}; trying fewer than that")
        return _settle(lower, window, f"undone {change}")
    if _keeps(search, ratio):
        kept = dataclasses.replace(search, best=trial, best_window=window, trial=None, floor=best.num_workers)
        return _more_or_settle(kept, window, budget, f"kept {change}", step=search.step * 2)
    higher = dataclasses.replace(search, trial=None, ceiling=trial.num_workers)
    if trial.num_workers - best.num_workers > 1:
        half = (trial.num_workers - best.num_workers) // 2
        return _try(higher, best.with_workers(best.num_workers + half), +1, half,
                    f"undone {change}; trying {half} more")
    return _exhausted(higher, window, budget, f"undone {change}", stalled=trial.num_workers)


def _more_or_settle(search: Search, window: Window, budget: Budget, reason: str, *,
                    step: int = 1) -> tuple[Search, Decision | None]:
    """After a kept change: on up while the loop still waits, else settle."""
    if window.wait_fraction < WAIT_TARGET:
        return _settle(search, window, f"{reason}; wait under {_pct(WAIT_TARGET)}")
    if _limit(search, window, budget) <= search.best.num_workers:
        other = _other_backend(search, window, budget, search.best.num_workers)
        if other is None:
            return _settle(search, window, f"{reason}; at the limit")
        after, decision = other
    else:
        after, decision = _up(search, window, budget, step=step)
    if decision is None or decision.reason.startswith("settled: "):
        return after, decision
    return after, dataclasses.replace(decision, reason=f"{reason}; {decision.reason}")  # the log says what was kept


def _rate_words(before: Window, after: Window) -> str:
    return (f"{before.samples_per_s:.0f} -> {after.samples_per_s:.0f} samples/s, wait in next() "
            f"{_pct(before.wait_fraction)} -> {_pct(after.wait_fraction)} of the loop")


def _other_backend(search: Search, window: Window, budget: Budget, count: int) -> tuple[Search, Decision] | None:
    """The other backend (threads <-> processes), once per search, with ``count`` workers (the most
    the climb reached, at most the other's limit), where the climb ended with the loop still
    waiting (measured in ``window``). Threads that keep few cores busy are held by the GIL; threads
    that keep them busy may still lose to processes (the GIL's hand-offs cost CPU), and processes
    that leave cores idle may lose to threads (a batch's hand-over costs the loop more): the trial,
    kept only if faster, says which. Processes that keep the cores busy are not: threads would add
    no CPU. Processes are tried only where a batch takes long enough to pay for one."""
    best = search.best
    other = "process" if best.backend == "thread" else "thread"
    if best.backend not in ("thread", "process") or other not in budget.backends or other in search.tried:
        return None
    workers = min(max(2, count), _most(budget, other, search))  # one only overlaps
    if workers < 1 or window.wait_fraction < 4 * WAIT_TARGET:
        return None
    if other == "thread" and _cores_busy(window, budget):
        return None  # processes that fill the cores: threads would add no CPU, only the GIL
    produce = window.produce_per_batch_s
    if other == "process" and (produce is None or produce < PROCESS_MIN_FETCH_S):
        return None
    setting = Setting(other, workers, best.prefetch)
    searched = dataclasses.replace(search, tried=search.tried | {other})
    plural = {"thread": "threads", "process": "processes"}
    if other == "process" and window.busy_cores is not None and window.busy_cores < GIL_BUSY * min(budget.cores,
                                                                                                    count + 1):
        why = f"{count} threads keep {window.busy_cores:.1f} cores busy (the GIL)"
    else:
        why = f"the loop still waits {_pct(window.wait_fraction)} with {count} {plural[best.backend]}"
    return _try(searched, setting, +1, 0, f"{why}: trying {plural[other]}")


def _phase_changed(before: Window, now: Window) -> bool:
    """Whether the time to produce a batch moved by more than :data:`PHASE` between two windows of
    one climb (a cold cache that warmed, a transform swapped): more than threads sharing the cores
    can explain (at most :data:`THREADS_PER_CORE` per core, or :data:`MIN_THREADS` on a small machine)."""
    old, new = before.produce_per_batch_s, now.produce_per_batch_s
    return bool(old and new) and abs(math.log(new / old)) > math.log(PHASE)


def _watch(search: Search, window: Window, budget: Budget) -> tuple[Search, Decision | None]:
    """Settled: start a new climb when the loop's rates move for :data:`RECHECK_WINDOWS` windows:
    from the current setting where the step moved (the data did not: the workers are the right
    kind, their count is what may change), else from ``num_workers=0``, as a phase change during a
    climb does (a slow phase that ended: a quick gather may be faster without any worker, and a
    climb down from many workers stops where a few lose to many, never measuring none)."""
    moved = _moved(search.settled, window)
    if moved is None:
        return dataclasses.replace(search, moved=0), None
    if search.moved + 1 < RECHECK_WINDOWS:
        return dataclasses.replace(search, moved=search.moved + 1), None
    if search.best.num_workers and not moved.startswith("step "):
        serial = Setting(budget.backends[0], 0, search.best.prefetch)
        return dataclasses.replace(start(serial), **_memory(search)), Decision(
            serial, f"re-check: {moved}: starting again from num_workers=0")
    fresh = Search(best=search.best, best_window=window, tried=frozenset({search.best.backend}),
                   **_memory(search))
    climbed, decision = _first(fresh, window, budget)
    return climbed, Decision(decision.setting, f"re-check: {moved}; {decision.reason}")


def _cpu_per_batch(window: Window) -> float | None:
    """CPU seconds of the process tree per batch (what worker processes show of a batch's cost:
    they do not time their fetch)."""
    if window.busy_cores is None:
        return None
    return window.busy_cores * (window.period_s or window.wall_s / max(1, window.batches))


def _moved(before: Window | None, now: Window) -> str | None:
    """What moved by more than :data:`RECHECK` between the settled window and ``now`` (None: nothing)."""
    if before is None:
        return None
    period = before.period_s or before.wall_s / max(1, before.batches)  # the loop's time per batch when it settled
    old, new = before.step_per_batch_s, now.step_per_batch_s
    if abs(new - old) > max(RECHECK * period, STEP_FLOOR_S):  # a step change that matters to the loop's period
        return f"step {1000 * old:.1f} -> {1000 * new:.1f} ms per batch"
    old, new = before.samples_per_s, now.samples_per_s
    if old > 0 and new > 0 and abs(math.log(new / old)) > math.log(1 + RECHECK_RATE):
        return f"rate {old:.0f} -> {new:.0f} samples/s"
    old, new = before.produce_per_batch_s, now.produce_per_batch_s
    if old and new and abs(math.log(new / old)) > math.log(1 + 2 * RECHECK):  # a warm cache, a heavier transform
        return f"a batch takes {1000 * old:.1f} -> {1000 * new:.1f} ms to produce"
    old, new = _cpu_per_batch(before), _cpu_per_batch(now)
    if old and new and abs(math.log(new / old)) > math.log(1 + RECHECK_RATE):  # workers that compute more or less
        return f"a batch takes {1000 * old:.1f} -> {1000 * new:.1f} ms of CPU"
    if (before.wait_fraction < WAIT_TARGET) != (now.wait_fraction < WAIT_TARGET) and \
            abs(now.wait_fraction - before.wait_fraction) > RECHECK:
        return f"wait in next() {_pct(before.wait_fraction)} -> {_pct(now.wait_fraction)} of the loop"
    return None


