"""``benchmarks.process``: a whole child process's CPU time, by part, as the benchmarks print it.

Real processes: a Python child that spins for 1.5 s of CPU, and a JVM that compiles a Java
source file and spins in it as long (its JIT compilers then have work). Nothing here asserts
on wall-clock time.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from benchmarks.process import cpu_parts, run_process

SPIN_PY = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass\n"

SPIN_JAVA = """
public class Spin {
    public static void main(String[] args) {
        var bean = java.lang.management.ManagementFactory.getThreadMXBean();
        long end = bean.getCurrentThreadCpuTime() + 1_500_000_000L, x = 0;
        while (bean.getCurrentThreadCpuTime() < end) { x += x * 31 + 7; }
        System.out.println(x == 42 ? "" : "done");
    }
}
"""


def test_a_python_child_s_cpu_is_counted_outside_any_jvm(tmp_path):
    run = run_process(
        [sys.executable, "-c", SPIN_PY],
        label="spin",
        env=os.environ,
        cwd=tmp_path,
        log_dir=tmp_path / "logs",
    ).check()
    parts = run.cpu_seconds
    assert parts["not JVM"] >= 0.75  # 1.5 s of CPU, less what the samples missed at its end
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"), 0.01)
    assert parts["JIT compilers"] == parts["Spark tasks"] == parts["other JVM"] == 0


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
def test_a_jvm_s_cpu_is_split_by_its_threads(tmp_path):
    source = tmp_path / "Spin.java"
    source.write_text(SPIN_JAVA)
    run = run_process(
        ["java", str(source)],
        label="spin-java",
        env=os.environ,
        cwd=tmp_path,
        log_dir=tmp_path / "logs",
    ).check()
    assert run.stdout.strip() == "done"
    parts = run.cpu_seconds
    assert parts["JIT compilers"] > 0  # javac's own classes and the loop were compiled
    assert parts["other JVM"] >= 0.75  # the main thread spun for 1.5 s of CPU
    assert parts["not JVM"] < 0.5  # nothing but the JVM ran
    assert parts["total"] >= parts["JIT compilers"] + parts["other JVM"]


def test_cpu_parts_takes_each_thread_by_its_name():
    processes = {1: ("java", 10.0), 2: ("python3", 2.5)}
    threads = {
        (1, 11): ("C2 CompilerThre", 3.0),
        (1, 12): ("C1 CompilerThre", 1.0),
        (1, 13): ("GC Thread#0", 0.5),
        (1, 14): ("Executor task i", 4.0),
        (1, 15): ("Thread-3", 1.2),
    }
    assert cpu_parts(processes, threads) == {
        "JIT compilers": 4.0,
        "garbage collector": 0.5,
        "Spark tasks": 4.0,
        "other JVM": 1.5,
        "not JVM": 2.5,
        "total": 12.5,
    }
