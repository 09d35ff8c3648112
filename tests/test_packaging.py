"""The wheel installs one import package, ``pgmedallion``, and nothing else at the top level.

The repository keeps its layers as top-level folders (``capture/``, ``silver/``, ...); the wheel
maps them to ``pgmedallion.capture``, ``pgmedallion.silver``, ... so that nothing named ``core`` or
``gold`` lands in a shared cluster's site-packages (pyproject's ``package-dir``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["core", "bronze", "capture", "silver", "gold", "marts"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # pip builds in the source tree (build/, *.egg-info): build from a copy of what a wheel is
    # made of, not from the checkout.
    source = tmp_path_factory.mktemp("source")
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy(ROOT / name, source / name)
    skip = shutil.ignore_patterns("__pycache__")
    for folder in [*LAYERS, "commands"]:
        shutil.copytree(ROOT / folder, source / folder, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        check=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
        capture_output=True,
    )
    (path,) = out.glob("pgmedallion-*.whl")
    return path


def test_the_wheel_holds_only_the_pgmedallion_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"pgmedallion", wheel.name.split("-py3")[0] + ".dist-info"}
    for layer in LAYERS:
        assert f"pgmedallion/{layer}/__init__.py" in names, layer
    assert "pgmedallion/marts/demo/daily_revenue.py" in names
    assert "pgmedallion/silver/build.py" in names and "pgmedallion/cli.py" in names
    # Every module of every layer folder is in the wheel, under its package; the commands
    # (commands/) are the package itself.
    for layer in LAYERS:
        for source in (ROOT / layer).rglob("*.py"):
            assert f"pgmedallion/{source.relative_to(ROOT).as_posix()}" in names, source
    for source in (ROOT / "commands").rglob("*.py"):
        assert f"pgmedallion/{source.relative_to(ROOT / 'commands').as_posix()}" in names, source
    assert not [n for n in names if n.startswith(("pgmedallion/tests", "pgmedallion/benchmarks"))]


def test_the_installed_wheel_imports_from_itself(wheel, tmp_path):
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    probe = (
        "import importlib.util, pgmedallion.capture.run, pgmedallion.core.expectations\n"
        "import pgmedallion.marts.demo.logic\n"
        "print(pgmedallion.capture.run.__file__)\n"
        "find = importlib.util.find_spec\n"
        "print(find('core') is None, find('gold') is None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=True,
    )
    where, absent = done.stdout.splitlines()
    assert Path(where).is_relative_to(target)
    assert absent == "True True"


def test_no_folder_at_the_root_is_named_like_the_package():
    """A process imports from its working directory first: a root folder named pgmedallion
    would be imported instead of the installed package, without its layers."""
    assert not (ROOT / "pgmedallion").exists()
    assert not list(ROOT.glob("pgmedallion.py"))


# A Spark job whose Python worker imports the project: the worker runs with the driver's
# working directory first on its import path (python -m pyspark.daemon).
_WORKER_PROBE = """
import sys
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("OFF")


def where(_):
    try:
        import pgmedallion.capture.connection as module
    except ImportError as exc:
        return [f"ImportError: {exc}"]
    return [module.__file__]


print("WORKER", spark.sparkContext.parallelize([0], 1).flatMap(where).collect()[0])
spark.stop()
"""


def _worker_import(target: Path, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _WORKER_PROBE],
        cwd=cwd,
        env={
            **os.environ,
            "PYTHONPATH": str(target),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("WORKER ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return lines[0].removeprefix("WORKER ")


def test_spark_workers_started_in_the_repository_import_the_installed_package(wheel, tmp_path):
    """A regular install (the wheel, not an editable one) and a Spark job run from the
    repository root, as `pgmedallion demo` runs verify's Spark jobs: the worker's
    pgmedallion.capture is the installed one. Then the same job from a folder holding a partial
    pgmedallion package (what the repository root held before): the worker cannot import
    it, so the first half is not vacuous."""
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    assert Path(_worker_import(target, ROOT)).is_relative_to(target)

    shadow = tmp_path / "checkout"
    (shadow / "pgmedallion").mkdir(parents=True)
    (shadow / "pgmedallion" / "__init__.py").write_text("")
    assert _worker_import(target, shadow).startswith("ImportError")
