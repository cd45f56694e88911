"""The dashboard in a real browser: `streamlit run` on a free port against a seeded database, driven by headless
Chromium (Debian's package, scripts/setup-debian.sh) through Playwright. Screenshots of every page go to
$WORKBENCH_SCREENSHOTS (default: a temporary folder)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (scripts/setup-debian.sh installs it)", allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402
from seed import MODEL, seed  # noqa: E402

from workbench.models import get_model  # noqa: E402
from workbench.resources import dashboard_app  # noqa: E402
from workbench.status import block_status  # noqa: E402
from workbench.store import get_engine, records  # noqa: E402

pytestmark = pytest.mark.e2e
expect.set_options(timeout=60_000)  # the first script run imports torch; CI machines can be slow

APP = dashboard_app()
# Without the background-networking flags Chromium's own connections are refused in bulk here (PRACTICES.md).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
READY = "[data-testid='stApp'][data-test-script-state='notRunning']"
WIDTH = 1400


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    return seed(tmp_path_factory.mktemp("dashboard"))


@pytest.fixture(scope="module")
def server(seeded, tmp_path_factory):
    """`streamlit run workbench/dashboard/app.py` on a free port, up once /_stcore/health answers "ok"."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    env = {**os.environ, "WORKBENCH_DB": seeded.db_url, "WORKBENCH_OPERATORS": str(seeded.operators_dir)}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true", "--server.port",
             str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
             "--server.fileWatcherType", "none", "--client.toolbarMode", "minimal"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit did not answer on {url}:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": WIDTH, "height": 1600})
    context.set_default_timeout(60_000)
    yield context.new_page()
    context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("WORKBENCH_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def settle(page: Page, title: str) -> None:
    """Wait for the page's title, the end of the script run, and every table and chart drawn."""
    expect(page.locator("h1").filter(has_text=title).first).to_be_visible()
    page.wait_for_selector(READY)
    page.wait_for_function("() => !document.querySelector(\"[data-testid='stSkeleton']\")")
    page.wait_for_function("() => [...document.querySelectorAll(\"[data-testid='stVegaLiteChart']\")]"
                           ".every(c => c.querySelector('canvas, svg'))")
    page.wait_for_timeout(300)  # let the charts' transitions finish before a screenshot


def screenshot(page: Page, shots: Path, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main container, so grow the viewport to the content first."""
    height = page.evaluate("() => document.querySelector(\"[data-testid='stMain']\")?.scrollHeight || 1600")
    page.set_viewport_size({"width": WIDTH, "height": max(900, min(int(height) + 40, 6000))})
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / f"{name}.png"))
    assert (shots / f"{name}.png").stat().st_size > 10_000


def grid_text(page: Page) -> str:
    """The text of every dataframe cell (Glide keeps an accessible copy of the canvas grid in the DOM)."""
    return " | ".join(page.locator("[data-testid='stDataFrame'] [role='gridcell']").all_text_contents())


def open_page(page: Page, label: str) -> None:
    page.locator("[data-testid='stSidebarNav']").get_by_role("link", name=label).click()


def test_overview_then_block_page(page, server, seeded, shots):
    page.goto(server)
    settle(page, "Port overview")
    screenshot(page, shots, "1-overview")
    cells = grid_text(page)
    # a promoted block shows its strongest evidence beside its status (the seeded operator was never compiled).
    # situ's status is read, not assumed: the live-run test (any order) starts a situ run in the shared store
    assert "rmsnorm | promoted | interpreter only" in cells
    engine = get_engine(seeded.db_url)
    for block in get_model(MODEL).blocks:  # every block the card needs, with the status the CLI would show
        assert f"{block} | {block_status(engine, seeded.operators_dir, block)[0]}" in cells, block
    expect(page.get_by_text("1 regression")).to_be_visible()
    assert seeded.running_run in cells

    page.locator("[data-testid='stPageLink']").get_by_role("link", name="rmsnorm", exact=True).click()
    settle(page, "rmsnorm")
    screenshot(page, shots, "2-block")
    assert "block=rmsnorm" in page.url
    cells = grid_text(page)
    assert "row_block" in cells and "BLOCK_N=8192, ACC_DTYPE=float16" in cells
    assert "rows=7,N=4097" in cells and "float16" in cells  # error figures per shape and dtype
    expect(page.get_by_text("ACC_DTYPE=float32.", exact=False).first).to_be_visible()  # the diff
    expect(page.get_by_text("precision: float16 errors up to", exact=False)).to_be_visible()  # the trace's reason


def test_replays_ci_and_runs_pages(page, server, seeded, shots):
    page.goto(server)
    settle(page, "Port overview")
    open_page(page, "Replays")
    settle(page, "Loss-curve replays")
    screenshot(page, shots, "3-replays")
    assert "scratch" in grid_text(page)
    expect(page.get_by_text("steps outside the band")).to_be_visible()

    open_page(page, "Performance")
    settle(page, "Performance")
    screenshot(page, shots, "4-performance")
    cells = grid_text(page)
    assert "modelled" in cells and "measured" in cells and "eager" in cells

    open_page(page, "CI")
    settle(page, "CI")
    screenshot(page, shots, "4-ci")
    cells = grid_text(page)
    assert "9e8d7c6" in cells and "passed before, now fails" in cells

    open_page(page, "Runs")
    settle(page, "Agent runs")
    screenshot(page, shots, "5-runs")
    cells = grid_text(page)
    assert seeded.promoted_run in cells and seeded.blocked_run in cells and seeded.running_run in cells


def test_runs_page_follows_a_run_while_it_runs(page, server, seeded, shots):
    """Steps and runs written while the page is open show up without a reload (st.fragment run_every)."""
    page.goto(f"{server}/runs")
    settle(page, "Agent runs")
    running = page.locator("[data-testid='stMetric']").filter(has_text="running")
    expect(running.locator("[data-testid='stMetricValue']")).to_have_text("1")

    engine = get_engine(seeded.db_url)
    records.add_step(engine, seeded.running_run, "contract", "ok: parses, written while the page was open")
    expect(page.locator("li").filter(has_text="written while the page was open")).to_be_visible(timeout=15_000)

    new_run = records.start_run(engine, block="situ", proposer="search", backend="interpreter", budget=3,
                                config={}, model="kimi-k3.1-pro")
    records.add_step(engine, new_run, "plan", "templates: rows (rank 1), flat (rank 2); a brand-new run")
    expect(running.locator("[data-testid='stMetricValue']")).to_have_text("2", timeout=15_000)
    page.wait_for_function("id => [...document.querySelectorAll(\"[data-testid='stDataFrame'] [role='gridcell']\")]"
                           ".some(cell => cell.textContent.includes(id))", arg=new_run)
    settle(page, "Agent runs")
    screenshot(page, shots, "6-runs-live")
