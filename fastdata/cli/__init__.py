"""The ``fastdata`` command line: convert, merge, info, verify, preview, bench, tune (one module per command).

Errors that fastdata raises on purpose print ``fastdata: error: <message>`` and exit 1,
without a traceback (set ``FASTDATA_TRACEBACK=1`` to see one). Ctrl-C exits 130 and SIGTERM
143, each with one line, after the same clean-up, at any moment: this module imports nothing
heavy, so the handlers are in place before torch loads, and a signal that arrives while torch
loads is acted on once it has (interrupting torch's native start-up can abort the process).
torch loads only once the arguments are parsed, for a command that reads samples: ``--version``,
``--help`` and ``info`` never import it (a command sets ``needs_torch=False`` to say so). Notes from the library (the
``fastdata`` logger, e.g. a capped ``--workers``) print as ``fastdata: <message>``.
"""

from __future__ import annotations

import _thread
import argparse
import logging
import os
import random
import signal
import sys
import threading
from typing import Any, Sequence

from fastdata._version import __version__
from fastdata.errors import ConversionInterrupted, FastdataError
from fastdata.cli.common import fetch_converted
from fastdata.urls import is_url, refuse_url

def build_parser() -> argparse.ArgumentParser:
    from fastdata.cli import bench, convert, inspect, merge, preview, tune
    from fastdata.cli.common import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="fastdata",
        description="Convert image datasets once into fast formats, and measure which format and "
        "DataLoader num_workers feed PyTorch fastest on this machine.",
        epilog="Examples:\n"
        "  fastdata convert ./photos out/photos.npy --resize 64x64\n"
        "  fastdata bench --demo\n"
        "  fastdata tune out/photos.npy --batch-size 256\n\n"
        "Run 'fastdata COMMAND --help' for a command's options and more examples.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"fastdata {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    convert.add_parser(commands)
    merge.add_parser(commands)
    bench.add_parser(commands)
    inspect.add_parsers(commands)
    preview.add_parser(commands)
    tune.add_parser(commands)
    return parser


_SIGNAL_WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
_received: list[int] = []
_main_pid: list[int] = []
_caught: list[bool] = []
_deferring: list[bool] = []
_previous_unraisablehook: list[Any] = []
_timers: list[threading.Timer] = []
# a dropped interrupt is sent again after a random wait in this range: the code that dropped it has
# returned, and a loop that runs such code at a steady pace is met at a new phase of it each time
_SEND_AGAIN_S = (0.01, 0.06)


def _on_signal(signum: int, frame: Any) -> None:
    """SIGINT and SIGTERM unwind the command as KeyboardInterrupt, so its clean-up runs.

    Until :func:`main` has caught one, every signal raises again: Python drops an exception
    raised where it cannot propagate (a ``__del__``, an at-fork hook), and a lost SIGTERM would
    let the command run on. A child process that inherited this handler (a pool or DataLoader
    worker) gets the default behaviour back instead: its parent does the clean-up."""
    if _main_pid and os.getpid() != _main_pid[0]:
        if signum == signal.SIGTERM:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return
    _received.append(signum)
    if not _caught and not _deferring:
        raise KeyboardInterrupt


def _on_unraisable(unraisable: Any) -> None:
    """A KeyboardInterrupt that :func:`_on_signal` raised where Python drops exceptions (a weakref
    callback, a ``__del__``: h5py and the pool run Python there) is sent again to the main thread
    shortly after, from a timer thread, once that code has returned: the command stops as if the
    first had arrived elsewhere (without it, the conversion ran to its end and exited 0, after a
    traceback). If the signal lands in such code again, it is sent again. Any other dropped
    exception goes to the hook that was there before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received and not _caught \
            and _main_pid and os.getpid() == _main_pid[0]:
        _deferring.append(True)  # a signal while the timer starts is only recorded: the timer's comes after
        try:
            timer = threading.Timer(random.uniform(*_SEND_AGAIN_S), _send_again,
                                    (threading.main_thread().ident, _received[0]))
            timer.daemon = True
            _timers.append(timer)
            timer.start()
        finally:
            _deferring.pop()
        return
    _previous_unraisablehook[0](unraisable)


def _send_again(thread_id: int, signum: int) -> None:
    """The timer's half of :func:`_on_unraisable`: the signal again, unless :func:`main` has caught one."""
    if not _caught:
        if hasattr(signal, "pthread_kill"):
            signal.pthread_kill(thread_id, signum)
        else:
            _thread.interrupt_main(signum)


def _stop_timers() -> None:
    """No signal is sent again once :func:`main` is done (the handlers it restores would raise it)."""
    for timer in _timers:
        timer.cancel()
        timer.join()
    _timers.clear()


def _import_heavy_modules() -> None:
    """Import torch and numpy with SIGINT/SIGTERM held back until they are loaded.

    An exception raised inside torch's native start-up can abort the interpreter (SIGABRT
    from C++) or leave CPython's "unhandled KeyboardInterrupt" flag set, so the process
    dies of SIGINT after printing its message; an import is also never retried cleanly
    ("cannot load module more than once"). A signal received meanwhile is acted on as soon
    as the import returns."""
    _deferring.append(True)
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    finally:
        _deferring.clear()
    if _received and not _caught:
        raise KeyboardInterrupt


def _check_torch_pair() -> None:
    """One line up front when torchvision's compiled operators do not load with this torch (a pair
    installed apart): the versions look unpaired (cheap), and importing torchvision confirms it.
    What needs torchvision then fails with the same line (:func:`fastdata.extras.require`)."""
    from fastdata.extras import torchvision_problem, torchvision_suspect

    _deferring.append(True)  # torchvision's native start-up, as torch's: see _import_heavy_modules
    try:
        problem = torchvision_problem() if torchvision_suspect() else None
    finally:
        _deferring.clear()
    if _received and not _caught:
        raise KeyboardInterrupt
    if problem:
        logging.getLogger("fastdata").warning(
            f"{problem} Until then, what uses torchvision fails (torchvision: sources, bench --resize/--transform, "
            "fields such as boxes and masks).")


def _forget_escaped_interrupt() -> None:
    """CPython remembers a KeyboardInterrupt that escaped any nested ``PyRun_*`` call (native
    code in torch and torchvision runs Python that way while it loads) and then ends the process
    by SIGINT, whatever ``main()`` returned: exit -2 instead of 130, after the clean-up and the
    message. Running one trivial statement the same way resets that flag."""
    try:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"pass")
    except (AttributeError, OSError):  # not CPython: no such flag
        pass


