"""Workers that exit behind the training loop (the ``torch`` backend's stop at the end of an
epoch, the ``process`` backend's) interrupt none of the loop's system calls: their SIGCHLD, which
the DataLoader's handler catches, restarts a blocking call instead of failing it with EINTR, which
C code need not retry (torch's shared-memory manager start spins forever on one)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import fastdata
from conftest import finish, pattern, save

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGCHLD"), reason="no SIGCHLD")


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("child_exit")
    for i in range(16):
        save(Image.fromarray(pattern(8, 6, seed=i)), root / "src" / ("a" if i % 2 else "b") / f"{i:02d}.png")
    fastdata.convert(root / "src", root / "raw.npy", workers=0)
    return root / "raw.npy"


# A C-level read of a pipe in the main thread while another thread sends the process SIGCHLD and,
# a moment later, writes one byte: the byte count read, or -errno.
READ_SCRIPT = """
import ctypes, os, signal, sys, threading, time
import torch
import fastdata

libc = ctypes.CDLL(None, use_errno=True)

def c_read_through_sigchld():
    r, w = os.pipe()
    def poke():
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGCHLD)
        time.sleep(0.3)
        os.write(w, b"x")
    threading.Thread(target=poke).start()
    got = libc.read(r, ctypes.create_string_buffer(1), 1)
    return got if got >= 0 else -ctypes.get_errno()

for _ in torch.utils.data.DataLoader(range(4), num_workers=1):  # installs the DataLoader's SIGCHLD handler
    pass
print("after a DataLoader", c_read_through_sigchld(), flush=True)
ds = fastdata.open_dataset(sys.argv[1])
for _ in fastdata.loader(ds, batch_size=4, num_workers=2, backend=sys.argv[2]):
    pass
print("after fastdata", c_read_through_sigchld(), flush=True)
"""


@pytest.mark.parametrize("backend", ["torch", "process"])
def test_a_sigchld_restarts_a_blocking_call_once_workers_exit_behind_the_loop(raw: Path, tmp_path: Path,
                                                                             backend: str) -> None:
    script = tmp_path / "read.py"
    script.write_text(READ_SCRIPT)
    process = subprocess.Popen([sys.executable, str(script), str(raw), backend], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    stdout, stderr = finish(process, what="the read script")
    assert (process.returncode, stderr) == (0, "")
    # the DataLoader's handler alone lets the signal fail the read (EINTR: 4); after fastdata's
    # workers exited behind the loop, the read is restarted and returns the byte
    assert stdout == "after a DataLoader -4\nafter fastdata 1\n"


FIRST_SHARE_SCRIPT = """
import sys
import torch.multiprocessing
import fastdata

ds = fastdata.open_dataset(sys.argv[1])
for _ in fastdata.loader(ds, batch_size=2, num_workers=2, shuffle=True, seed=5):
    pass  # the workers are being stopped behind the loop when it ends
torch.multiprocessing.set_sharing_strategy("file_system")
torch.zeros(8).share_memory_()  # starts torch's shared-memory manager: a blocking read of a pipe
print("shared", flush=True)
"""


def test_the_first_file_system_share_after_an_epoch_does_not_hang(raw: Path, tmp_path: Path) -> None:
    """What hung: a worker's exit interrupted torch's read of its new manager's address, which it
    then retried forever without reading (about one run in three before the fix)."""
    script = tmp_path / "share.py"
    script.write_text(FIRST_SHARE_SCRIPT)
    for _ in range(3):
        process = subprocess.Popen([sys.executable, str(script), str(raw)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        stdout, stderr = finish(process, timeout=60, what="the script sharing by file name")
        assert (process.returncode, stdout, stderr) == (0, "shared\n", "")
