"""Whole child processes, timed as a user meets them: wall time from start to exit, exit code,
output, and the peak memory of the process tree.

:func:`run_process` starts a command in a session (and process group) of its own, writes its
stdout and stderr to files, and waits for it with ``os.wait4``. Meanwhile a sampler thread
reads ``/proc`` every :data:`SAMPLE_S` seconds (under a millisecond a scan here) and follows the
*tree*: the process, everything in its process group, and every descendant of those (Spark's
Python worker daemon moves to a process group of its own, so the group alone would miss it).
Three memory figures come out, all in KiB:

``tree_peak_kib``
    the largest sum of ``VmRSS`` over the tree at one sample: what the machine had to hold
    (pages shared between processes, such as forked Python workers, count once per process;
    a peak shorter than a sample interval can be missed).
``largest_kib``
    the largest ``VmHWM`` (a process's own high-water mark) of any one process in the tree,
    as last read before it exited: usually the Spark JVM.
``wait4_maxrss_kib``
    ``ru_maxrss`` from ``os.wait4``: the largest of the child and the descendants it reaped
    itself. Only an upper bound of the child's own peak (Linux carries the launching process's
    peak RSS into it across ``exec``, see ``benchmarks/rss.py``), and blind to a JVM that
    its Python process never reaps.

The same samples read each process's CPU time (``/proc/<pid>/stat``) and, every
:data:`THREADS_EVERY` samples, a JVM's threads' (``/proc/<pid>/task/*/stat``), for
``cpu_seconds``: the tree's CPU by part (:func:`cpu_parts`), where a cold Spark process spends
it (its JIT compilers, its garbage collector, Spark's tasks, the rest of the JVM, everything
that is not a JVM). A process's last reading counts, so a process or thread that ends between
two samples loses at most one interval of its time.

The wall time stops when ``os.wait4`` returns. After that, :func:`run_process` waits (untimed)
for the rest of the tree to exit, so that a JVM that outlives its Python process for a moment
cannot hold the next process's Derby metastore or CPU; past :data:`STRAGGLER_TIMEOUT_S` the
stragglers of that process group are killed and counted in ``stragglers``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_S = 0.2
THREADS_EVERY = 5
STRAGGLER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ProcessRun:
    """One finished child process: how long it took, how it ended, how much memory it held."""

    label: str
    command: tuple[str, ...]
    seconds: float
    returncode: int
    stdout_path: Path
    stderr_path: Path
    tree_peak_kib: int
    largest_kib: int
    wait4_maxrss_kib: int
    processes: int
    """Distinct processes seen in the tree."""
    stragglers: int = 0
    """Processes of its group still alive long after it exited (killed)."""
    cpu_seconds: Mapping[str, float] = field(default_factory=dict)
    """The tree's CPU time by part (:func:`cpu_parts`)."""

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def tail(self, lines: int = 25) -> str:
        """The last lines of stderr and stdout, for an error message."""
        parts = []
        for name, path in (("stderr", self.stderr_path), ("stdout", self.stdout_path)):
            text = path.read_text(errors="replace").strip().splitlines()[-lines:]
            if text:
                parts.append(f"--- {name} ({path}):\n" + "\n".join(text))
        return "\n".join(parts) or "(no output)"

    def check(self) -> ProcessRun:
        """Itself if it exited with 0; else a RuntimeError with its output's tail."""
        if self.returncode != 0:
            raise RuntimeError(
                f"{self.label}: `{' '.join(self.command)}` exited with {self.returncode} "
                f"after {self.seconds:.1f} s\n{self.tail()}"
            )
        return self


