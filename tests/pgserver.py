"""A throwaway PostgreSQL server for the tests: a cluster made by initdb in a temporary folder, listening on a Unix
socket only (no TCP port to collide on), trust authentication, fsync off, stopped and removed when the test process
ends. One per test process; each test gets a database of its own (``new_database``).

The server binaries come from Debian's ``postgresql`` package (``make test`` installs it through
scripts/setup-debian.sh). PostgreSQL refuses to run as root, so under root the server runs as the ``postgres``
user the package creates.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

SUPERUSER = "postgres"


def server_binaries() -> Path | None:
    """The newest installed PostgreSQL server's bin folder (initdb, pg_ctl), None when there is none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def unavailable() -> str | None:
    """Why no server can be started here, None when one can."""
    if server_binaries() is None:
        return "no PostgreSQL server installed (Debian's postgresql package; `make test` installs it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return f"running as root and there is no '{SUPERUSER}' user to run the server as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install '.[postgres]')"
    return None


class PostgresServer:
    """start() makes and starts the cluster; url(db) is the SQLAlchemy URL of one of its databases."""

    def __init__(self) -> None:
        self.bin = server_binaries()
        self.root = Path(tempfile.mkdtemp(prefix="workbench-pg-"))  # short: a socket path has 107 bytes at most
        self.data, self.socket_dir = self.root / "data", self.root / "socket"
        self.counter = 0

    def _as_owner(self, *command: str) -> list[str]:
        return ["runuser", "-u", SUPERUSER, "--", *command] if os.geteuid() == 0 else list(command)

    def _run(self, *command: str) -> None:
        done = subprocess.run(self._as_owner(*command), capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{Path(command[0]).name} failed: {(done.stderr or done.stdout).strip()[-2000:]}")

    def start(self) -> PostgresServer:
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SUPERUSER)
            for path in (self.root, self.socket_dir):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        options = f"-k {self.socket_dir} -c listen_addresses='' -c fsync=off -c full_page_writes=off " \
                  "-c max_connections=200"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"),
                  "-w", "-t", "60", "start")
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run(self._as_owner(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                                          "stop"), capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={self.socket_dir}"

    def new_database(self, prefix: str = "test") -> str:
        """A new empty database; its URL."""
        import psycopg

        self.counter += 1
        name = f"{prefix}_{os.getpid()}_{self.counter}"
        with psycopg.connect(host=str(self.socket_dir), user=SUPERUSER, dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
