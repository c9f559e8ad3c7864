"""A saved loader state is checked field by field before any of it is used: a damaged or edited
state either resumes correctly (what it says was read is not read again, the rest is read once) or
is refused in one line naming the field, never resumed in another order, never an internal error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings, strategies as st

import fastdata
from fastdata.errors import FastdataError, InvalidOptionError
from fastdata.loading.mix import Mix
from fastdata.loading.order import Layout, epoch_sequence, layout_of
from fastdata.loading.samplers import BatchIndexSampler, epoch_indices

SAMPLES, BATCH = 30, 4
FIX = "Resume from a state as state_dict() saved it, or start the next epoch without it (loader.set_epoch(epoch))."
KEYS = ("version, seed, epoch, consumed, length, batch_size, drop_last, rank, world_size, even, order, earlier")


def make_loader(dataset=None):
    dataset = torch.utils.data.TensorDataset(torch.arange(SAMPLES)) if dataset is None else dataset
    return fastdata.loader(dataset, batch_size=BATCH, backend="thread", num_workers=0)


def saved_state(dataset=None) -> dict:
    """A real state: seed 3, three batches of epoch 1 handed out."""
    dataset = torch.utils.data.TensorDataset(torch.arange(SAMPLES)) if dataset is None else dataset
    loader = fastdata.loader(dataset, batch_size=BATCH, seed=3, backend="thread", num_workers=0)
    loader.set_epoch(1)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    return loader.state_dict()


@pytest.mark.parametrize(("change", "message"), [
    ({"batch_size": None}, "Invalid state: batch_size=None (allowed: an integer from 1 to 2**63 - 1 in a loader's "
                           f"state). {FIX}"),
    ({"batch_size": True}, f"Invalid state: batch_size=True (allowed: None or an integer from 1 to 2**63 - 1). {FIX}"),
    ({"batch_size": 4.0}, f"Invalid state: batch_size=4.0 (allowed: None or an integer from 1 to 2**63 - 1). {FIX}"),
    ({"consumed": "3"}, f"Invalid state: consumed='3' (allowed: an integer from 0 to 2**63 - 1). {FIX}"),
    ({"epoch": -1}, f"Invalid state: epoch=-1 (allowed: an integer from 0 to 2**63 - 1). {FIX}"),
    ({"seed": -1}, f"Invalid state: seed=-1 (allowed: an integer >= 0). {FIX}"),
    ({"even": 1}, f"Invalid state: even=1 (allowed: True or False). {FIX}"),
    ({"version": True}, f"Invalid state: version=True (allowed: an integer from 1 to 2). {FIX}"),
    ({"world_size": 0}, f"Invalid state: world_size=0 (allowed: an integer from 1 to 2**63 - 1). {FIX}"),
    ({"rank": 1}, f"Invalid state: rank=1 (allowed: an integer from 0 to world_size - 1 = 0). {FIX}"),
    ({"earlier": [[1, 0, True, False, 1]]},
     f"Invalid state: earlier[0] batch_size=0 (allowed: None or an integer from 1 to 2**63 - 1). {FIX}"),
    ({"earlier": [[1, 4, True, False]]}, "Invalid state: earlier[0]=[1, 4, True, False] (allowed: a list "
                                         f"[world_size, batch_size, even, drop_last, consumed]). {FIX}"),
    ({"earlier": "[]"}, "Invalid state: earlier='[]' (allowed: a list of at most 16 [world_size, batch_size, even, "
                        f"drop_last, consumed] lists). {FIX}"),
    ({"dataset": {"seed": 1}}, "Invalid state: dataset={'seed': 1} (allowed: None or a mix's {'seed': ..., "
                               f"'digest': ...}}). {FIX}"),
    ({"tuned": {"backend": "thread", "num_workers": "2", "prefetch": 2}},
     f"Invalid state: tuned num_workers='2' (allowed: an integer from 0 to 2**63 - 1). {FIX}"),
    ({"shuffle": True}, f"Invalid state: it has the unknown key 'shuffle' (a version 2 state holds {KEYS}). "
                        "Resume from a state as state_dict() saved it."),
    ({"consumed": 9}, "Invalid state: consumed=9 of an epoch of 8 batches. Resume from a state as state_dict() saved it."),
    ({"earlier": [[1, 2, True, False, 16]]}, "Invalid state: earlier[0] consumed=16 of an epoch of 15 batches. "
                                             "Resume from a state as state_dict() saved it."),
], ids=lambda value: str(value)[:40])
def test_a_tampered_field_is_refused_in_one_line_naming_it(change, message):
    loader = make_loader()
    with pytest.raises(InvalidOptionError) as error:
        loader.load_state_dict({**saved_state(), **change})
    assert str(error.value) == message


@pytest.mark.parametrize("key", ["batch_size", "length", "order", "earlier", "world_size", "even"])
def test_a_missing_key_is_refused(key):
    state = saved_state()
    del state[key]
    with pytest.raises(InvalidOptionError) as error:
        make_loader().load_state_dict(state)
    assert str(error.value) == (f"Invalid state: it has no {key!r} (a version 2 state holds {KEYS}). Resume from a "
                                "state as state_dict() saved it.")


def test_numpy_integers_in_a_state_are_integers():
    """``loader.set_epoch(np.int64(e))`` (a loop over ``np.arange``) saves a numpy epoch: it resumes."""
    state = {**saved_state(), "epoch": np.int64(1), "consumed": np.int64(3)}
    loader = make_loader()
    loader.load_state_dict(state)
    assert [sorted(b.tolist()) for (b,) in loader] == expected_reads(saved_state())


def test_a_state_after_set_epoch_of_a_numpy_integer_goes_through_json():
    """``for epoch in np.arange(n): loader.set_epoch(epoch)`` saves a state of Python ints: a JSON
    checkpoint takes it, and it resumes where it was saved."""
    import json

    loader = make_loader()
    loader.set_epoch(np.int64(1))
    batches = iter(loader)
    read = [sorted(next(batches)[0].tolist()) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make_loader()
    resumed.load_state_dict(state)
    rest = [sorted(b.tolist()) for (b,) in resumed]
    assert state["epoch"] == 1 and len(rest) == 5
    assert sorted(sum(read + rest, [])) == list(range(SAMPLES))


@pytest.mark.parametrize("drop_last", [np.True_, 1])
def test_a_state_of_a_loader_given_a_truthy_drop_last_resumes_and_goes_through_json(drop_last):
    import json

    def make():
        return fastdata.loader(torch.utils.data.TensorDataset(torch.arange(SAMPLES)), batch_size=BATCH,
                               drop_last=drop_last, seed=3, backend="thread", num_workers=0)

    loader = make()
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [_values(batch) for batch in batches]
    resumed = make()
    resumed.load_state_dict(state)
    assert state["drop_last"] is True and [_values(batch) for batch in resumed] == rest and len(rest) == 4


@pytest.mark.parametrize("mixed", [False, True])
def test_a_seed_of_64_bits_or_more_resumes(mixed):
    """``seed=random.getrandbits(64)`` (half of them >= 2**63) and wider ones: their states resume."""
    seed = 2**64 + 5
    dataset = fastdata.mix([Codes(0), Codes(1000)], [2, 1], seed=seed) if mixed else None
    dataset = dataset if mixed else torch.utils.data.TensorDataset(torch.arange(SAMPLES))

    def make():
        return fastdata.loader(dataset, batch_size=BATCH, seed=seed, backend="thread", num_workers=0)

    loader = make()
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = loader.state_dict()
    rest = [_values(batch) for batch in batches]
    resumed = make()
    resumed.load_state_dict(state)
    assert state["seed"] == seed and [_values(batch) for batch in resumed] == rest and len(rest) == 5


@pytest.mark.parametrize("seed", [-1, 1.5, np.int64(-2)])
def test_a_negative_or_fractional_loader_seed_is_refused_at_build(seed):
    with pytest.raises(InvalidOptionError) as error:
        make_loader_with_seed(seed)
    assert str(error.value) == f"Invalid seed {seed!r}. Use an integer >= 0."


def make_loader_with_seed(seed):
    return fastdata.loader(torch.utils.data.TensorDataset(torch.arange(SAMPLES)), batch_size=BATCH, seed=seed,
                           backend="thread", num_workers=0)


@pytest.mark.parametrize("epoch", [-1, 2.0, "2", True, None])
def test_a_bad_epoch_is_refused_when_set(epoch):
    with pytest.raises(InvalidOptionError) as error:
        make_loader().set_epoch(epoch)
    assert str(error.value) == f"Invalid epoch {epoch!r}. Use an integer >= 0."


def test_a_list_of_states_is_checked_state_by_state():
    good = saved_state()
    with pytest.raises(InvalidOptionError, match=r"^Invalid state: epoch='0' \(allowed: an integer"):
        make_loader().load_state_dict([good, {**good, "epoch": "0"}])


class Codes(torch.utils.data.Dataset):
    """Sample ``i`` is ``base + i``."""

    supports_index_arrays = True

    def __init__(self, base: int = 0) -> None:
        self.base = base

    def __len__(self) -> int:
        return SAMPLES // 2

    def __getitem__(self, index):
        return torch.as_tensor(np.asarray(index) + self.base)


def test_a_mix_state_and_a_plain_one_are_not_taken_for_each_other():
    mix = fastdata.mix([Codes(), Codes(1000)], [1, 1])
    mix_state = make_loader(mix).state_dict()
    with pytest.raises(InvalidOptionError) as error:
        make_loader().load_state_dict(mix_state)
    assert str(error.value) == ("Cannot resume: the saved state is of a fastdata.mix, but this loader reads "
                                "TensorDataset. Build the loader over the mix it was saved with.")
    with pytest.raises(InvalidOptionError) as error:
        make_loader(mix).load_state_dict(saved_state())
    assert str(error.value) == ("Cannot resume: the saved state is not of a fastdata.mix (its 'dataset' is None or "
                                "missing), but this loader reads one. Resume over the dataset it was saved with.")
    with pytest.raises(InvalidOptionError, match=r"^Invalid state: dataset seed=True \(allowed: an integer"):
        make_loader(mix).load_state_dict({**mix_state, "dataset": {**mix_state["dataset"], "seed": True}})


# --- any crafted state: a correct resume or one line ----------------------------------------------

ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.sampled_from([2**63, 2**64, -2**63, 10**30]),
                st.floats(allow_nan=True), st.text(max_size=3), st.lists(st.integers(-1, 5), max_size=5),
                st.dictionaries(st.sampled_from(["seed", "digest", "backend", "num_workers", "prefetch"]),
                                st.one_of(st.integers(-1, 3), st.text(max_size=2)), max_size=3))
STAGE = st.tuples(st.integers(0, 4), st.one_of(st.none(), st.integers(0, 6), st.booleans()), st.booleans(),
                  st.booleans(), st.integers(-1, 9)).map(list)
VALUES = {"seed": st.integers(0, 5), "epoch": st.integers(0, 3), "consumed": st.integers(-1, 10),
          "batch_size": st.one_of(st.none(), st.integers(0, 7)), "world_size": st.integers(0, 4),
          "rank": st.integers(-1, 4), "even": st.booleans(), "drop_last": st.booleans(),
          "earlier": st.lists(st.one_of(STAGE, ODD), max_size=3), "version": st.integers(0, 3),
          "length": st.sampled_from([SAMPLES, SAMPLES - 1]), "order": st.sampled_from(["permutation", "sequential"])}
KEYS_TO_CHANGE = [*VALUES, "backend", "dataset", "tuned", "bogus"]
CHANGE = st.one_of(
    st.tuples(st.just("drop"), st.sampled_from(KEYS_TO_CHANGE), st.none()),
    st.tuples(st.just("set"), st.sampled_from(KEYS_TO_CHANGE), ODD),
    st.sampled_from(list(VALUES)).flatmap(lambda key: st.tuples(st.just("set"), st.just(key), VALUES[key])),
)


def expected_reads(state: dict) -> list[list[int]]:
    """What a correct resume reads of the state's epoch: what the old job's layouts left, cut into batches."""
    stages = [layout_of(entry) for entry in state.get("earlier", [])]
    saved = Layout(state["world_size"], state["batch_size"], state["even"], state["drop_last"])
    if state["consumed"]:
        stages.append((saved, state["consumed"]))
    order = BatchIndexSampler(SAMPLES, BATCH, seed=state["seed"]).order(state["epoch"])
    left = epoch_sequence(order, stages).tolist()
    return [sorted(left[i:i + BATCH]) for i in range(0, len(left), BATCH)]


def _samples(dataset, batches: list[list[int]], epoch: int) -> list[list[int]]:
    """The samples (sorted per batch) that batches of positions read: a mix's through its order."""
    if not isinstance(dataset, Mix):
        return batches
    return [sorted(dataset[epoch_indices(np.array(batch, dtype=np.int64), epoch)].tolist()) for batch in batches]


def _values(batch) -> list[int]:
    return sorted((batch[0] if isinstance(batch, (list, tuple)) else batch).tolist())


@pytest.mark.parametrize("kind", ["tensors", "mix"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(changes=st.lists(CHANGE, min_size=1, max_size=3))
def test_any_crafted_state_resumes_correctly_or_is_refused_in_one_line(kind, changes):
    dataset = fastdata.mix([Codes(0), Codes(1000)], [2, 1], seed=4) if kind == "mix" else None
    state = saved_state(dataset)
    for action, key, value in changes:
        if action == "drop":
            state.pop(key, None)
        else:
            state[key] = value
    loader = make_loader(dataset)
    try:
        loader.load_state_dict(state)
    except FastdataError as error:  # anything else (ZeroDivisionError, TypeError, ...) fails the test
        assert "\n" not in str(error) and str(error).endswith(".")
        event("refused")
        return
    event("resumed")
    resumed = [_values(batch) for batch in loader]
    assert resumed == _samples(loader.dataset, expected_reads(state), state["epoch"])
    whole = sorted(i for batch in loader for i in _values(batch))  # the next epoch, whole
    assert whole == sorted(i for b in _samples(loader.dataset, [list(range(SAMPLES))], state["epoch"] + 1) for i in b)