def run_process(
    command: Sequence[str],
    *,
    label: str,
    env: Mapping[str, str],
    cwd: Path | str,
    log_dir: Path | str,
    timeout: float | None = None,
) -> ProcessRun:
    """Run ``command`` to its end (see the module docstring); never raises for its exit code
    (:meth:`ProcessRun.check` does). Past ``timeout`` seconds its process group is killed."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{label}.out", log_dir / f"{label}.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(command),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        sampler = _TreeSampler(proc.pid, timeout)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        sampler.root_exited()
    stragglers = _wait_for_group(proc.pid)
    sampler.stop()
    return ProcessRun(
        label=label,
        command=tuple(command),
        seconds=seconds,
        returncode=proc.returncode,
        stdout_path=out_path,
        stderr_path=err_path,
        tree_peak_kib=sampler.tree_peak_kib,
        largest_kib=max(sampler.largest_kib, 0),
        wait4_maxrss_kib=usage.ru_maxrss,
        processes=len(sampler.seen),
        stragglers=stragglers,
        cpu_seconds=cpu_parts(sampler.process_cpu, sampler.thread_cpu),
    )


class _TreeSampler(threading.Thread):
    def __init__(self, root: int, timeout: float | None) -> None:
        super().__init__(name=f"tree-sampler-{root}", daemon=True)
        self.root = root
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.tree_peak_kib = 0
        self.largest_kib = 0
        self.seen: set[int] = set()
        self.process_cpu: dict[int, tuple[str, float]] = {}
        self.thread_cpu: dict[tuple[int, int], tuple[str, float]] = {}
        self._samples = 0
        self._root_alive = True
        self._done = threading.Event()

    def root_exited(self) -> None:
        self._root_alive = False

    def stop(self) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        while not self._done.is_set():
            self.sample()
            if self.deadline is not None and time.monotonic() > self.deadline and self._root_alive:
                _kill_group(self.root)
                self.deadline = None
            self._done.wait(SAMPLE_S)

    def sample(self) -> None:
        total = 0
        threads = self._samples % THREADS_EVERY == 0
        self._samples += 1
        for pid in tree(self.root):
            rss, hwm = _memory(pid)
            if rss is None:
                continue
            self.seen.add(pid)
            total += rss
            self.largest_kib = max(self.largest_kib, hwm or 0)
            cpu = _cpu(f"/proc/{pid}/stat")
            if cpu is None:
                continue
            self.process_cpu[pid] = cpu
            if threads and cpu[0] == "java":
                for tid in _listdir(f"/proc/{pid}/task"):
                    if (thread := _cpu(f"/proc/{pid}/task/{tid}/stat")) is not None:
                        self.thread_cpu[(pid, int(tid))] = thread
        self.tree_peak_kib = max(self.tree_peak_kib, total)


_TICK_S = 1 / os.sysconf("SC_CLK_TCK")

JVM_THREADS = (
    ("JIT compilers", ("C1 CompilerThre", "C2 CompilerThre")),
    ("garbage collector", ("GC Thread", "G1 ")),
    ("Spark tasks", ("Executor task",)),
)
"""Parts of a JVM's CPU time (:func:`cpu_parts`), by the starts of its threads' names (Linux
keeps 15 characters of a thread's name)."""


def cpu_parts(
    processes: Mapping[int, tuple[str, float]], threads: Mapping[tuple[int, int], tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds by part: each of :data:`JVM_THREADS`, ``other JVM`` (the rest of the JVMs'
    time: the driver's queries, Delta's log, I/O), ``not JVM`` (Python, the workers, anything
    else), and ``total``. ``processes``: pid -> (name, seconds); ``threads``: (pid, tid) ->
    (name, seconds), of the JVMs (name ``java``)."""
    parts = dict.fromkeys([name for name, _ in JVM_THREADS], 0.0)
    for _, (name, seconds) in threads.items():
        for part, starts in JVM_THREADS:
            if name.startswith(starts):
                parts[part] += seconds
                break
    jvm = sum(seconds for name, seconds in processes.values() if name == "java")
    total = sum(seconds for _, seconds in processes.values())
    parts["other JVM"] = max(jvm - sum(parts.values()), 0.0)
    parts["not JVM"] = total - jvm
    parts["total"] = total
    return {part: round(seconds, 1) for part, seconds in parts.items()}


def _cpu(path: str) -> tuple[str, float] | None:
    """(name, user + system seconds) from a ``stat`` file; None when it is gone."""
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    name = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode(errors="replace")
    fields = stat[stat.rfind(b")") + 2 :].split()
    return name, (int(fields[11]) + int(fields[12])) * _TICK_S


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _processes():
    """``(pid, state, ppid, pgrp)`` of every process, from one scan of ``/proc``."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        yield int(name), fields[0], int(fields[1]), int(fields[2])


def tree(root: int) -> list[int]:
    """``root``, the processes of its process group, and their descendants, from one scan of
    ``/proc`` (a zombie root still counts: its group and children are looked up all the same)."""
    parents: dict[int, int] = {}
    members: set[int] = {root}
    for pid, _, ppid, pgrp in _processes():
        parents[pid] = ppid
        if pgrp == root:
            members.add(pid)
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grew = True
    return sorted(members)


def _memory(pid: int) -> tuple[int | None, int | None]:
    """(``VmRSS``, ``VmHWM``) of a process in KiB; (None, None) when it is gone or a zombie."""
    rss = hwm = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        return None, None
    return rss, hwm


def proportional_kib(pid: int) -> int | None:
    """The process's proportional set size (``Pss``) in KiB: its resident pages, each shared
    page divided among the processes sharing it, so a process tree's sum counts a page once
    (a forked Python worker or a spawned child does not count the parent's pages again, as
    summing ``VmRSS`` does). None when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _group(pgid: int) -> list[int]:
    alive = []
    for pid, state, _, pgrp in _processes():
        if pgrp == pgid and state != b"Z":
            alive.append(pid)
    return alive


def _wait_for_group(pgid: int) -> int:
    """Wait until no process of group ``pgid`` (the child's own, it led it) is alive; kill what
    is left after :data:`STRAGGLER_TIMEOUT_S`. How many were killed."""
    deadline = time.monotonic() + STRAGGLER_TIMEOUT_S
    while (alive := _group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive:
        _kill_group(pgid)
        time.sleep(0.5)
    return len(alive)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
