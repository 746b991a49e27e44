"""What a run costs the machine: memory per context and for the process, and thermal and clock figures.

:func:`memory_figures` gathers, for the target's context (and the drafter's, when it has one): the
cache bytes by kind (full attention, sliding window, recurrent state), the saved states held for
rollbacks and their count, and the model's weight bytes (:class:`~specviz.backends.memory.MemoryInfo`,
measured from llama.cpp's own serialisation when the context was made); and the process's resident
and peak resident memory (``/proc/self/statm``, ``getrusage``).

:class:`MachineSampler` samples, at most every :attr:`MachineSampler.every` seconds, the temperatures
of ``/sys/class/thermal/thermal_zone*/temp`` and the clocks of
``/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq``, and reports their minimum, mean and maximum
over the run, and the system's load average (:func:`~specviz.decoding.machine_load.load_average`) when the run
began and at the latest sample. Where the machine exposes neither, the figures say ``"not available"`` and
why — never a made-up number.
"""

from __future__ import annotations

import glob
import os
import resource
import time
from typing import TYPE_CHECKING, Any

from .machine_load import load_average

if TYPE_CHECKING:
    from ..backends.llama import LlamaContext
    from ..backends.memory import MemoryInfo

__all__ = [
    "NOT_AVAILABLE",
    "process_memory",
    "context_memory",
    "memory_figures",
    "memory_view",
    "MemoryView",
    "MachineSampler",
    "MachineView",
]

#: What a figure the machine does not expose says instead of a number.
NOT_AVAILABLE = "not available"

_THERMAL_GLOB = "/sys/class/thermal/thermal_zone*/temp"
_FREQ_GLOB = "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"


class _Statm:
    """``/proc/self/statm`` kept open and read at most every :attr:`every` seconds (between reads the last
    figure stands): a ``pread`` right after a decode cost a tenth of a millisecond, a third of a greedy
    round's bookkeeping, for a figure that a person reads a few times a second at most."""

    every = 0.2

    def __init__(self) -> None:
        self.pid = -1
        self.fd = -1
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.at = -1.0
        self.bytes: int | None = None

    def resident(self) -> int | None:
        """The resident bytes as of the last read (at most :attr:`every` seconds old), or None where
        ``/proc`` is missing."""
        now = time.monotonic()
        if self.at >= 0 and now - self.at < self.every:
            return self.bytes
        self.at = now
        self.bytes = self._read()
        return self.bytes

    def forget(self) -> None:
        """Read afresh next time (a forked child: the last figure was its parent's)."""
        self.at = -1.0

    def _read(self) -> int | None:
        pid = os.getpid()
        if self.pid != pid:  # first use, or a forked child: the file describes the process that opened it
            self.pid, self.fd = pid, -1
            try:
                self.fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return None
        if self.fd < 0:
            return None
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) * self.page
        except (OSError, ValueError, IndexError):
            return None


_statm = _Statm()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_statm.forget)


