"""The Databricks asset bundle, checked offline: no workspace, no Databricks CLI, no Spark.

The Databricks CLI is not installable here, so this module does the part of
``databricks bundle validate`` that can go wrong in review: it loads ``databricks.yml`` and its
includes, merges each target over the top level, substitutes ``${var.*}``, ``${bundle.*}``,
``${workspace.*}`` and ``${resources.*}`` the way the CLI does, and then

- parses every job with the typed classes of ``databricks-bundles`` (``Job.from_dict`` rejects
  unknown fields and wrong enum values),
- checks that every wheel path points at the declared artifact's ``dist`` folder and the
  artifact builds this repository's ``pyproject.toml``,
- loads the shipped TOML with the job's environment, so a misspelt ``PGMEDALLION_*`` variable
  (which ``load_config`` would silently ignore) fails here,
- parses every task's parameters with the real ``pgmedallion`` argument parser.

Each checker is a small pure function, and each is also shown to catch a deliberately broken
copy, so none of these tests can pass vacuously.
"""

from __future__ import annotations

import copy
import fnmatch
import re
import subprocess
import tomllib
import zoneinfo
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from databricks.bundles.jobs import Job, JobRunAs
from databricks.bundles.pipelines import Pipeline

from pgmedallion.cli import build_parser
from pgmedallion.core.config import LakehouseConfig, SourceConfig, load_config
from pgmedallion.core.spark import JVM_OPTIONS, PYTHON_WORKER_ENV, spark_settings
from pgmedallion.marts import GOLD_SCHEMA_KEY

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_FILE = ROOT / "databricks.yml"
USER = "someone@example.com"
REF = re.compile(r"\$\{([^}]*)\}")
KNOWN_BUNDLE_KEYS = {"name", "target", "git.branch", "git.commit", "git.origin_url"}
KNOWN_WORKSPACE_KEYS = {
    "host",
    "profile",
    "root_path",
    "file_path",
    "artifact_path",
    "state_path",
    "resource_path",
    "current_user.userName",
    "current_user.short_name",
}
TARGET_ONLY_KEYS = {"mode", "default", "variables"}


# ---------------------------------------------------------------- loading and merging


def _read_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.name} is not a YAML mapping"
    return data


def _merge(base: Any, override: Any) -> Any:
    """Deep merge of mappings (the override wins); anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return override


def load_bundle(root: Path = ROOT) -> tuple[dict[str, Any], dict[str, Path]]:
    """``databricks.yml`` with its includes merged in, and the file each job was declared in."""
    bundle = _read_yaml(root / "databricks.yml")
    job_files: dict[str, Path] = {}
    for pattern in bundle.get("include", []):
        matches = sorted(root.glob(pattern))
        assert matches, f"include {pattern!r} matches no file"
        for path in matches:
            part = _read_yaml(path)
            for name in part.get("resources", {}).get("jobs", {}):
                job_files[name] = path
            bundle = _merge(bundle, part)
    for name in bundle.get("resources", {}).get("jobs", {}):
        job_files.setdefault(name, root / "databricks.yml")
    return bundle, job_files


def target_variables(bundle: dict[str, Any], target: str) -> dict[str, Any]:
    """Each declared variable's value for ``target``: the target's value, else the default."""
    overrides = bundle["targets"][target].get("variables") or {}
    values = {}
    for name, spec in (bundle.get("variables") or {}).items():
        if name in overrides:
            value = overrides[name]
            if isinstance(value, dict) and "default" in value and spec.get("type") != "complex":
                value = value["default"]
            values[name] = value
        elif "default" in spec:
            values[name] = spec["default"]
    return values


def for_target(bundle: dict[str, Any], target: str) -> dict[str, Any]:
    """The top level with the target's settings merged over it (variables stay separate)."""
    merged = {k: v for k, v in bundle.items() if k != "targets"}
    overrides = {k: v for k, v in bundle["targets"][target].items() if k not in TARGET_ONLY_KEYS}
    return _merge(merged, overrides)


