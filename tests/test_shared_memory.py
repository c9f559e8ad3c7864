"""Worker processes and /dev/shm: a /dev/shm too small for the batches (Docker's default 64 MB) is a
one-line error naming its free space, what was needed and the fix, never a SIGBUS or a hang, and
``num_workers="auto"`` falls back to threads; the sweep of segments left by killed processes
removes only those of its own PID namespace (/dev/shm shared across containers).

The small /dev/shm is a 16 MB tmpfs mounted over /dev/shm in a new mount namespace (``unshare``;
a user namespace too when not root); the other PID namespace is a real one (``unshare --pid``).
Where the system does not permit them the tests are skipped, saying so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import Dataset

import fastdata

CHECKOUT = Path(__file__).resolve().parents[1]
SMALL_SHM_MB = 16


def _namespace_flags() -> list[str]:
    return ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]


def in_small_shm(*command: str) -> list[str]:
    """``command`` run with a 16 MB tmpfs over /dev/shm (in a mount namespace of its own)."""
    mount = f'mount -t tmpfs -o size={SMALL_SHM_MB}m tmpfs /dev/shm && exec "$@"'
    return ["unshare", *_namespace_flags(), "sh", "-c", mount, "sh", *command]


def _skip_unless_permitted(command: list[str], what: str) -> None:
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        pytest.skip(f"{what} needs Linux's unshare")
    probe = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"{what}: not permitted here ({probe.stderr.strip() or probe.returncode})")


def run_python(command: list[str], script: str, *args: str, timeout: float = 300) -> dict:
    """Run ``script`` with this checkout's fastdata under ``command`` (a prefix); its JSON output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([*command, sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


class Photos(Dataset):
    """160 RGB 224x224 images: image i is all (i % 251), label i % 3 (a batch of 32 is 4.6 MB)."""

    def __len__(self) -> int:
        return 160

    def __getitem__(self, index: int):
        return np.full((224, 224, 3), index % 251, np.uint8), index % 3


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shm") / "photos.npy"
    fastdata.convert(Photos(), str(out), format="npy")
    return out


SMALL_SHM_SCRIPT = """
    import json, sys
    import fastdata
    from fastdata.errors import SharedMemoryFullError
    from fastdata.loading import shm
    from fastdata.machine import populate

    dataset = fastdata.open_dataset(sys.argv[1])
    results = {}

    def ids(batches):
        return [batch[0][:, 0, 0, 0].tolist() for batch in batches]

    def first_error(backend):
        # timeout: a batch that never comes is an error here, not a hang
        loader = fastdata.loader(dataset, batch_size=32, shuffle=False, backend=backend, num_workers=2, timeout=60)
        try:
            for _ in loader:
                pass
        except Exception as exc:
            cause = exc if isinstance(exc, SharedMemoryFullError) else exc.__cause__
            line = str(cause).strip().splitlines()[-1].split("SharedMemoryFullError: ", 1)[-1]
            return [type(exc).__name__, type(cause).__name__, line]
        finally:
            getattr(loader, "close", lambda: None)()
        return None

    results["process"] = first_error("process")
    results["torch"] = first_error("torch")
    serial = fastdata.loader(dataset, batch_size=32, seed=1, num_workers=0)
    expected = [ids(serial) for _ in range(2)]
    for backend, start in (("auto", "process"), ("torch", "torch")):
        auto = fastdata.loader(dataset, batch_size=32, seed=1, num_workers="auto", backend=backend, timeout=60)
        state = auto.state_dict()  # start with worker processes, as after tuning
        state["tuned"] = {"backend": start, "num_workers": 2, "prefetch": 2}
        auto.load_state_dict(state)
        begun = [auto.setting.backend, auto.setting.num_workers]
        read = [ids(auto) for _ in range(2)]
        results["auto-" + backend] = {"begun": begun, "same": read == expected,
                                      "log": [[e["backend"], e["num_workers"], e["reason"]] for e in auto.tuning_log]}
        auto.close()
    from fastdata.loading import spares
    results["spare_bytes"] = [sum(size for _, size, _ in spares._spare), spares.spare_limit()]
    segment = shm.new_segment(32 << 20)  # more than /dev/shm holds (a new segment has no pages yet)
    try:
        if not populate(segment.address, 4096):  # a kernel without MADV_POPULATE_WRITE (before Linux 5.14)
            results["populate"] = "unsupported"
        else:
            populate(segment.address, 32 << 20)
            results["populate"] = None
    except SharedMemoryFullError as exc:
        results["populate"] = str(exc)
    finally:
        shm.release(segment, unlink=True)
    print(json.dumps(results))
"""

