"""`pip install .` (not editable) into a fresh virtual environment: the installed workbench, run from a folder outside
the checkout, finds its package data through importlib.resources. The model cards load, `workbench port rmsnorm`
renders a template, verifies, compiles for sm_90a and promotes, and `workbench dashboard` serves the app, which
headless Chromium renders with the port's result.

The fresh environment installs only the workbench wheel, built from a copy of the package sources; its third-party
dependencies are the ones already installed for the suite (one .pth line to their site-packages), so nothing is
downloaded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.interpreter, pytest.mark.slow]

CHECKOUT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A venv with the workbench installed from a wheel, a working folder outside the checkout, and its env."""
    root = tmp_path_factory.mktemp("packaging")
    src = root / "src"
    shutil.copytree(CHECKOUT / "workbench", src / "workbench", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(CHECKOUT / name, src / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "suite-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-build-isolation", str(src)], check=True, capture_output=True, text=True)
    shutil.rmtree(src)  # nothing of the sources is left to be found but the installed package
    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKBENCH_", "PYTHON"))}
    env.update(WORKBENCH_DB=f"sqlite:///{work / 'workbench.db'}", WORKBENCH_REPLAY_STEPS="0",
               WORKBENCH_COMPILE_CACHE=os.environ.get("WORKBENCH_COMPILE_CACHE", str(work / "compile-cache")))
    return {"venv": venv, "python": python, "work": work, "env": env, "purelib": Path(purelib)}


def run(installed: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(installed["venv"] / "bin" / "workbench"), *args], cwd=installed["work"],
                          env=installed["env"], capture_output=True, text=True, timeout=timeout)


def test_the_installed_package_carries_its_data_and_ports_a_block(installed):
    where = subprocess.run([str(installed["python"]), "-c", "import workbench.resources as r, workbench; "
                            "print(workbench.__file__); print(r.templates_root()); print(r.dashboard_app())"],
                           cwd=installed["work"], env=installed["env"], capture_output=True, text=True, check=True)
    package, templates, app = (Path(line) for line in where.stdout.split())
    assert package.is_relative_to(installed["purelib"]) and templates.is_relative_to(installed["purelib"])
    assert (templates / "rmsnorm" / "row_block.py.j2").is_file() and (templates / "_launch.j2").is_file()
    assert app.is_file() and (app.parent / "views" / "overview.py").is_file()

    models = run(installed, "models", "--json")
    assert models.returncode == 0, models.stderr
    assert "kimi-k3.1-pro" in {m["name"] for m in json.loads(models.stdout)}

    port = run(installed, "port", "rmsnorm", "--suites", "smoke", "--seeds", "1", "--dtypes", "float32",
               "--targets", "sm_90a")
    assert port.returncode == 0, port.stdout + port.stderr
    assert "promoted rmsnorm" in port.stdout and "compiles on 1/1 targets" in port.stdout
    (operator,) = (installed["work"] / "operators" / "rmsnorm").glob("rmsnorm_row_block_*.py")
    assert operator.read_text().startswith('"""rmsnorm candidate rendered from templates/rmsnorm/row_block.py.j2.')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup-debian.sh installs it)")
def test_the_installed_dashboard_serves_the_app(installed):
    from playwright.sync_api import expect, sync_playwright

    if not (installed["work"] / "workbench.db").is_file():  # this test alone: a database with one run in it
        assert run(installed, "port", "rmsnorm", "--suites", "smoke", "--seeds", "1", "--dtypes", "float32",
                   "--targets", "none").returncode == 0
    port = free_port()
    log = installed["work"] / "dashboard.log"
    with open(log, "w") as out:
        server = subprocess.Popen([str(installed["venv"] / "bin" / "workbench"), "dashboard", "--port", str(port)],
                                  cwd=installed["work"], env=installed["env"], stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # `workbench dashboard` runs streamlit as its child
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(url)
            expect(page.locator("h1").filter(has_text="Port overview").first).to_be_visible(timeout=90_000)
            expect(page.get_by_text("rmsnorm").first).to_be_visible(timeout=30_000)
            assert "Traceback" not in page.content()
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