# ---------------------------------------------------------------- substitution


def _walk_strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _walk_strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk_strings(value)


class Resolver:
    """Substitutes references the way the Databricks CLI does, and lists the ones it cannot."""

    def __init__(self, bundle: dict[str, Any], target: str):
        self.config = for_target(bundle, target)
        self.variables = target_variables(bundle, target)
        self.declared = set(bundle.get("variables") or {})
        self.resources = self.config.get("resources") or {}
        root = (self.config.get("workspace") or {}).get(
            "root_path",
            "/Workspace/Users/${workspace.current_user.userName}/.bundle/"
            "${bundle.name}/${bundle.target}",
        )
        self.known = {
            "bundle.name": self.config["bundle"]["name"],
            "bundle.target": target,
            "workspace.current_user.userName": USER,
            "workspace.current_user.short_name": USER.split("@")[0],
            "workspace.host": "https://example.cloud.databricks.com",
            "workspace.root_path": root,
            "workspace.file_path": root + "/files",
            "workspace.artifact_path": root + "/artifacts",
            "workspace.state_path": root + "/state",
            "workspace.resource_path": root + "/resources",
        }
        self.problems: list[str] = [
            f"targets.{target}.variables.{name}: no such variable is declared"
            for name in bundle["targets"][target].get("variables") or {}
            if name not in self.declared
        ]

    def problem_for(self, ref: str) -> str | None:
        kind, _, rest = ref.partition(".")
        if kind == "var":
            if rest not in self.declared:
                return f"${{{ref}}}: no variable {rest!r} is declared"
            if rest not in self.variables:
                return f"${{{ref}}}: variable {rest!r} has no default and no value in this target"
            return None
        if kind == "bundle":
            return None if rest in KNOWN_BUNDLE_KEYS else f"${{{ref}}}: unknown bundle key"
        if kind == "workspace":
            return None if rest in KNOWN_WORKSPACE_KEYS else f"${{{ref}}}: unknown workspace key"
        if kind == "resources":
            parts = rest.split(".")
            if len(parts) < 3:
                return f"${{{ref}}}: expected resources.<type>.<name>.<field>"
            if parts[1] not in (self.resources.get(parts[0]) or {}):
                return f"${{{ref}}}: no {parts[0]} resource named {parts[1]!r}"
            return None
        return f"${{{ref}}}: unknown reference"

    def value_of(self, ref: str) -> Any:
        if ref.startswith("var."):
            return self.resolve(self.variables[ref[4:]])
        if ref.startswith("resources."):
            return "1234567890"
        return self.resolve(self.known.get(ref, f"<{ref}>"))

    def resolve(self, node: Any, depth: int = 0) -> Any:
        assert depth < 20, "reference cycle"
        if isinstance(node, dict):
            return {k: self.resolve(v, depth + 1) for k, v in node.items()}
        if isinstance(node, list):
            return [self.resolve(v, depth + 1) for v in node]
        if not isinstance(node, str):
            return node
        refs = REF.findall(node)
        bad = [p for p in (self.problem_for(r) for r in refs) if p]
        if bad:
            self.problems.extend(p for p in bad if p not in self.problems)
            return node
        whole = REF.fullmatch(node)
        if whole:  # a whole-string reference keeps the value's type (lists, numbers)
            return self.value_of(whole.group(1))

        def text(match: re.Match[str]) -> str:
            value = self.value_of(match.group(1))
            assert isinstance(value, (str, int, float)), f"{match.group(0)} is not a scalar"
            return str(value)

        return REF.sub(text, node)


def resolved(bundle: dict[str, Any], target: str) -> tuple[dict[str, Any], list[str]]:
    resolver = Resolver(bundle, target)
    config = resolver.resolve(resolver.config)
    return config, resolver.problems


# ---------------------------------------------------------------- what the jobs contain