class _Peak:
    """The kernel's peak resident size (``getrusage``), asked at most every :attr:`every` seconds: right
    after a decode the call costs a round's worth of specviz's other work, and the peak it reports moves
    rarely. Between asks the resident sizes read every round raise it (see :func:`process_memory`)."""

    every = 0.5

    def __init__(self) -> None:
        self.at = -1.0
        self.bytes = 0

    def get(self) -> int:
        now = time.monotonic()
        if now - self.at >= self.every or self.at < 0:
            self.at = now
            self.bytes = max(self.bytes, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB on Linux
        return self.bytes


_peak = _Peak()


def process_memory() -> dict[str, int | None]:
    """The process's resident bytes (read at most every 0.2 s; None where ``/proc`` is missing) and its
    peak resident bytes (the kernel's, asked at most twice a second, and never below any resident size
    read here)."""
    rss = _statm.resident()
    peak = _peak.get()
    if rss is not None and rss > peak:  # the kernel updates its peak lazily
        peak = _peak.bytes = rss
    return {"rss_bytes": rss, "peak_rss_bytes": peak}


def context_memory(ctx: LlamaContext) -> dict[str, Any]:
    """One context's memory: its facts (kind, bytes by part) and the saved states it holds now."""
    mem = ctx.memory
    return _context_figures(mem.info, len(mem.marks), mem.marks_bytes)


def _context_figures(info: MemoryInfo, marks: int, marks_bytes: int) -> dict[str, Any]:
    d = info.to_dict()
    d["marks"] = marks
    d["marks_bytes"] = marks_bytes
    return d


def memory_figures(target: LlamaContext, draft: LlamaContext | None = None) -> dict[str, Any]:
    """The memory telemetry of a session: the target context's, the draft context's (None without one)
    and the process's."""
    return memory_view(target, draft)()


def memory_view(target: LlamaContext, draft: LlamaContext | None = None) -> MemoryView:
    """:func:`memory_figures` as of now, built when called (see :class:`MemoryView`)."""
    return MemoryView(target, draft)


class MemoryView:
    """:func:`memory_figures` as of when it was made, built when called: what changes (the saved states
    held, the process's memory) is read when it is made, the rest (each context's
    :class:`~specviz.backends.memory.MemoryInfo`, fixed when the context was made) when it is called.

    One object with slots rather than a closure: every round's telemetry event holds one for as long as
    the session keeps its events, and a closure is a function, its cells and their tuple, each of which
    the garbage collector walks on every full collection (see :class:`~specviz.decoding.telemetry.TelemetryView`).
    """

    __slots__ = ("held", "proc")

    def __init__(self, target: LlamaContext, draft: LlamaContext | None = None) -> None:
        self.held = tuple(
            (c.memory.info, len(c.memory.marks), c.memory.marks_bytes) if c is not None else None
            for c in (target, draft)
        )
        self.proc = process_memory()

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, h in zip(("target", "draft"), self.held):
            out[name] = _context_figures(*h) if h is not None else None
        out.update(self.proc)
        return out


def _read_numbers(paths: list[str]) -> list[float]:
    vals = []
    for path in paths:
        try:
            with open(path) as f:
                vals.append(float(f.read().strip()))
        except (OSError, ValueError):
            continue
    return vals


class MachineSampler:
    """Thermal and CPU-clock figures over a run, sampled at round boundaries (at most every ``every``
    seconds). ``thermal_glob`` / ``freq_glob`` name the files read (kept apart for tests)."""

    every = 0.5

    def __init__(self, thermal_glob: str = _THERMAL_GLOB, freq_glob: str = _FREQ_GLOB) -> None:
        self.thermal_glob = thermal_glob
        self.freq_glob = freq_glob
        self.reset()

    def reset(self) -> None:
        """Forget the samples (a new run begins) and take a first one."""
        self.temps: list[float] = []  # hottest zone per sample, degrees Celsius
        self.clocks: list[float] = []  # mean clock over the CPUs per sample, MHz
        self.load_start = self.load_latest = load_average()  # 1, 5, 15 minutes; None where not reported
        self._last = 0.0
        # the sensor files, found once a run (listing the folders each sample cost more than reading them)
        self._thermal = sorted(glob.glob(self.thermal_glob))
        self._freq = sorted(glob.glob(self.freq_glob))
        self.sample(force=True)

    def sample(self, force: bool = False) -> None:
        """Read the sensors unless the last sample is younger than :attr:`every` seconds."""
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        self.load_latest = load_average()
        temps = _read_numbers(self._thermal)
        if temps:
            self.temps.append(max(temps) / 1000.0)  # millidegrees
        clocks = _read_numbers(self._freq)
        if clocks:
            self.clocks.append(sum(clocks) / len(clocks) / 1000.0)  # kHz

    def figures(self) -> dict[str, Any]:
        """Minimum, mean and maximum of each figure over the samples, or ``"not available"`` and why."""
        return self.view()()

    def view(self) -> MachineView:
        """:meth:`figures` over the samples taken so far, built when called (see :class:`MachineView`)."""
        return MachineView(self)

    def figures_of(
        self,
        temps: list[float],
        clocks: list[float],
        load: tuple[tuple[float, ...] | None, tuple[float, ...] | None] = (None, None),
    ) -> dict[str, Any]:
        """:meth:`figures` over the samples given (those of a :class:`MachineView`); ``load`` is the load
        average at the run's start and at the latest sample."""

        def summary(xs: list[float], what: str, where: str) -> dict[str, Any]:
            if not xs:
                return {"available": False, "value": NOT_AVAILABLE, "why": f"this machine exposes no {what} ({where})"}
            return {
                "available": True,
                "min": min(xs),
                "mean": sum(xs) / len(xs),
                "max": max(xs),
                "samples": len(xs),
            }

        return {
            "thermal_c": summary(temps, "thermal zones", self.thermal_glob),
            "cpu_mhz": summary(clocks, "CPU clock readings", self.freq_glob),
            "load_average": {"start": _listed(load[0]), "latest": _listed(load[1])},
        }


def _listed(load: tuple[float, ...] | None) -> list[float] | None:
    return list(load) if load is not None else None


class MachineView:
    """A :class:`MachineSampler`'s figures over the samples taken when it was made, built when called. The
    sample lists only grow until :meth:`MachineSampler.reset` replaces them, so the view keeps the lists
    and their lengths, not copies; one object with slots for the reason :class:`MemoryView` gives."""

    __slots__ = ("sampler", "temps", "clocks", "n_temps", "n_clocks", "load")

    def __init__(self, sampler: MachineSampler) -> None:
        self.sampler = sampler
        self.temps, self.clocks = sampler.temps, sampler.clocks
        self.n_temps, self.n_clocks = len(self.temps), len(self.clocks)
        self.load = (sampler.load_start, sampler.load_latest)

    def __call__(self) -> dict[str, Any]:
        return self.sampler.figures_of(self.temps[: self.n_temps], self.clocks[: self.n_clocks], self.load)
