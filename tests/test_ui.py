"""The Prefect UI in real headless chromium (Debian's package, driven by Playwright's Python package, no
downloaded browser): log in with the auth string, see both deployments on /deployments, and a completed
run's metrics table on /artifacts/artifact/{id}. Screenshots go to the test's temporary folder."""

import json
import os
import re
import shutil
import time

import pytest

pytest.register_assert_rewrite("prefect_ops")
from prefect_ops import AUTH, EXPERIMENT  # noqa: E402

pytest_plugins = ["prefect_ops"]
pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("REGIMEN_CHROMIUM", "/usr/bin/chromium")
# headless, no GPU, and nothing but 127.0.0.1 resolves: the UI bundle's analytics cannot stall the page
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


def require_browser():
    """In CI (CI=true) a missing browser fails the test; elsewhere it skips with the reason."""
    missing = []
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        missing.append(f"chromium not found at {CHROMIUM} (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append(
            "the playwright package is not installed (pip install playwright; no `playwright install` needed)"
        )
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("; ".join(missing))
        pytest.skip("; ".join(missing))


@pytest.fixture(scope="session")
def browser_available():
    require_browser()  # session-scoped, so it runs before the (slow, session-scoped) scenario: a skip costs nothing


@pytest.fixture
def browser_page(tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(45_000)
            yield page
        finally:
            context.close()


def test_ui_shows_the_deployments_and_a_completed_runs_metrics(browser_available, scenario, browser_page, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    server, page = scenario.server, browser_page
    run = scenario.retried
    assert run["state"]["type"] == "COMPLETED"
    [table] = [a for a in server.artifacts(run["id"]) if a["key"] == f"{EXPERIMENT}-eval"]
    data = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
    expected = {row["metric"]: row["value"] for row in data}

    t0 = time.monotonic()
    page.goto(f"{server.url}/deployments")
    # the server has basic auth on: the UI asks for the auth string once, then calls the API with it
    page.wait_for_url(re.compile(r"/login"))
    page.get_by_placeholder("admin:pass").fill(AUTH)
    page.get_by_role("button", name="Login").click()
    page.wait_for_url(re.compile(r"/deployments$"))
    for _attempt in range(3):  # on a loaded machine one of the UI's API calls can fail ("Something went wrong"): reload
        try:
            for name in ("on-demand", "nightly", "regimen-cycle"):
                page.get_by_text(name, exact=True).first.wait_for(timeout=20_000)
            break
        except PlaywrightTimeout:
            page.reload()
    assert "regimen-cycle" in page.inner_text("body")
    page.screenshot(path=str(tmp_path / "deployments.png"), full_page=True)

    page.goto(f"{server.url}/artifacts/artifact/{table['id']}")
    # a metric whose value cannot be mistaken for another cell: the largest non-integer one
    # every value a whole number (e.g. 0.0 and 40.0): the size is unambiguous
    metric = max(
        (k for k, v in expected.items() if isinstance(v, float) and v != int(v)),
        key=lambda k: expected[k],
        default="heldout_size",
    )
    for name in ("heldout_accuracy", metric):
        row = page.locator("tr", has_text=name).first
        row.wait_for()
        cells = [c.strip() for c in row.inner_text().split("\t") if c.strip()]
        assert cells[0] == name and float(cells[-1]) == pytest.approx(expected[name], abs=1e-4), (name, cells)
    page.screenshot(path=str(tmp_path / "artifact.png"), full_page=True)

    # plots are shown in the UI itself: a markdown artifact holding the PNG as a data: image
    plots = [a for a in server.artifacts(run["id"], "markdown") if a["key"] == f"{EXPERIMENT}-plot-heldout-accuracy"]
    plot = max(plots, key=lambda a: a["created"])  # one version per verdict published in the run; the newest
    page.goto(f"{server.url}/artifacts/artifact/{plot['id']}")
    img = page.locator("img[src^='data:image/png;base64,']").first
    img.wait_for()
    assert page.evaluate("(el) => el.complete && el.naturalWidth", img.element_handle()) > 300
    page.screenshot(path=str(tmp_path / "plot.png"), full_page=True)

    # what each evaluation changed (issue 50): its counts, flags and first flips as markdown the UI renders
    changes = [a for a in server.artifacts(run["id"], "markdown") if a["key"] == f"{EXPERIMENT}-eval-changes"]
    newest = max(changes, key=lambda a: a["created"])
    page.goto(f"{server.url}/artifacts/artifact/{newest['id']}")
    page.get_by_text("paid_but_wrong", exact=True).first.wait_for()
    body = page.inner_text("body")
    assert "What eval v" in body and ("wrong → right" in body or "nothing to compare with" in body), body[:2000]
    assert "regimen trajectories" in body
    print(f"\nUI: login, deployments and artifact pages in {time.monotonic() - t0:.1f}s; screenshots in {tmp_path}")
    assert (tmp_path / "deployments.png").stat().st_size > 10_000 and (
        tmp_path / "artifact.png"
    ).stat().st_size > 10_000