FULL = (r"/dev/shm has \d+ MB free, {what} needs \d+ MB: give the container more shared memory "
        r"\(docker run --shm-size=2g\), use fewer workers or smaller batches, or use backend='thread' "
        r"\(threads need no shared memory\)\.")


@pytest.fixture(scope="module")
def small_shm(photos: Path) -> dict:
    _skip_unless_permitted(in_small_shm("true"), f"a {SMALL_SHM_MB} MB /dev/shm (a mount namespace)")
    return run_python(in_small_shm(), SMALL_SHM_SCRIPT, str(photos))


def test_the_process_backend_says_dev_shm_is_too_small_instead_of_dying_of_sigbus(small_shm: dict) -> None:
    raised, cause, message = small_shm["process"]
    # refused before the first batch, counting every worker's slots (before: each worker's alone passed,
    # and a worker's write failed later: populate's error where the kernel has it, else SIGBUS)
    assert raised == cause == "SharedMemoryFullError"
    assert re.fullmatch(FULL.format(what=r"a loader of 2 workers \(2 slots of 4\.6 MB each\)"), message), message
    assert re.match(r"/dev/shm has 1[0-5] MB free, .* needs 19 MB", message), message


def test_a_fastdata_reader_on_the_torch_backend_says_dev_shm_is_too_small_instead_of_hanging(small_shm: dict) -> None:
    raised, cause, message = small_shm["torch"]
    assert raised == cause == "SharedMemoryFullError"
    assert re.fullmatch(FULL.format(what="a batch"), message), message


def test_populating_a_slot_that_dev_shm_cannot_hold_raises_instead_of_a_later_sigbus(small_shm: dict) -> None:
    if small_shm["populate"] == "unsupported":
        pytest.skip("this kernel cannot map a slot's pages ahead (MADV_POPULATE_WRITE: Linux 5.14+)")
    assert re.fullmatch(FULL.format(what="a batch").replace(r"needs \d+ MB", "needs 32 MB"), small_shm["populate"])


def test_the_full_message_rounds_the_free_space_down_and_what_is_needed_up() -> None:
    from fastdata.machine import shared_memory_full

    error = shared_memory_full(int(9.9 * 2**20), "a batch", free=int(9.6 * 2**20))
    assert type(error).__name__ == "SharedMemoryFullError"
    # before: "/dev/shm has 10 MB free, a batch needs 10 MB"
    assert str(error).startswith("/dev/shm has 9 MB free, a batch needs 10 MB: give the container ")
    assert str(shared_memory_full(1, "a batch", free=0)).startswith("/dev/shm has 0 MB free, a batch needs 1 MB: ")


@pytest.mark.parametrize(("backend", "fallen"), [("auto", ["thread", 2]), ("torch", ["torch", 0])])
def test_auto_falls_back_from_processes_when_dev_shm_is_too_small(small_shm: dict, backend: str, fallen: list) -> None:
    result = small_shm[f"auto-{backend}"]
    assert result["begun"][1] == 2 and result["same"]  # every sample of both epochs, once, in order
    first, *later = result["log"]
    assert first[:2] == fallen and first[2].startswith(f"num_workers 2 -> {fallen[1]} ({fallen[0]}): /dev/shm has ")
    assert all(entry[0] == fallen[0] and entry[1] <= fallen[1] for entry in later)  # processes never tried again


