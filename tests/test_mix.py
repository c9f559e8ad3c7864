"""fastdata.mix: exact counts per epoch in the proportions of the weights, each source without
replacement until exhausted, deterministic in (seed, epoch); batched reads grouped per source; every
format and backend, ranks, state_dict and elastic resume; a plain DataLoader with set_epoch."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from PIL import Image
from torch.utils.data import DataLoader, TensorDataset

import fastdata
from fastdata.cli.mixing import open_mix
from fastdata.errors import InvalidOptionError
from fastdata.formats.tar import TarIndexedDataset
from fastdata.loading.mix import largest_remainder

from conftest import WRITABLE, WRITABLE_IDS, convert_to, pattern, save


class Codes(torch.utils.data.Dataset):
    """A cheap source: sample ``i`` is the int ``base + i``; reads by index array, counted."""

    supports_index_arrays = True

    def __init__(self, size: int, base: int):
        self.size, self.base, self.reads = size, base, 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return self.base + int(index)
        self.reads += 1
        return torch.as_tensor(np.asarray(index) + self.base)


class PerSample(torch.utils.data.Dataset):
    """A source read per index only (like torchvision's datasets): ``(base + i, base)``."""

    def __init__(self, size: int, base: int):
        self.size, self.base = size, base

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        return torch.tensor(self.base + int(index)), self.base


def sources_of(mix, epoch):
    codes = mix[fastdata_epoch(np.arange(len(mix)), epoch)]
    return (codes // 100_000).numpy()


def fastdata_epoch(indices, epoch):
    from fastdata.loading.samplers import epoch_indices

    return epoch_indices(np.asarray(indices), epoch)


@settings(max_examples=30, deadline=None)
@given(weights=st.lists(st.floats(0.01, 50), min_size=2, max_size=4), length=st.integers(10_000, 30_000),
       epoch=st.integers(0, 5), seed=st.integers(0, 2**32))
def test_each_epoch_holds_the_weights_proportions_within_one_percent(weights, length, epoch, seed):
    sizes = [97, 5000, 13, 40_000][: len(weights)]
    mix = fastdata.mix([Codes(n, 100_000 * k) for k, n in enumerate(sizes)], weights, length=length, seed=seed)
    counts = np.bincount(sources_of(mix, epoch), minlength=len(weights))
    assert counts.tolist() == largest_remainder(length, weights).tolist() and counts.sum() == length
    shares = np.array(weights) / sum(weights)
    assert np.abs(counts / length - shares).max() < 0.01
    assert np.abs(counts - length * shares).max() < 1  # exact counts: within one sample


def test_a_source_is_read_without_replacement_until_exhausted_then_anew():
    big, small = Codes(1000, 0), Codes(7, 100_000)
    mix = fastdata.mix([big, small], [3, 1], length=400, seed=4)
    drawn = {0: [], 1: []}
    for epoch in range(6):
        sources, inner = mix.plan(epoch)
        for source in (0, 1):
            in_draw_order = mix.draws(source, epoch, np.arange(mix.counts[source])).tolist()
            assert sorted(inner[sources == source].tolist()) == sorted(in_draw_order)  # the epoch's positions
            drawn[source] += in_draw_order
    assert len(drawn[0]) == 1800 and sorted(drawn[0][:1000]) == list(range(1000))  # each once, then ...
    assert len(set(drawn[0][1000:1800])) == 800 and drawn[0][1000:1800] != drawn[0][:800]  # ... a new permutation
    for cycle in range(len(drawn[1]) // 7):  # the small source, up-sampled: every cycle a permutation of it
        assert sorted(drawn[1][cycle * 7:(cycle + 1) * 7]) == list(range(7))
    assert len({tuple(drawn[1][c * 7:(c + 1) * 7]) for c in range(10)}) > 1


def test_the_order_is_a_function_of_seed_and_epoch():
    make = lambda seed: fastdata.mix([Codes(50, 0), Codes(30, 100_000)], [1, 2], seed=seed)  # noqa: E731
    a, b = make(1), pickle.loads(pickle.dumps(make(1)))
    assert all((a.plan(e)[1] == b.plan(e)[1]).all() for e in range(3))
    assert not (a.plan(0)[1] == a.plan(1)[1]).all()
    assert not (make(1).plan(0)[1] == make(2).plan(0)[1]).all()


def test_a_batch_reads_each_source_once_in_the_order_of_its_indices():
    big, small = Codes(100, 0), Codes(10, 100_000)
    mix = fastdata.mix([big, small], [1, 1], length=60, seed=0, with_source=True)
    indices = np.array([5, 3, 40, 1, 59, 22, 7])
    codes, sources = mix[indices]
    assert big.reads == 1 and small.reads == 1
    assert codes.tolist() == [mix[int(i)][0] for i in indices]
    assert sources.tolist() == [mix.source_of(int(i)) for i in indices] == (codes // 100_000).tolist()
    assert mix.source_of(indices).tolist() == sources.tolist()


def test_per_sample_sources_under_a_plain_dataloader_follow_set_epoch():
    mix = fastdata.mix([PerSample(20, 0), PerSample(5, 1000)], [1, 1], length=24, seed=3)
    assert not mix.supports_index_arrays
    per_epoch = []
    for epoch in range(2):
        mix.set_epoch(epoch)
        values = [int(v) for batch, _ in DataLoader(mix, batch_size=5) for v in batch]
        sources, inner = mix.plan(epoch)
        assert values == (inner + 1000 * sources.astype(np.int64)).tolist()
        per_epoch.append(values)
    assert per_epoch[0] != per_epoch[1]


@pytest.mark.parametrize("backend", ["torch", "thread", "process"])
def test_the_loader_carries_the_epoch_to_per_sample_sources(backend):
    """fastdata.loader's workers read epoch 1's draws in epoch 1 without any set_epoch."""
    mix = fastdata.mix([PerSample(20, 0), PerSample(5, 1000)], [1, 1], length=24, seed=3)
    loader = fastdata.loader(mix, batch_size=5, seed=1, backend=backend, num_workers=2)
    for epoch in range(2):
        values = sorted(int(v) for batch, _ in loader for v in batch)
        sources, inner = mix.plan(epoch)
        assert values == sorted((inner + 1000 * sources.astype(np.int64)).tolist())


@pytest.fixture
def two_converted(tmp_path: Path):
    """Two image folders of one size (7 and 3 images), distinct pixels per image."""
    folders = []
    for number, count in enumerate((7, 3)):
        root = tmp_path / f"folder{number}"
        for i in range(count):
            save(Image.fromarray(pattern(8, 6, seed=200 * number + i)), root / f"c{i % 2}" / f"{i}.png")
        folders.append(root)
    return folders


def map_style(path):
    ds = fastdata.open_dataset(path)
    return TarIndexedDataset(path) if isinstance(ds, torch.utils.data.IterableDataset) else ds


@pytest.mark.parametrize(("name", "store"), WRITABLE, ids=WRITABLE_IDS)
def test_every_format_mixes_with_npy_on_every_backend(two_converted, tmp_path, name, store):
    first = map_style(convert_to(two_converted[0], tmp_path, name, store))
    second = map_style(convert_to(two_converted[1], tmp_path / "b", "npy", "raw"))
    mix = fastdata.mix([first, second], [1, 2], length=12, seed=5, with_source=True)
    expected = {}
    for epoch in range(2):
        sources, inner = mix.plan(epoch)
        samples = [[first, second][s][int(i)] for s, i in zip(sources, inner)]
        expected[epoch] = Counter((int(s), fastdata_pixels(image), int(label))
                                  for s, (image, label) in zip(sources, samples))
    for backend in ("torch", "thread", "process"):
        loader = fastdata.loader(mix, batch_size=5, seed=0, backend=backend, num_workers=2 if backend != "torch" else 0)
        for epoch in range(2):
            got = Counter()
            for images, labels, sources in loader:  # grouped per source, each read into its rows
                got.update((int(s), fastdata_pixels(image), int(label))
                           for s, image, label in zip(sources, images, labels))
            assert got == expected[epoch], (backend, epoch)


def fastdata_pixels(image) -> bytes:
    return np.ascontiguousarray(np.asarray(image)).tobytes()


@pytest.mark.parametrize("backend", ["torch", "thread", "process"])
def test_a_mix_resumes_on_another_world_size_exactly_once(backend):
    mix = fastdata.mix([Codes(30, 0), Codes(8, 100_000)], [2, 1], length=41, seed=9)
    state, seen = None, []
    for rank in range(3):
        loader = fastdata.loader(mix, batch_size=3, seed=2, rank=rank, world_size=3, even=False, backend=backend,
                                 num_workers=2)
        for number, batch in enumerate(loader):
            seen += batch.tolist()
            if number == 1:
                state = loader.state_dict()
                break
    assert len(json.dumps(state)) < 1024
    rest = []
    for rank in range(2):
        loader = fastdata.loader(mix, batch_size=4, seed=2, rank=rank, world_size=2, even=False, backend=backend)
        loader.load_state_dict(state)
        rest += [v for batch in loader for v in batch.tolist()]
    sources, inner = mix.plan(0)
    assert Counter(seen + rest) == Counter((inner + 100_000 * sources.astype(np.int64)).tolist())


def test_a_state_of_another_mix_is_refused():
    mix = fastdata.mix([Codes(30, 0), Codes(8, 100_000)], [2, 1], seed=9)
    state = fastdata.loader(mix, batch_size=4, seed=0).state_dict()
    other = fastdata.loader(fastdata.mix([Codes(30, 0), Codes(8, 100_000)], [1, 1], seed=9), batch_size=4, seed=0)
    with pytest.raises(InvalidOptionError, match=r"^Cannot resume: the saved state is of another mix \(its length, "
                                                 r"weights or datasets' lengths differ from this one's: length=38, "
                                                 r"weights=\[1.0, 1.0\], lengths=\[30, 8\]\)"):
        other.load_state_dict(state)
    reseeded = fastdata.loader(fastdata.mix([Codes(30, 0), Codes(8, 100_000)], [2, 1], seed=1), batch_size=4, seed=0)
    with pytest.raises(InvalidOptionError, match=r"^Cannot resume: the saved state is of a mix with seed=9 but this "
                                                 r"mix has seed=1. Build the mix with seed=9.$"):
        reseeded.load_state_dict(state)


@pytest.mark.parametrize(("datasets", "weights", "options", "message"), [
    ([], [], {}, r"^Invalid datasets \[\]. Give a non-empty list of map-style datasets.$"),
    (["codes"], [1, 2], {}, r"^Invalid weights \[1, 2\]. Give 1 finite numbers >= 0, one per dataset, not all 0"),
    (["codes"], [0], {}, r"^Invalid weights \[0\]"),
    (["codes"], [float("nan")], {}, r"^Invalid weights \[nan\]"),
    (["codes"], [1], {"length": -1}, r"^Invalid length -1. Use a number of samples per epoch >= 0"),
    (["empty"], [1], {}, r"^Dataset 0 \(Codes\) is empty: a mix cannot draw from it. Leave it out.$"),
    (["codes"], [1], {"seed": -1}, r"^Invalid seed -1. Use an integer >= 0.$"),
    (["codes"], [1], {"seed": np.bool_(True)}, r"^Invalid seed np.True_. Use an integer >= 0.$"),
    (["codes", "codes"], {0: 3, 1: 1}, {}, r"^Invalid weights \{0: 3, 1: 1\}: a dict does not say which dataset each "
                                           r"weight is for. Give a list of 2 numbers, one per dataset in the order of "
                                           r"datasets.$"),
    (["codes"], {1}, {}, r"^Invalid weights \{1\}: a set does not say which dataset"),
    (["codes"], [1], {"length": 10**12}, r"^Invalid length: length=1000000000000 is more than 4294967296 samples per "
                                         r"epoch \(an epoch's shuffled order holds 8 bytes a sample: 8e\+03 GB\). Pass "
                                         r"a shorter length=: the sources' draws go on from epoch to epoch, so more "
                                         r"epochs of it read the same samples.$"),
    (["codes"], [1], {"length": 10**19}, r"^Invalid length: length=10000000000000000000 is more than 4294967296"),
    (["huge"], [1], {}, r"^Invalid length: the sum of the datasets' lengths \(1099511627776\) is more than "),
    (["codes"], [1], {"length": 2.0}, r"^Invalid length 2.0. Use a number of samples per epoch >= 0"),
])
def test_bad_mix_options_are_refused(datasets, weights, options, message):
    made = {"codes": Codes(3, 0), "empty": Codes(0, 0), "huge": Codes(2**40, 0)}
    with pytest.raises(InvalidOptionError, match=message):
        fastdata.mix([made[d] for d in datasets], weights, **options)


def test_numpy_integers_are_taken_for_length_and_seed():
    plain = fastdata.mix([Codes(50, 0), Codes(7, 100_000)], [2, 1], length=40, seed=3)
    numpy = fastdata.mix([Codes(50, 0), Codes(7, 100_000)], [2, 1], length=np.int64(40), seed=np.int64(3))
    assert numpy.length == 40 and numpy.seed == 3 and type(numpy.seed) is int
    assert [a.tolist() for a in numpy.plan(1)] == [a.tolist() for a in plain.plan(1)]


def test_weights_whose_sum_overflows_are_the_proportions_they_say():
    mix = fastdata.mix([Codes(50, 0), Codes(7, 100_000)], [1e308, 1e308], length=41)
    assert mix.counts.tolist() == [21, 20]
    assert np.bincount(mix.plan(0)[0], minlength=2).tolist() == [21, 20]


def test_a_mix_rebuilt_with_weights_scaled_alike_resumes():
    """Weights scaled by 2 give the same counts, so the same order: its state is taken."""
    make = lambda weights: fastdata.loader(fastdata.mix([Codes(30, 0), Codes(8, 100_000)], weights, seed=9),  # noqa: E731
                                           batch_size=4, seed=0)
    loader = make([2, 1])
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    rest = [b.tolist() for b in batches]
    resumed = make([4, 2])
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest and len(rest) == 7


def test_a_state_saved_before_computed_orders_is_refused_in_one_line():
    mix = fastdata.mix([Codes(30, 0), Codes(8, 100_000)], [2, 1], seed=9)
    loader = fastdata.loader(mix, batch_size=4, seed=0)
    old = hashlib.blake2b(b"38|[2.0, 1.0]|[30, 8]", digest_size=8).hexdigest()  # the earlier digest of this mix
    with pytest.raises(InvalidOptionError) as error:
        loader.load_state_dict({**loader.state_dict(), "dataset": {"seed": 9, "digest": old}})
    assert str(error.value) == (
        "Cannot resume: the saved state is of this mix as an earlier fastdata ordered it (each epoch's order differs "
        "now). Finish that epoch with the fastdata that saved it, or start the next epoch without the state "
        "(loader.set_epoch(state['epoch'] + 1)).")


def test_a_huge_source_is_drawn_from_without_an_array_of_it():
    """A source of 2**40 samples (an index array of it: 8 TB): each epoch's draws are still distinct
    samples of it, and the epochs go on through it."""
    mix = fastdata.mix([Codes(2**40, 0), Codes(10, 2**41)], [9, 1], length=2000, seed=5)
    loader = fastdata.loader(mix, batch_size=256, seed=1)
    seen = [np.concatenate([b.numpy() for b in loader]) for _ in range(2)]
    for codes in seen:
        big = codes[codes < 2**40]
        assert len(big) == 1800 and len(np.unique(big)) == 1800 and big.max() > 2**39
    assert not set(seen[0][seen[0] < 2**40].tolist()) & set(seen[1][seen[1] < 2**40].tolist())


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 3000), seed=st.integers(0, 2**64), streams=st.lists(st.integers(0, 2**64 - 1), min_size=1,
                                                                               max_size=3))
def test_a_computed_permutation_is_a_bijection(size, seed, streams):
    from fastdata.loading.permutation import permuted, round_keys, stream_keys

    keys = round_keys(seed, 7)
    assert sorted(permuted(np.arange(size), size, keys).tolist()) == list(range(size))
    values = np.repeat(np.arange(size), len(streams))
    per_stream = stream_keys(keys, np.tile(np.array(streams, dtype=np.uint64), size))
    images = permuted(values, size, per_stream).reshape(size, len(streams))
    for column in range(len(streams)):
        assert sorted(images[:, column].tolist()) == list(range(size))


class Single(torch.utils.data.Dataset):
    """One sample: its source's number."""

    def __init__(self, number: int) -> None:
        self.number = number

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index):
        return torch.tensor(self.number)


def test_a_mix_of_more_than_32768_sources_reads_each_one():
    """Source ids past 32767 (they wrapped to negative int16 ids, so another source was read)."""
    count = 40_000
    mix = fastdata.mix([Single(number) for number in range(count)], [1] * count, seed=2)
    sources, inner = mix.plan(0)
    assert sorted(sources.tolist()) == list(range(count)) and not inner.any()
    assert [int(mix[i]) for i in range(0, count, 97)] == sources[::97].tolist()


@pytest.mark.parametrize("size", [2**16 - 1, 2**16, 2**16 + 1, 2**17 + 1, 1_000_003])
def test_a_computed_permutation_is_a_bijection_past_the_small_sizes(size):
    """From 2**16 values on, the network runs 6 rounds: still every value once (one just past a
    power of two, a prime)."""
    from fastdata.loading.permutation import permuted, round_keys

    for seed in (0, 2**64 - 1):
        images = permuted(np.arange(size), size, round_keys(seed, 3))
        assert images.dtype == np.int64 and np.array_equal(np.sort(images), np.arange(size))


@pytest.mark.parametrize("size", [2**32 - 1, 2**32 + 1, 2**40, 2**40 + 1, 2**62 + 12345, 2**63 - 1])
def test_a_computed_permutation_of_a_huge_range_stays_in_it_and_repeats_nothing(size):
    from fastdata.loading.permutation import permuted, round_keys

    values = np.unique(np.concatenate([np.arange(50_000), size - 1 - np.arange(50_000),
                                       np.random.default_rng(0).integers(0, size, 100_000)]))
    images = permuted(values, size, round_keys(1, 2))
    assert images.min() >= 0 and images.max() < size and len(np.unique(images)) == len(values)


@pytest.mark.parametrize("size", [10, 11])
def test_a_small_computed_permutation_sends_each_position_anywhere_alike(size):
    """Over 40,000 cycles of a small source, each position goes to each place about as often:
    within 4.5 standard deviations (with 12 rounds some went 13% more often: 8.6 and 7.8 of them)."""
    from fastdata.loading.permutation import permuted, round_keys, stream_keys

    cycles = 40_000
    keys = stream_keys(round_keys(5), np.repeat(np.arange(cycles, dtype=np.uint64), size))
    images = permuted(np.tile(np.arange(size), cycles), size, keys).reshape(cycles, size)
    counts = np.stack([np.bincount(images[:, position], minlength=size) for position in range(size)])
    deviation = np.abs(counts / (cycles / size) - 1).max() / np.sqrt(size / cycles)
    assert deviation < 4.5, deviation


def test_computed_orders_are_the_same_on_every_machine():
    """Pinned values (uint64 arithmetic and SeedSequence only): a platform or numpy that computed
    another order would resume every saved state elsewhere."""
    from fastdata.loading.permutation import permuted, round_keys, stream_keys

    assert permuted(np.arange(10), 10, round_keys(0, 7)).tolist() == [3, 9, 7, 5, 2, 8, 0, 4, 1, 6]
    assert permuted(np.array([0, 1, 2**40 - 1]), 2**40, round_keys(5, 1)).tolist() == \
        [394975086187, 1032161065788, 636413808212]
    keys = stream_keys(round_keys(1), np.array([0, 2**64 - 1], dtype=np.uint64))
    assert permuted(np.array([3, 3]), 2**32 - 1, keys).tolist() == [3518147177, 321230036]
    mix = fastdata.mix([TensorDataset(torch.arange(7)), TensorDataset(torch.arange(5))], [2, 1], length=9, seed=3)
    assert [part.tolist() for part in mix.plan(1)] == [[0, 1, 0, 1, 0, 0, 1, 0, 0], [0, 2, 6, 3, 4, 5, 0, 3, 0]]


@pytest.mark.parametrize(("sources", "message"), [
    ([TensorDataset(torch.zeros(4, 2, dtype=torch.uint8)), TensorDataset(torch.zeros(4, 2))],
     r"^A mix's sources give samples of different structures or types: source 0 \(TensorDataset\) gives \(uint8\), "
     r"source 1 \(TensorDataset\) \(float32\) \(\[0\]: uint8 against float32\). A batch holds one type per field: "
     r"give the sources transforms \(or convert them\) so that their samples are alike.$"),
    ([TensorDataset(torch.zeros(4, 2), torch.zeros(4)), TensorDataset(torch.zeros(4, 2))],
     r"^A mix's sources give samples of different structures or types: source 0 \(TensorDataset\) gives "
     r"\(float32, float32\), source 1 \(TensorDataset\) \(float32\) \(the sample: \(float32, float32\) against "
     r"\(float32\)\)"),
    ([Codes(3, 0), PerSample(3, 0)], r"^A mix's sources give samples of different structures or types: source 0 "
                                     r"\(Codes\) gives int64, source 1 \(PerSample\) \(int64, int64\)"),
])
def test_sources_unlike_in_structure_or_dtype_are_refused_at_build(sources, message):
    with pytest.raises(InvalidOptionError, match=message):
        fastdata.mix(sources, [1, 1])


class RandomlyShifted(Codes):
    """A source whose reads draw from the global random generators, as random transforms do."""

    def __getitem__(self, index):
        return super().__getitem__(index) + int(torch.randint(0, 9, ())) + int(np.random.randint(9)) + \
            random.randrange(9)


def test_building_a_mix_leaves_the_global_random_generators_as_they_were():
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    expected = (torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random())
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    fastdata.mix([RandomlyShifted(5, 0), RandomlyShifted(5, 100)], [1, 1])
    assert (torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()) == expected


def test_an_iterable_source_is_refused_naming_its_map_style_reader(two_converted, tmp_path):
    path = convert_to(two_converted[0], tmp_path, "tar", "encoded")
    with pytest.raises(InvalidOptionError, match=r"^mix needs map-style datasets \(random access by index\), but "
                                                 r"dataset 1 is the iterable TarDataset. Use fastdata.TarIndexedDataset"):
        fastdata.mix([Codes(3, 0), fastdata.open_dataset(path)], [1, 1])


def test_sources_of_different_shapes_are_refused_when_they_meet_in_a_batch():
    mix = fastdata.mix([TensorDataset(torch.zeros(4, 3, 8, 8)), TensorDataset(torch.zeros(4, 3, 4, 4))], [1, 1])
    with pytest.raises(InvalidOptionError, match=r"^A mix's sources give samples of different shapes or types "
                                                 r"\(3x8x8 torch.float32 from source 0 \(TensorDataset\), 3x4x4 "
                                                 r"torch.float32 from source 1 \(TensorDataset\)\)"):
        mix[np.arange(8)]


# --- the command line: --mix ------------------------------------------------------------------


def test_bench_and_tune_take_a_mix_of_converted_datasets(two_converted, tmp_path, capsys):
    from fastdata.cli import main

    npy = convert_to(two_converted[0], tmp_path, "npy", "raw")
    tar = convert_to(two_converted[1], tmp_path / "b", "tar", "raw")
    assert main(["bench", "--mix", f"{npy}:3,{tar}:1", "--num-workers", "0", "--backends", "thread", "--epochs", "1",
                 "--warmup", "0", "--batch-size", "4", "--out", str(tmp_path / "bo"), "--json", "--quiet",
                 "--memory-s", "0"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["source"] == f"--mix {npy}:3,{tar}:1"
    assert {row["num_workers"] for row in document["rows"]} == {0} and all(row["samples_per_s"] > 0
                                                                            for row in document["rows"])
    assert main(["tune", "--mix", f"{npy}:3,{tar}:1", "--batch-size", "4", "--budget-s", "5", "--backends", "thread",
                 "--json"]) == 0
    recommendation = json.loads(capsys.readouterr().out)
    assert recommendation["conversion"] == {"skipped": "the source is a mix of converted datasets"}


@pytest.mark.parametrize("as_file", [False, True], ids=["pairs", "json"])
def test_bench_on_a_mix_prints_the_python_that_builds_it(two_converted, tmp_path, capsys, monkeypatch, as_file):
    from fastdata.cli import main

    monkeypatch.chdir(tmp_path)
    npy = convert_to(two_converted[0], tmp_path, "npy", "raw").relative_to(tmp_path)
    tar = convert_to(two_converted[1], tmp_path / "b", "tar", "raw").relative_to(tmp_path)
    spec = f"{npy}:3,{tar}:1"
    if as_file:
        (tmp_path / "mix.json").write_text(json.dumps({"datasets": [{"path": str(npy), "weight": 3},
                                                                    {"path": str(tar), "weight": 1}], "seed": 5}))
        spec = "mix.json"
    assert main(["bench", "--mix", spec, "--num-workers", "0", "--backends", "thread", "--epochs", "1", "--warmup",
                 "0", "--batch-size", "4", "--out", "bo", "--quiet", "--memory-s", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(f"how, for --mix {spec}:")
    seed = ", seed=5" if as_file else ""
    assert lines[start + 1:start + 3] == [
        "  import fastdata, torch",
        f'  ds = fastdata.mix([fastdata.MemmapDataset("{npy}"), fastdata.TarIndexedDataset("{tar}")], [3, 1]{seed})']
    assert lines[start + 3].startswith("  loader = ")  # fastdata's or the DataLoader, whichever was faster
    namespace: dict = {}
    exec("\n".join(line.strip() for line in lines[start + 1:start + 4]), namespace)  # the user's Python runs
    built, opened = namespace["ds"], open_mix(spec)
    assert (len(built), built.seed, built.weights.tolist()) == (len(opened), opened.seed, opened.weights.tolist())
    assert [image.tolist() for image, _ in built] == [image.tolist() for image, _ in opened]


@pytest.mark.parametrize(("args", "message"), [
    (["bench", "--mix", "a.npy"], "Invalid --mix entry 'a.npy' in 'a.npy'. Use PATH:WEIGHT pairs, comma-separated, "
                                  "with weights >= 0, e.g. --mix a.npy:3,b-shards:1."),
    (["tune", "--mix", "a.npy:1"], "Invalid --mix 'a.npy:1': it names one dataset. Give two or more PATH:WEIGHT pairs "
                                   "(or benchmark the one dataset as SOURCE)."),
    (["tune", "--mix", "a.npy:x,b:1"], "Invalid --mix entry 'a.npy:x' in 'a.npy:x,b:1'. Use PATH:WEIGHT pairs, "
                                       "comma-separated, with weights >= 0, e.g. --mix a.npy:3,b-shards:1."),
    (["tune", "--mix", "nowhere:1,b:1"], "--mix: 'nowhere' is not a converted dataset. Convert it first (fastdata "
                                         "convert nowhere OUT --format npy), then mix the output."),
    (["tune", "x", "--mix", "a:1,b:1"], "Give a SOURCE to tune (image folder, torchvision:NAME, converted dataset, "
                                        "module:name) or --mix PATH:WEIGHT,..., not both."),
    (["bench", "x", "--mix", "a:1,b:1"], "Give a SOURCE or --mix PATH:WEIGHT,..., not both."),
])
def test_a_bad_mix_on_the_command_line_is_one_line(args, message, capsys, tmp_path, monkeypatch):
    from fastdata.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(args) != 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"fastdata: error: {message}"


def test_a_mix_file_gives_paths_weights_length_and_seed(two_converted, tmp_path):
    from fastdata.cli.mixing import open_mix

    npy = convert_to(two_converted[0], tmp_path / "data", "npy", "raw")
    tar = convert_to(two_converted[1], tmp_path / "data" / "b", "tar", "raw")
    spec = tmp_path / "data" / "mix.json"
    spec.write_text(json.dumps({"datasets": [{"path": Path(npy).relative_to(spec.parent).as_posix(), "weight": 3},
                                             {"path": str(tar), "weight": 1}], "length": 20, "seed": 5}))
    mixed = open_mix(str(spec))
    assert (len(mixed), mixed.seed, mixed.weights.tolist(), mixed.lengths.tolist()) == (20, 5, [3.0, 1.0], [7, 3])
    assert [type(d).__name__ for d in mixed.datasets] == ["MemmapDataset", "TarIndexedDataset"]
    assert mixed.counts.tolist() == [15, 5]


@pytest.mark.parametrize(("document", "problem"), [
    ('{"datasets": [{"path": "a.npy"}]}', "'datasets' names fewer than two datasets"),
    ('{"datasets": [{"path": "a.npy"}, {"path": "b", "weight": -1}]}',
     'dataset 1 ({"path": "b", "weight": -1}) is not {"path": STRING, "weight": NUMBER >= 0}'),
    ('{"datasets": [{"path": "a"}, {"path": "b"}], "length": 2.5}', "'length' is 2.5, not an integer >= 0"),
    ('{"datasets": [{"path": "a"}, {"path": "b"}], "epochs": 2}', "unknown key 'epochs'"),
    ('[1, 2]', "it is not a JSON object with a 'datasets' list"),
])
def test_a_bad_mix_file_is_one_line(document, problem, tmp_path, capsys, monkeypatch):
    from fastdata.cli import main

    monkeypatch.chdir(tmp_path)
    Path("mix.json").write_text(document)
    assert main(["tune", "--mix", "mix.json"]) != 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"fastdata: error: --mix: invalid mix file 'mix.json': {problem}. Write {{\"datasets\": [{{\"path\": \"a.npy\", "
        '"weight": 3}, {"path": "b-shards", "weight": 1}], "length": 100000, "seed": 0} (length and seed optional).')
