"""How far ``fastdata tune``'s figures can be trusted on this machine, right now.

A shared or loaded machine makes every timing noisy: a hand-over of a few microseconds measures
as zero, two threads "fetch 6.9x as fast as one", a batch takes ten times longer on a rerun.
So tune measures the noise itself (the same fixed piece of work, timed again and again),
repeats each noisy measurement until it settles (or a few times at most), keeps the spread of
every figure, and says which figures cannot be trusted, and why (:func:`doubts`).

Pure functions of measured values, except :func:`machine_noise` (which times a loop); tests
build :class:`Spread` values by hand.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from fastdata.bench.explain import ms

NOISY = 0.25  # a figure whose repeats spread more than +-25% around their median is flagged as noisy
IMPLAUSIBLE = 1.15  # a ratio more than 15% above what the machine allows is noise, not a measurement
REPEATS = 3  # a noisy measurement is taken at least this often ...
MAX_REPEATS = 6  # ... and again, up to this often, while it spreads more than NOISY
NOISE_RUNS = 20  # machine_noise times its fixed work this often
NOISE_WORK_S = 0.001  # ... each run about this long


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one figure: their median and their spread (the 10th to 90th
    percentile with 5 or more values, else min..max)."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return self._bounds()[0]

    @property
    def high(self) -> float:
        return self._bounds()[1]

    def _bounds(self) -> tuple[float, float]:
        if len(self.values) >= 5:
            deciles = statistics.quantiles(self.values, n=10, method="inclusive")
            return deciles[0], deciles[-1]
        return min(self.values), max(self.values)

    @property
    def relative(self) -> float:
        """Half the spread as a share of the median (the ``+-`` of ``fastdata bench``); 0 for one
        value, infinite around a median of 0 with any spread."""
        half = (self.high - self.low) / 2
        if half == 0:
            return 0.0
        return half / abs(self.median) if self.median else float("inf")

    @property
    def noisy(self) -> bool:
        return self.relative > NOISY

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "low": self.low, "high": self.high, "repeats": len(self.values),
                "relative": round(self.relative, 4) if self.relative != float("inf") else None}


def repeat(measure_once: Callable[[], float], *, at_least: int = REPEATS, at_most: int = MAX_REPEATS,
           plausible: Callable[[float], bool] = lambda value: True) -> Spread:
    """Call ``measure_once`` ``at_least`` times, then again while the values spread more than
    :data:`NOISY` or their median is not ``plausible`` (a ratio above what the machine allows),
    up to ``at_most`` calls in all."""
    values = [measure_once() for _ in range(at_least)]
    while len(values) < at_most and (Spread(tuple(values)).noisy or not plausible(statistics.median(values))):
        values.append(measure_once())
    return Spread(tuple(values))


def machine_noise(runs: int = NOISE_RUNS, work_s: float = NOISE_WORK_S) -> Spread:
    """The same fixed piece of pure-Python work (about ``work_s``), timed ``runs`` times, in
    seconds: on a quiet core the spread is a few percent; other processes competing for the
    cores widen it, and every other figure tune measures is as unsteady."""
    def spin(count: int) -> float:
        start = time.perf_counter()
        total = 0
        for value in range(count):
            total += value
        return time.perf_counter() - start

    count = 10_000
    count = max(1_000, int(count * work_s / max(min(spin(count) for _ in range(3)), 1e-6)))
    return Spread(tuple(spin(count) for _ in range(runs)))


def thread_limit(cores: int) -> float:
    """The most two threads can fetch over one: 2x, or 1x with a single usable core."""
    return float(min(2, max(1, cores)))


def doubts(m: Any) -> list[str]:
    """The figures of :class:`~fastdata.tuning.Measurements` ``m`` that cannot be trusted, one
    sentence each (empty when all are steady): a busy machine, a figure whose repeats spread more
    than :data:`NOISY`, a hand-over too small to tell from the noise, a ratio the machine cannot
    reach."""
    found = []
    noise = m.spreads.get("noise")
    if noise is not None and noise.noisy:
        found.append(f"this machine is busy: the same {noise.median * 1000:.1f} ms of work took "
                     f"{noise.low * 1000:.1f}-{noise.high * 1000:.1f} ms across {len(noise.values)} runs "
                     f"(+-{noise.relative:.0%}), so every figure here may be off by as much")
    fetch = m.spreads.get("fetch_ms")
    if fetch is not None and fetch.noisy:
        found.append(f"the fetch per batch varied from {ms(fetch.low)} to {ms(fetch.high)} across "
                     f"{len(fetch.values)} calls (+-{fetch.relative:.0%})")
    for backend in m.transfer_ms:
        hand_over = m.spreads.get(f"transfer_ms.{backend}")
        if hand_over is not None and below_noise(hand_over):
            found.append(f"the {backend} hand-over per batch is below what this machine resolves "
                         f"({hand_over.low:+.3g} to {hand_over.high:+.3g} ms across {len(hand_over.values)} repeats): "
                         "taken as 0")
        elif hand_over is not None and hand_over.noisy:
            found.append(f"the {backend} hand-over per batch varied from {hand_over.low:.3g} to {hand_over.high:.3g} ms "
                         f"across {len(hand_over.values)} repeats (+-{hand_over.relative:.0%})")
    for backend in m.startup_s:
        startup = m.spreads.get(f"startup_s.{backend}")
        if startup is not None and startup.noisy:
            found.append(f"starting one {backend} worker took from {ms(startup.low * 1000)} to {ms(startup.high * 1000)} "
                         f"across {len(startup.values)} starts (+-{startup.relative:.0%})")
    threads = m.spreads.get("thread_speedup")
    if threads is not None and threads.median > IMPLAUSIBLE * thread_limit(m.usable_cores):
        found.append(f"2 threads fetched {threads.median:.2f}x as fast as one, more than the "
                     f"{thread_limit(m.usable_cores):.0f}x that 2 threads on {m.usable_cores} usable "
                     f"core{'s' if m.usable_cores != 1 else ''} can reach: noise; taken as "
                     f"{m.thread_speedup:.2f}x")
    elif threads is not None and threads.noisy:
        found.append(f"2 threads over 1 varied from {threads.low:.2f}x to {threads.high:.2f}x across "
                     f"{len(threads.values)} repeats")
    return found


def below_noise(spread: Spread) -> bool:
    """A difference of two timings (a hand-over: a worker's batch minus the loop's own) whose
    repeats reach zero or below: too small to tell from the noise."""
    return spread.low <= 0 or spread.median <= 0


def choice_doubt(candidates: list[dict[str, Any]], backend: str, workers: int, noise: Spread | None) -> str | None:
    """On a busy machine (``noise`` flagged), a sentence when the recommended candidate's probe and
    the best other probe are closer than the noise: which of the two is faster is not settled."""
    measured = [row for row in candidates if "measured_samples_per_s" in row]
    chosen = next((row for row in measured if (row["backend"], row["num_workers"]) == (backend, workers)), None)
    others = [row for row in measured if row is not chosen]
    if noise is None or not noise.noisy or chosen is None or not others:
        return None
    other = max(others, key=lambda row: row["measured_samples_per_s"])
    rates = sorted((chosen["measured_samples_per_s"], other["measured_samples_per_s"]))
    if rates[0] > 0 and rates[1] / rates[0] > 1 + noise.relative:
        return None
    name = lambda row: ("num_workers=0" if row["num_workers"] == 0  # noqa: E731
                        else f"{row['backend']} num_workers={row['num_workers']}")
    return (f"the recommended {name(chosen)} probed at {chosen['measured_samples_per_s']:,.0f} samples/s and "
            f"{name(other)} at {other['measured_samples_per_s']:,.0f}: closer than this machine's noise "
            f"(+-{noise.relative:.0%}), so which is faster is not settled")