FULL_SHM_SCRIPT = """
    import json, multiprocessing, os
    import torch
    import fastdata
    from torch.utils.data import TensorDataset

    def fill(pages):  # /dev/shm full but for ``pages`` pages
        descriptor = os.open("/dev/shm/filler", os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
        try:
            while True:
                os.write(descriptor, bytes(65536))
        except OSError:
            pass
        size = os.fstat(descriptor).st_size
        os.ftruncate(descriptor, max(0, size - size % 4096 - 4096 * pages))
        os.close(descriptor)

    results = []
    for pages in range(12):  # from none left to room for a worker or two: where each start fails
        fill(pages)
        loader = fastdata.loader(TensorDataset(torch.arange(8)), batch_size=2, backend="process", num_workers=2)
        try:
            outcome = sum(1 for _ in loader)
        except Exception as exc:
            outcome = [type(exc).__name__, str(exc)]
        results.append([outcome, len(multiprocessing.active_children())])  # before close(): none left running
        loader.close()
    fill(0)
    auto = fastdata.loader(TensorDataset(torch.arange(8)), batch_size=2, seed=1, num_workers="auto")
    state = auto.state_dict()
    state["tuned"] = {"backend": "process", "num_workers": 2, "prefetch": 2}
    auto.load_state_dict(state)
    read = sorted(int(index) for batch in auto for index in batch[0])
    print(json.dumps({"process": results, "auto": [read, auto.tuning_log[0]["reason"]]}))
"""


def test_a_full_dev_shm_at_the_start_is_the_same_error_and_leaves_no_worker_running() -> None:
    _skip_unless_permitted(in_small_shm("true"), f"a {SMALL_SHM_MB} MB /dev/shm (a mount namespace)")
    result = run_python(in_small_shm(), FULL_SHM_SCRIPT)
    for outcome, running in result["process"]:  # before: OSError [Errno 28] (a semaphore), or workers left
        assert running == 0
        if outcome != 4:
            assert outcome[0] == "SharedMemoryFullError", outcome
            assert re.fullmatch(FULL.format(what=r"a worker's (pair of semaphores|control block)"), outcome[1])
    assert any(outcome != 4 and "semaphores" in outcome[1] for outcome, _ in result["process"])
    read, reason = result["auto"]
    assert read == list(range(8)) and reason.startswith("num_workers 2 -> 2 (thread): /dev/shm has 0 MB free, ")


OTHER_NAMESPACE_SCRIPT = """
    import os, sys
    from fastdata.loading import shm

    segment = shm.new_segment(4096)
    print(segment.name, os.getpid(), flush=True)
    sys.stdin.read()  # alive until the test closes stdin
    shm.release(segment, unlink=True)
"""


def _dead_pid() -> int:
    """A pid that no process of this namespace has."""
    limit = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(pid for pid in range(min(limit - 1, 300_000), 1000, -1) if not Path(f"/proc/{pid}").exists())


def test_the_sweep_leaves_the_live_segments_of_another_pid_namespace_alone(tmp_path: Path) -> None:
    from fastdata.loading import shm

    flags = ["--pid", "--fork", "--mount-proc"] + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])
    _skip_unless_permitted(["unshare", *flags, "true"], "another PID namespace (unshare --pid)")
    pid = _dead_pid()  # the other namespace's process gets this pid there; none has it here
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(OTHER_NAMESPACE_SCRIPT))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")])))
    command = f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid && {sys.executable} {script}"
    other = subprocess.Popen(["unshare", *flags, "sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        name, its_pid = other.stdout.readline().split()
        assert int(its_pid) == pid and shm.owner(name) == (shm.owner(name)[0], pid)
        assert shm.owner(name)[0] != shm.pid_namespace()
        dead_here = shm.new_segment(4096)  # a segment of this namespace's process `pid` (dead): swept
        shm.release(dead_here, unlink=False)
        stale = shm.segment_prefix(pid) + "0123456789ab"
        os.rename(Path("/dev/shm") / dead_here.name, Path("/dev/shm") / stale)
        assert name not in shm.stale_segments() and stale in shm.stale_segments()
        swept = shm.sweep_stale_segments()
        assert stale in swept and name not in swept
        assert (Path("/dev/shm") / name).exists() and not (Path("/dev/shm") / stale).exists()
    finally:
        _, stderr = other.communicate("", timeout=60)
    assert other.returncode == 0, stderr
    assert not (Path("/dev/shm") / name).exists()  # its owner removed it


def test_closed_loaders_keep_at_most_a_quarter_of_dev_shm_for_the_next(small_shm: dict) -> None:
    kept, limit = small_shm["spare_bytes"]
    assert limit == SMALL_SHM_MB * 2**20 // 4 and kept <= limit