def _install_signal_handlers() -> dict[int, Any]:
    _received.clear()
    _caught.clear()
    _deferring.clear()
    _main_pid[:] = [os.getpid()]
    try:
        previous = {signum: signal.signal(signum, _on_signal) for signum in _SIGNAL_WORDS}
    except ValueError:  # not the main thread (main() called from a thread): leave them alone
        return {}
    if sys.unraisablehook is not _on_unraisable:
        _previous_unraisablehook[:] = [sys.unraisablehook]
        sys.unraisablehook = _on_unraisable
    return previous


def _configure_logging() -> None:
    logger = logging.getLogger("fastdata")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fastdata: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    previous = _install_signal_handlers()
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:
        _caught.append(True)
        signum = _received[0] if _received else signal.SIGINT
        kept = f"; {exc}." if isinstance(exc, ConversionInterrupted) else ""  # the partial output, for --resume
        print(f"fastdata: {_SIGNAL_WORDS[signum]}{kept}", file=sys.stderr)
        _forget_escaped_interrupt()
        return 128 + signum
    except BrokenPipeError:  # e.g. 'fastdata info ... | head': the reader left; end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        _caught.append(True)  # from here on a signal is only recorded
        _stop_timers()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if previous and sys.unraisablehook is _on_unraisable:
            sys.unraisablehook = _previous_unraisablehook[0]


_WRITTEN_PATHS = ("output", "out")  # paths a command writes: a URL is refused, never made a local path


def _is_remote_table(url: str) -> bool:
    from fastdata.sources.parquet import is_remote_table

    return is_remote_table(url)


def _main(argv: Sequence[str] | None) -> int:
    _configure_logging()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)  # --version and --help end here, before torch would load
        if getattr(args, "needs_torch", True):  # a command that reads samples: not info
            _import_heavy_modules()
            _check_torch_pair()
        for role in _WRITTEN_PATHS:
            if not (role == "output" and args.command in ("convert", "merge")  # these upload to a URL
                    or role == "out" and args.command == "bench"):
                refuse_url(getattr(args, role, None), role.upper())
        if is_url(getattr(args, "source", None)) and not (args.command == "convert" and _is_remote_table(args.source)):
            # bench, tune, convert: a converted dataset, fetched first (Parquet files are read where they are)
            args.source_url = args.source  # bench reads it from the URL too, beside the local copy
            args.source = str(fetch_converted(args.source, cold=getattr(args, "cache", "warm") == "cold"))
        return args.run(args)
    except FastdataError as exc:
        if os.environ.get("FASTDATA_TRACEBACK"):
            raise
        print(f"fastdata: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
