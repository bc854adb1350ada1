"""The dashboard in a real browser, on a real demo run: `blkpilot demo` benchmarks the stock
schedulers on its lab loop devices and runs the nightly job (in-process: Ray is made
unreachable, and the demo falls back); headless Chromium (Debian's, driven
by Playwright) then signs in as an operator, goes from the fleet overview to a device, accepts
its recommendation — a canary tries it on the device, which keeps it (applied on the device,
then reverted in one step to what it ran, unmanaged) or goes back by itself — and finds every
step on the fleet's audit page; signed in as a viewer it sees the actions disabled and is
refused when it submits one anyway. Every chart on the way is checked as shown: at the size it
is drawn, no label outside it or over another. Screenshots of each step go to
.artifacts/dashboard/ (or BLKPILOT_ARTIFACTS_DIR)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proc import BLKPILOT, clean_env, free_port, stop

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("BLKPILOT_ARTIFACTS_DIR", ROOT / ".artifacts")) / "dashboard"
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# each chart as drawn (its own width) and as shown, and its text: outside the chart, or
# overlapping other text, is a label the operator cannot read
CHART_LAYOUT = """() => [...document.querySelectorAll('figure.chart svg')].map(svg => {
  const box = svg.getBoundingClientRect();
  const texts = [...svg.querySelectorAll('text')].map(t => t.getBoundingClientRect())
    .filter(r => r.width > 0 && r.height > 0);
  const outside = texts.filter(r => r.left < box.left - 1 || r.right > box.right + 1
    || r.top < box.top - 1 || r.bottom > box.bottom + 1).length;
  let overlapping = 0;
  texts.forEach((a, i) => texts.slice(i + 1).forEach(b => {
    const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (w > 2 && h > 2) overlapping += 1;
  }));
  return {label: svg.closest('figure').getAttribute('aria-label'), drawn: svg.width.baseVal.value,
          shown: box.width, outside, overlapping,
          smallest: Math.min(...texts.map(r => r.height))};
})"""


def wait_until_applied(page: Any, scheduler: str) -> None:
    """The device page, reloaded until the agent has applied the policy and reported it."""
    from playwright.sync_api import expect

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        page.reload()
        pill = page.get_by_test_id("policy").locator(".pill")
        if page.get_by_test_id("current-scheduler").inner_text() == scheduler and (
            pill.count() and pill.first.inner_text() == "applied"
        ):
            break
        time.sleep(1)
    expect(page.get_by_test_id("current-scheduler")).to_have_text(scheduler)
    expect(page.get_by_test_id("policy").locator(".pill")).to_have_text("applied")


def assert_charts_read_at_a_glance(page: Any) -> int:
    """Every chart on the page shown at the size it is drawn (not shrunk: text stays about
    12 px), with no label outside it or over another."""
    charts = page.evaluate(CHART_LAYOUT)
    for chart in charts:
        assert 0.95 <= chart["shown"] / chart["drawn"] <= 1.05, chart
        assert chart["outside"] == 0, chart
        assert chart["overlapping"] == 0, chart
        assert chart["smallest"] >= 9, chart  # px: the 614 px charts shrunk theirs to ~5
    return len(charts)


class Demo:
    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                BLKPILOT,
                "demo",
                "--port",
                str(self.port),
                "--agent-metrics-port",
                str(free_port()),
                "--agent-interval",
                "1",
                "--tune-seconds",
                "0.3",
            ],
            # no Ray to be had (RAY_ADDRESS=auto and none running): the demo must still reach
            # its recommendations, with the nightly job in-process, as on a host too busy for
            # Ray's start (test_nightly runs the job on a local Ray). RAY_TMPDIR of its own:
            # "auto" would otherwise join the cluster another test has started meanwhile
            # (/tmp/ray/ray_current_cluster) and hang once that test stops it
            env={
                **clean_env(data_dir),
                "RAY_ADDRESS": "auto",
                "RAY_TMPDIR": str(data_dir / "ray"),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if line.strip() == "blkpilot demo recommendations ready":
                break
        else:
            raise AssertionError("the demo ended before recommending:\n" + "\n".join(self.lines))
        self.admin = (data_dir / "admin.token").read_text().strip()

    def token(self, role: str) -> str:
        response = httpx.post(
            f"{self.base}/api/v1/api-tokens",
            json={"name": f"{role}-{time.time_ns()}", "role": role},
            headers={"Authorization": f"Bearer {self.admin}"},
        )
        assert response.status_code == 201, response.text
        return str(response.json()["token"])

    def api(self, path: str, **params: Any) -> Any:
        response = httpx.get(
            f"{self.base}/api/v1{path}",
            params=params,
            headers={"Authorization": f"Bearer {self.admin}"},
        )
        response.raise_for_status()
        return response.json()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    running = Demo(tmp_path_factory.mktemp("demo"))
    yield running
    assert stop(running.process, signal.SIGINT) == 0


def test_operator_accepts_a_recommendation_and_a_viewer_cannot(demo: Demo) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium")
    assert chromium is not None, "Debian's chromium package (make test installs it)"
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    proposed = demo.api("/recommendations", status="proposed")
    assert proposed, "the demo's nightly job proposed nothing"
    assert any("running it in-process" in line for line in demo.lines), demo.lines
    # each long step says what it is and how long it took; inside them, the job and the canary
    # say where they are (their lines in the tuning log, which the demo names)
    steps = [line for line in demo.lines if re.match(r"blkpilot demo: \[\d+/\d+\] ", line)]
    assert any("benchmarking" in line for line in steps), demo.lines
    assert sum("done in" in line for line in steps) >= 4, steps
    (named,) = [line for line in demo.lines if "(log " in line]
    log = Path(named.rsplit("(log ", 1)[1].rstrip(")")).read_text()
    assert re.search(r"blkpilot \[ *\d+ s\] nightly: models trained: \d+ of \d+", log), log[-3000:]
    assert re.search(r"blkpilot \[ *\d+ s\] live canary on \w+: \d+ I/Os per second", log)
    operator, viewer = demo.token("operator"), demo.token("viewer")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})

        # signed out, the dashboard asks for a token
        page.goto(f"{demo.base}/ui/")
        expect(page).to_have_url(f"{demo.base}/ui/login?next=/ui/")
        page.get_by_label("API token").fill(operator)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_test_id("who")).to_contain_text("operator")
        table = page.get_by_test_id("recommendations")
        expect(table).to_be_visible()
        assert page.locator("figure.chart").count() >= 3  # class, scheduler, completion mode
        assert assert_charts_read_at_a_glance(page) >= 3
        page.screenshot(path=ARTIFACTS / "1-overview.png", full_page=True)

        # the largest predicted gain first (each row's lead objective; estimated energy's gains
        # can lead the list)
        shown = table.locator("[data-testid=gain] > span:first-child").all_inner_texts()
        gains = [0.0 if g.startswith("±") else float(g.split()[0]) for g in shown]
        assert gains == sorted(gains, reverse=True), gains
        # a change for the disk-backed device the demo started on bfq (what the model recommends
        # for it varies with the host's speed that day: another scheduler, or bfq with other
        # tunables — a CI run recommended bfq without idling); its "now" is the fourth cell.
        # Its own live canary can refute it on a busy host (a CI run: "1 refuted by their
        # canary", no longer open, as it should be): then the first change still open
        now_bfq = page.locator("td:nth-child(4)", has_text=re.compile(r"^bfq\b"))
        changes = table.locator("tr").filter(has=page.locator("td.config"))
        expect(changes.first).to_be_visible()
        on_bfq = table.locator("tr").filter(has=now_bfq)
        first = (on_bfq if on_bfq.count() else changes).first
        if on_bfq.count():
            expect(first.locator("td.config").first).to_have_text(re.compile(r"^bfq\b"))
        current = first.locator("td.config").first.inner_text()
        before = current.split()[0]  # the scheduler the device runs, to come back to
        expect(first.locator("td.config").nth(1)).not_to_have_text(current)
        # predicted better, or level where only the papers' priors favour it (with a CPU hog the
        # demo's depth-1 sweep cannot tell bfq's idling from none: ±0.0 %, "same"); never worse
        gain = first.get_by_test_id("gain").locator("span").first
        expect(gain).to_have_class(re.compile(r"^(better|same)$"))
        expect(gain).to_have_text(re.compile(r"^(\+\d|±0\.0)"))
        expect(page.get_by_test_id("keeps")).to_be_attached()  # the rest keep what they run

        # to that device
        first.get_by_role("link").click()
        expect(page.get_by_test_id("current-scheduler")).to_have_text(before)
        expect(page.get_by_test_id("recommendation").first).to_be_visible()
        charts = page.get_by_test_id("benchmark-charts").locator("figure.chart")
        assert charts.count() >= 3  # p50, p99, IOPS per configuration, from the sweep
        assert assert_charts_read_at_a_glance(page) >= 5  # and the telemetry's timelines
        expect(page.get_by_test_id("audit")).not_to_contain_text("policy.set")
        device_url = page.url
        device_id = device_url.rsplit("/", 1)[-1].split("?")[0]
        page.screenshot(path=ARTIFACTS / "2-device.png", full_page=True)

        # accept it: a one-device rollout tries it under a canary, and keeps it only if it
        # passes; the card says it is being verified, and links to the rollout
        card = page.get_by_test_id("recommendation").first
        card.get_by_label("reason to accept").fill("looks right on the lab device")
        card.get_by_label("soak seconds").fill("5")
        card.get_by_role("button", name="Accept and verify").click()
        expect(page.get_by_role("status")).to_contain_text("verifying")
        (verifying,) = demo.api("/recommendations", device_id=device_id, status="verifying")
        assert verifying["decided_by"].startswith("token:operator-")
        assert verifying["rollout_id"]
        expect(page.get_by_test_id("verification").first).to_contain_text(
            "Being tried under a canary"
        )
        page.screenshot(path=ARTIFACTS / "3-verifying.png", full_page=True)
        device_name = demo.api(f"/devices/{device_id}")["name"]
        scheduler = Path(f"/sys/block/{device_name}/queue/scheduler")
        ended = verifying
        deadline = time.monotonic() + 600
        while ended["status"] == "verifying" and time.monotonic() < deadline:
            time.sleep(2)
            ended = demo.api(f"/recommendations/{verifying['id']}")
        assert ended["status"] in ("kept", "rolled_back"), ended["status"]
        rollout = demo.api(f"/rollouts/{verifying['rollout_id']}")
        page.reload()
        if ended["status"] == "kept":
            # its canary passed on this device: the policy, applied by the node's agent
            assert rollout["status"] == "succeeded", rollout["status_detail"]
            expect(page.get_by_test_id("verification").first).to_contain_text("Kept")
            wanted = ended["recommended_config"]["scheduler"]
            tunables = ended["recommended_config"].get("scheduler_tunables") or {}
            wait_until_applied(page, wanted)
            assert f"[{wanted}]" in scheduler.read_text()  # on the device, not only the page
            iosched = Path(f"/sys/block/{device_name}/queue/iosched")
            for name, value in tunables.items():
                assert int((iosched / name).read_text()) == value, name
            page.screenshot(path=ARTIFACTS / "4-kept.png", full_page=True)
            # undo in one step: back to exactly what it ran, and unmanaged, as it was
            undo = page.get_by_test_id("recommendation").filter(has_text="Kept")
            undo.get_by_label("reason to revert").fill("undo the lab change")
            undo.get_by_role("button", name="Revert").click()
            expect(page.get_by_role("status")).to_contain_text("reverted")
            rollout = demo.api(f"/rollouts/{verifying['rollout_id']}")
            while rollout["status"] == "rolling_back" and time.monotonic() < deadline:
                time.sleep(1)
                rollout = demo.api(f"/rollouts/{verifying['rollout_id']}")
            assert rollout["status"] == "rolled_back", rollout["status_detail"]
            assert demo.api(f"/recommendations/{verifying['id']}")["status"] == "reverted"
            trail: tuple[str, ...] = (
                "recommendation.accepted",
                "recommendation.kept",
                "recommendation.reverted",
            )
        else:
            # its canary did not prove it here (this device, this host's load): put back by
            # itself, and the card says so
            assert rollout["status"] == "rolled_back", rollout["status_detail"]
            expect(page.get_by_test_id("verification").first).to_contain_text("Rolled back")
            page.screenshot(path=ARTIFACTS / "4-kept.png", full_page=True)
            trail = ("recommendation.accepted", "recommendation.rolled_back")
        assert f"[{before}]" in scheduler.read_text()  # the device runs what it ran
        response = httpx.get(
            f"{demo.base}/api/v1/devices/{device_id}/policy",
            headers={"Authorization": f"Bearer {demo.admin}"},
        )
        assert response.status_code == 404  # and blkpilot holds no policy over it
        # the fleet's audit page, filtered to the recommendation: every step, with its reason
        page.goto(f"{demo.base}/ui/audit")
        page.get_by_label("target").fill(verifying["id"])
        page.get_by_role("button", name="Filter").click()
        audit_log = page.get_by_test_id("audit-log")
        for action in (*trail, "looks right on the lab device"):
            expect(audit_log).to_contain_text(action)
        page.screenshot(path=ARTIFACTS / "3b-reverted-audit.png", full_page=True)

        # a viewer: the actions are disabled, and refused when submitted anyway
        page.get_by_role("button", name="Sign out").click()
        page.get_by_label("API token").fill(viewer)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_test_id("who")).to_contain_text("viewer")
        others = demo.api("/recommendations", status="proposed")
        assert others, "another device's recommendation is still open"
        other = others[0]
        page.goto(f"{demo.base}/ui/devices/{other['device_id']}")
        expect(page.get_by_test_id("viewer-note").first).to_be_visible()
        expect(page.get_by_role("button", name="Accept").first).to_be_disabled()
        page.screenshot(path=ARTIFACTS / "5-viewer.png", full_page=True)
        page.evaluate("document.querySelectorAll('button, input').forEach(e => e.disabled = false)")
        page.get_by_role("button", name="Accept").first.click()
        expect(page.get_by_test_id("refused")).to_contain_text("needs the operator role")
        page.screenshot(path=ARTIFACTS / "6-viewer-refused.png", full_page=True)
        browser.close()

    still = demo.api(f"/recommendations/{other['id']}")
    assert still["status"] == "proposed"  # nothing changed
    response = httpx.get(
        f"{demo.base}/api/v1/devices/{other['device_id']}/policy",
        headers={"Authorization": f"Bearer {demo.admin}"},
    )
    assert response.status_code == 404
    shots = sorted(p.name for p in ARTIFACTS.glob("*.png"))
    assert shots == [
        "1-overview.png",
        "2-device.png",
        "3-verifying.png",
        "3b-reverted-audit.png",
        "4-kept.png",
        "5-viewer.png",
        "6-viewer-refused.png",
    ]


def test_the_api_docs_render_with_no_other_host_reachable(demo: Demo) -> None:
    """/docs (Swagger UI) and /redoc render from the service's own assets with every request
    to any other host refused: they were blank on a machine without internet (a CDN)."""
    from playwright.sync_api import Route, expect, sync_playwright

    chromium = shutil.which("chromium")
    assert chromium is not None, "Debian's chromium package (make test installs it)"
    refused: list[str] = []

    def only_the_service(route: Route) -> None:
        if route.request.url.startswith(demo.base):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.route("**/*", only_the_service)
        page.goto(f"{demo.base}/docs")
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("blkpilot", timeout=30_000)
        expect(page.locator(".opblock").first).to_be_visible()
        response = page.goto(f"{demo.base}/redoc")
        assert response is not None
        assert "img-src 'self'" in response.headers["content-security-policy"]
        expect(page.get_by_text("Control plane for tuning Linux block I/O").first).to_be_visible(
            timeout=30_000
        )
        page.wait_for_load_state("networkidle")  # the footer's logo is asked for after render
        browser.close()
    # ReDoc's footer asks a CDN for a logo: the pages' Content-Security-Policy keeps the
    # browser from even trying (it would hang until a timeout on a machine without internet)
    assert not refused, refused