def tasks(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for job_name, job in (config.get("resources") or {}).get("jobs", {}).items():
        for task in job.get("tasks", []):
            yield job_name, task


def wheel_tasks(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The tasks that run ``pgmedallion`` from the wheel."""
    return ((j, t) for j, t in tasks(config) if "python_wheel_task" in t)


def task_env(job: dict[str, Any], task: dict[str, Any]) -> dict[str, str]:
    """The environment variables of the cluster a task runs on."""
    if "new_cluster" in task:
        return dict(task["new_cluster"].get("spark_env_vars") or {})
    for cluster in job.get("job_clusters", []):
        if cluster["job_cluster_key"] == task.get("job_cluster_key"):
            return dict(cluster["new_cluster"].get("spark_env_vars") or {})
    raise AssertionError(f"task {task['task_key']} names no job cluster of its job")


def unknown_config_variables(env: dict[str, str]) -> list[str]:
    """``PGMEDALLION_*`` names that ``load_config`` would ignore (it reads only known keys)."""
    known = {
        f"PGMEDALLION_{section.upper()}_{f.name.upper()}"
        for section, cls in (("source", SourceConfig), ("lakehouse", LakehouseConfig))
        for f in fields(cls)
        if f.name != "password"
    }
    return sorted(k for k in env if k.startswith("PGMEDALLION_") and k not in known)


def wheel_path_problems(
    config: dict[str, Any], job_files: dict[str, Path], root: Path = ROOT
) -> list[str]:
    """Every wheel a task installs must be what a declared ``whl`` artifact builds."""
    dists = {
        (root / spec.get("path", ".")).resolve() / "dist"
        for spec in (config.get("artifacts") or {}).values()
        if spec.get("type") == "whl"
    }
    problems = []
    for job_name, task in tasks(config):
        for library in task.get("libraries", []):
            if "whl" not in library:
                continue
            raw = library["whl"]
            if raw.startswith(("/Workspace/", "/Volumes/")):
                continue  # already in the workspace: not built by this bundle
            path = (job_files[job_name].parent / raw).resolve()
            where = f"{job_name}.{task['task_key']}: whl {raw!r}"
            if not path.is_relative_to(root):
                problems.append(f"{where} points outside the repository")
            elif path.parent not in dists:
                problems.append(f"{where} is not in a whl artifact's dist folder")
            elif not fnmatch.fnmatch("pgmedallion-0.1.0-py3-none-any.whl", path.name):
                problems.append(f"{where} would not match this project's wheel")
    return problems


def config_file(params: list[str], file_path: str) -> Path | None:
    """The local copy of the ``--config`` file a task passes (synced from the bundle root)."""
    if "--config" not in params:
        return None
    remote = params[params.index("--config") + 1]
    assert remote.startswith(file_path + "/"), f"{remote} is not a file synced by the bundle"
    return ROOT / remote[len(file_path) + 1 :]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def bundle() -> dict[str, Any]:
    return load_bundle()[0]


@pytest.fixture(scope="module")
def job_files() -> dict[str, Path]:
    return load_bundle()[1]


def _targets() -> list[str]:
    return sorted(_read_yaml(BUNDLE_FILE)["targets"])


TARGETS = _targets()


# ---------------------------------------------------------------- structure


def test_bundle_parses_and_has_the_required_shape(bundle):
    assert bundle["bundle"]["name"] == "pgmedallion"
    assert bundle["include"] == ["resources/*.yml"]
    for key in ("artifacts", "variables", "targets", "resources"):
        assert bundle.get(key), f"databricks.yml: missing or empty {key!r}"
    assert set(TARGETS) >= {"dev", "prod"}
    dev, prod = bundle["targets"]["dev"], bundle["targets"]["prod"]
    assert dev["mode"] == "development" and dev["default"] is True
    assert prod["mode"] == "production"
    root_path = "/Workspace/Shared/.bundle/${bundle.name}/${bundle.target}"
    assert prod["workspace"]["root_path"] == root_path
    assert [t for t in TARGETS if bundle["targets"][t].get("default")] == ["dev"]
    required = {
        "catalog",
        "bronze_schema",
        "silver_schema",
        "gold_schema",
        "source_host",
        "source_port",
        "source_dbname",
        "source_user",
        "publication",
        "slot",
        "secret_scope",
        "secret_key",
        "cron",
        "timezone",
    }
    assert required <= set(bundle["variables"])
    jobs = {"pgmedallion", "pgmedallion_verify", "pgmedallion_continuous"}
    assert set(bundle["resources"]["jobs"]) == jobs


def test_every_include_is_a_resources_file(job_files):
    included = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("resources/*.yml")}
    assert "resources/pgmedallion.job.yml" in included
    for path in map(ROOT.joinpath, included):
        assert set(_read_yaml(path)) <= {"resources", "variables", "targets", "artifacts"}
    assert job_files["pgmedallion"] == ROOT / "resources" / "pgmedallion.job.yml"


def test_targets_do_not_share_a_catalog_or_a_slot(bundle):
    seen = {t: target_variables(bundle, t) for t in TARGETS}
    for key in ("catalog", "slot"):
        values = [seen[t][key] for t in TARGETS]
        assert len(set(values)) == len(values), f"targets share a {key}: {values}"


# ---------------------------------------------------------------- references


@pytest.mark.parametrize("target", TARGETS)
def test_every_reference_resolves(bundle, target):
    config, problems = resolved(bundle, target)
    assert problems == []
    assert not [s for s in _walk_strings(config) if "${" in s]


def test_reference_checker_catches_broken_references(bundle):
    broken = copy.deepcopy(bundle)
    job = broken["resources"]["jobs"]["pgmedallion"]
    job["description"] = "${var.no_such_variable} ${workspace.nope} ${bundle.nope}"
    job["tags"]["other"] = "${resources.jobs.no_such_job.id}"
    job["tags"]["typo"] = "${resources.pipelines.no_such_pipeline.name} ${foo.bar}"
    del broken["targets"]["prod"]["variables"]["slot"]  # slot has no default
    broken["targets"]["prod"]["variables"]["catalgo"] = "typo"
    _, problems = resolved(broken, "prod")
    text = "\n".join(problems)
    for needle in (
        "no variable 'no_such_variable'",
        "workspace.nope",
        "bundle.nope",
        "no jobs resource named 'no_such_job'",
        "no pipelines resource named 'no_such_pipeline'",
        "foo.bar",
        "variable 'slot' has no default",
        "targets.prod.variables.catalgo: no such variable",
    ):
        assert needle in text
    job["tags"]["ok"] = "${resources.jobs.pgmedallion_verify.id}"
    del job["description"], job["tags"]["other"], job["tags"]["typo"]
    assert resolved(broken, "dev")[1] == []


# ---------------------------------------------------------------- jobs


@pytest.mark.parametrize("target", TARGETS)
def test_every_job_is_a_valid_job_definition(bundle, target):
    config, _ = resolved(bundle, target)
    for name, job in config["resources"]["jobs"].items():
        parsed = Job.from_dict(job)
        assert parsed.name == name
        assert parsed.max_concurrent_runs == 1
        if "continuous" in job:  # a continuous job has no schedule
            assert "schedule" not in job
            assert job["continuous"]["pause_status"] in ("PAUSED", "UNPAUSED")
            continue
        schedule = job["schedule"]
        assert len(schedule["quartz_cron_expression"].split()) in (6, 7)
        zoneinfo.ZoneInfo(schedule["timezone_id"])
    if "run_as" in config:
        JobRunAs.from_dict(config["run_as"])
    for permission in config.get("permissions", []):
        assert permission["level"] in ("CAN_VIEW", "CAN_RUN", "CAN_MANAGE")


def test_job_parser_catches_a_wrong_field(bundle):
    config, _ = resolved(bundle, "dev")
    good = config["resources"]["jobs"]["pgmedallion"]
    for breakage in (
        lambda j: j.update(max_concurent_runs=1),
        lambda j: j["schedule"].update(timezone=j["schedule"].pop("timezone_id")),
        lambda j: j["tasks"][0].update(python_wheel=j["tasks"][0].pop("python_wheel_task")),
        lambda j: j["job_clusters"][0]["new_cluster"].update(data_security_mode="SINGLE"),
    ):
        job = copy.deepcopy(good)
        breakage(job)
        with pytest.raises(ValueError):
            Job.from_dict(job)


def test_capture_silver_gold_run_in_order_then_verify_on_request(bundle):
    config, _ = resolved(bundle, "dev")
    jobs = config["resources"]["jobs"]
    main = {t["task_key"]: t for t in jobs["pgmedallion"]["tasks"]}
    assert list(main) == ["capture", "silver", "gold", "marts", "verify_requested", "verify"]
    assert [t.get("depends_on", []) for t in main.values()] == [
        [],
        [{"task_key": "capture"}],
        [{"task_key": "silver"}],
        [{"task_key": "gold"}],
        [{"task_key": "gold"}],
        [{"task_key": "verify_requested", "outcome": "true"}],
    ]
    for stage in ("capture", "silver", "gold"):
        params = main[stage]["python_wheel_task"]["parameters"]
        assert params[0] == "run" and params[params.index("--stage") + 1] == stage
    assert main["verify"]["python_wheel_task"]["parameters"][0] == "verify"
    # verify runs only when the run was asked for it, and by default it is not
    assert main["verify_requested"]["condition_task"] == {
        "op": "EQUAL_TO",
        "left": "{{job.parameters.verify}}",
        "right": "true",
    }
    assert jobs["pgmedallion"]["parameters"] == [
        {"name": "verify", "default": "false"},
        {"name": "resync", "default": ""},
    ]
    # `--params resync=schema.table,...` reaches the capture (empty: nothing to resync)
    capture = main["capture"]["python_wheel_task"]["parameters"]
    assert "--resync={{job.parameters.resync}}" in capture
    assert build_parser().parse_args([*capture[:-1], "--resync="]).resync == ""


def test_the_continuous_job_is_paused_unless_asked_and_runs_the_whole_pipeline(bundle):
    """One reader per slot: the continuous job starts paused, and a deploy that unpauses it can
    pause the scheduled job (both pause states are variables)."""
    config, _ = resolved(bundle, "prod")
    jobs = config["resources"]["jobs"]
    assert jobs["pgmedallion_continuous"]["continuous"]["pause_status"] == "PAUSED"
    assert jobs["pgmedallion"]["schedule"]["pause_status"] == "UNPAUSED"
    (task,) = jobs["pgmedallion_continuous"]["tasks"]
    params = task["python_wheel_task"]["parameters"]
    assert params[0] == "run" and "--continuous" in params and "--stage" not in params
    raw = bundle["resources"]["jobs"]
    assert raw["pgmedallion_continuous"]["continuous"]["pause_status"] == (
        "${var.continuous_pause_status}"
    )
    assert raw["pgmedallion"]["schedule"]["pause_status"] == "${var.schedule_pause_status}"


def test_verify_job_runs_inside_the_pipeline_job(bundle):
    """Only the pipeline job may touch the slot: the daily job asks it for a verifying run."""
    (task,) = bundle["resources"]["jobs"]["pgmedallion_verify"]["tasks"]
    assert task["run_job_task"] == {
        "job_id": "${resources.jobs.pgmedallion.id}",
        "job_parameters": {"verify": "true"},
    }
    readers = {
        job
        for job, t in wheel_tasks(bundle)
        if "capture" in t["python_wheel_task"]["parameters"]
        or t["python_wheel_task"]["parameters"][0] == "verify"
    }
    assert readers == {"pgmedallion"}


def test_wheel_tasks_name_this_package_and_its_console_script(bundle):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    config, _ = resolved(bundle, "dev")
    for _, task in wheel_tasks(config):
        wheel_task = task["python_wheel_task"]
        assert wheel_task["package_name"] == project["name"]
        assert project["scripts"][wheel_task["entry_point"]] == "pgmedallion.cli:entry"
        # positional parameters: job parameters (verify=...) are pushed only to keyword ones
        assert not wheel_task.get("named_parameters")
        assert [lib for lib in task["libraries"] if "whl" in lib], task["task_key"]


# ---------------------------------------------------------------- artifacts and paths


def test_artifact_builds_this_repositorys_wheel(bundle):
    (artifact,) = bundle["artifacts"].values()
    assert artifact["type"] == "whl"
    assert (ROOT / artifact["path"] / "pyproject.toml").is_file()
    assert artifact["build"] in ("python -m build --wheel", "uv build --wheel")


RUNTIME_PROVIDED = ("pyspark", "delta-spark")


def runtime_conflicts(dependencies: list[str]) -> list[str]:
    """Requirements the Databricks runtime provides itself (its own Spark and Delta)."""
    names = [re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower() for d in dependencies]
    return [d for d, n in zip(dependencies, names, strict=True) if n in RUNTIME_PROVIDED]


def test_runtime_conflict_checker():
    deps = ["pyspark[pipelines]==4.2.0", "delta-spark>=4", "psycopg[binary]>=3.3", "pyyaml"]
    assert runtime_conflicts(deps) == ["pyspark[pipelines]==4.2.0", "delta-spark>=4"]


def test_wheel_does_not_replace_the_runtimes_spark():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert runtime_conflicts(project["dependencies"]) == []
    local = project["optional-dependencies"]["local"]
    assert sorted(runtime_conflicts(local)) == ["delta-spark==4.4.0", "pyspark[pipelines]==4.2.0"]
    assert "pgmedallion[local]" in project["optional-dependencies"]["dev"]


@pytest.mark.parametrize("target", TARGETS)
def test_wheel_paths_are_the_artifacts_output(bundle, job_files, target):
    config, _ = resolved(bundle, target)
    assert wheel_path_problems(config, job_files) == []


def test_wheel_path_checker_catches_wrong_paths(bundle, job_files):
    config, _ = resolved(bundle, "dev")
    libraries = config["resources"]["jobs"]["pgmedallion"]["tasks"][0]["libraries"]
    libraries[:] = [{"whl": "../../dist/*.whl"}, {"whl": "./dist/*.whl"}, {"whl": "../dist/*.jar"}]
    problems = "\n".join(wheel_path_problems(config, job_files))
    assert "outside the repository" in problems
    assert "not in a whl artifact's dist folder" in problems
    assert "would not match" in problems


def test_shipped_files_are_synced():
    for path in ("resources/pgmedallion.toml", "databricks.yml"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0
        assert not ignored, f"{path} is git-ignored, so the bundle would not sync it"


# ---------------------------------------------------------------- configuration on the cluster


@pytest.mark.parametrize("target", TARGETS)
def test_job_environment_configures_pgmedallion(bundle, target):
    config, _ = resolved(bundle, target)
    values = target_variables(bundle, target)
    file_path = Resolver(bundle, target).value_of("workspace.file_path")
    for job_name, task in wheel_tasks(config):
        env = task_env(config["resources"]["jobs"][job_name], task)
        assert unknown_config_variables(env) == []
        assert not [k for k in env if k in ("PGPASSWORD", "PGMEDALLION_SOURCE_PASSWORD")]
        path = config_file(task["python_wheel_task"]["parameters"], file_path)
        assert path is not None and path.is_file(), f"{job_name}.{task['task_key']}"
        loaded = load_config(path, env=env)
        assert loaded.lakehouse.catalog == values["catalog"]
        assert loaded.lakehouse.gold_schema == values["gold_schema"]
        assert loaded.source.slot == values["slot"]
        assert loaded.source.port == int(values["source_port"])
        assert (loaded.source.password_secret_scope, loaded.source.password_secret_key) == (
            values["secret_scope"],
            values["secret_key"],
        )


def job_clusters(bundle, target: str) -> list[dict]:
    """The new clusters of every job of the bundle resolved for ``target`` (at least one)."""
    config, _ = resolved(bundle, target)
    clusters = [
        c["new_cluster"]
        for job in config["resources"]["jobs"].values()
        for c in job.get("job_clusters", [])
    ]
    assert clusters
    return clusters


@pytest.mark.parametrize("target", TARGETS)
def test_job_clusters_compile_huge_methods(bundle, target):
    """Every job cluster's JVMs get the options local Spark gets (silver's generated code is
    over HotSpot's huge-method limit)."""
    clusters = job_clusters(bundle, target)
    for cluster in clusters:
        conf = cluster.get("spark_conf") or {}
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            assert JVM_OPTIONS in conf.get(key, ""), (target, key)
    assert JVM_OPTIONS in spark_settings(Path("unused"))["spark.driver.extraJavaOptions"]


@pytest.mark.parametrize("target", TARGETS)
def test_job_clusters_give_python_workers_the_local_environment(bundle, target):
    """Every job cluster's executors give their Python workers the environment local Spark
    gives its own (their Arrow allocator), the driver's left as it is."""
    clusters = job_clusters(bundle, target)
    for name, value in PYTHON_WORKER_ENV.items():
        for cluster in clusters:
            conf = cluster.get("spark_conf") or {}
            assert conf.get(f"spark.executorEnv.{name}") == value, (target, name)
            assert name not in (cluster.get("spark_env_vars") or {}), (target, name)


def test_misspelt_config_variable_is_caught():
    env = {"PGMEDALLION_LAKEHOUSE_CATALOGUE": "x", "PGMEDALLION_SOURCE_SLOT": "s", "OTHER": "y"}
    assert unknown_config_variables(env) == ["PGMEDALLION_LAKEHOUSE_CATALOGUE"]


# ---------------------------------------------------------------- the CLI the tasks call


def _cli_problems(config: dict[str, Any]) -> list[str]:
    parser = build_parser()
    problems = []
    for job_name, task in wheel_tasks(config):
        params = task["python_wheel_task"]["parameters"]
        try:
            args = parser.parse_args(params)
        except SystemExit:
            problems.append(f"{job_name}.{task['task_key']}: pgmedallion {' '.join(params)}")
            continue
        where = f"{job_name}.{task['task_key']}"
        if args.command != params[0]:
            problems.append(f"{where}: parsed as {args.command!r}, not {params[0]!r}")
        if "--stage" in params and getattr(args, "stage", None) != task["task_key"]:
            problems.append(f"{where}: --stage not understood")
        if (
            "--config" in params
            and getattr(args, "config", None) != params[params.index("--config") + 1]
        ):
            problems.append(f"{where}: --config after the command is lost")
    return problems


def test_cli_problems_are_reported(bundle):
    config, _ = resolved(bundle, "dev")
    task = config["resources"]["jobs"]["pgmedallion"]["tasks"][0]
    task["python_wheel_task"]["parameters"] = ["no-such-command"]
    assert _cli_problems(config) and "no-such-command" in _cli_problems(config)[0]


def test_task_parameters_parse_with_the_cli(bundle):
    config, _ = resolved(bundle, "dev")
    assert _cli_problems(config) == []


# ---------------------------------------------------------------- the marts pipeline

MARTS_FILE = ROOT / "resources" / "marts.pipeline.yml"


def library_problems(pipeline: dict[str, Any], declared_in: Path) -> list[str]:
    """Every library is a file of this repository (relative to the file declaring it) that
    defines one dataset with the project's decorators."""
    problems = []
    for library in pipeline.get("libraries", []):
        if set(library) != {"file"}:
            problems.append(f"{library}: only file libraries are shipped")
            continue
        path = (declared_in.parent / library["file"]["path"]).resolve()
        if not path.is_relative_to(ROOT) or not path.is_file():
            problems.append(f"{library['file']['path']}: no such file in the repository")
            continue
        text = path.read_text()
        if text.count("@materialized_view(") + text.count("@table(") != 1:
            problems.append(f"{library['file']['path']}: not one dataset definition")
    return problems


def marts_pipeline(config: dict[str, Any]) -> dict[str, Any]:
    return config["resources"]["pipelines"]["pgmedallion_marts"]


@pytest.mark.parametrize("target", TARGETS)
def test_marts_pipeline_is_a_valid_pipeline_over_gold(bundle, target):
    config, problems = resolved(bundle, target)
    assert problems == []
    values = target_variables(bundle, target)
    assert set(config["resources"]["pipelines"]) == {"pgmedallion_marts"}
    pipeline = marts_pipeline(config)
    parsed = Pipeline.from_dict(pipeline)
    assert parsed.name == "pgmedallion_marts"
    assert (parsed.catalog, parsed.schema) == (values["catalog"], values["marts_schema"])
    assert parsed.configuration == {GOLD_SCHEMA_KEY: values["gold_schema"]}
    assert parsed.root_path == Resolver(bundle, target).value_of("workspace.file_path")
    assert library_problems(pipeline, MARTS_FILE) == []
    # The definitions import pgmedallion.core.expectations and pgmedallion.marts.*: the
    # pipeline installs the wheel the bundle builds, as the job's tasks do.
    assert parsed.environment is not None
    (dependency,) = parsed.environment.dependencies
    as_task = {"task_key": "marts", "libraries": [{"whl": dependency}]}
    as_job = {"resources": {"jobs": {"pipeline": {"tasks": [as_task]}}}}
    assert wheel_path_problems({**config, **as_job}, {"pipeline": MARTS_FILE}) == []


def test_marts_pipeline_lists_every_demo_mart():
    declared = _read_yaml(MARTS_FILE)["resources"]["pipelines"]["pgmedallion_marts"]
    listed = {(MARTS_FILE.parent / lib["file"]["path"]).resolve() for lib in declared["libraries"]}
    definitions = {
        p.resolve()
        for p in (ROOT / "marts" / "demo").glob("*.py")
        if "@materialized_view(" in p.read_text() or "@table(" in p.read_text()
    }
    assert definitions and listed == definitions


def test_marts_pipeline_checks_catch_broken_copies(bundle):
    config, _ = resolved(bundle, "dev")
    good = marts_pipeline(config)
    with pytest.raises(ValueError):
        Pipeline.from_dict({**good, "librarys": good["libraries"]})
    broken = copy.deepcopy(good)
    broken["libraries"] += [
        {"file": {"path": "../marts/demo/no_such_mart.py"}},
        {"file": {"path": "../marts/demo/logic.py"}},
        {"notebook": {"path": "../x"}},
    ]
    problems = "\n".join(library_problems(broken, MARTS_FILE))
    assert "no_such_mart.py: no such file" in problems
    assert "logic.py: not one dataset definition" in problems
    assert "only file libraries" in problems


def test_job_refreshes_the_marts_pipeline_after_gold(bundle):
    job = bundle["resources"]["jobs"]["pgmedallion"]
    (task,) = [t for t in job["tasks"] if "pipeline_task" in t]
    assert task["task_key"] == "marts"
    assert task["depends_on"] == [{"task_key": "gold"}]
    assert task["pipeline_task"] == {"pipeline_id": "${resources.pipelines.pgmedallion_marts.id}"}
    config, problems = resolved(bundle, "dev")
    assert problems == []
    parsed = Job.from_dict(config["resources"]["jobs"]["pgmedallion"])
    (pipeline_task,) = [t.pipeline_task for t in parsed.tasks if t.pipeline_task is not None]
    assert pipeline_task.pipeline_id == "1234567890"
