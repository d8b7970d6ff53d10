"""The dashboard in a real browser: headless Chromium (the distribution's package, driven by
Playwright for Python, nothing downloaded) against a live `llmengine serve` process.

A burst of requests on a cramped pool preempts; the page must show it from the DOM: blocks
that change owner, a preemption on the timeline, the queues drained to empty, points on the
throughput chart. With `--api-key`, the key is typed into the page once and sent in a
header, never in a URL. `make test` installs Chromium (apt) and Playwright (the dev extras);
where it could not, these tests are skipped and say why.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmengine.lessons.live_server import LiveServer, live_server

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed (pip install -e '.[dev]')"
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on PATH (make test installs it: apt-get install chromium)"
)

MODEL = "tiny"
KEY = "sk-dashboard-5e1f0c"
# Twice the slots, so that requests admitted later take blocks the first ones held: 8 requests
# left a block seen with only 2 owners at best, and once, under a loaded make test, with 1 (the
# page sees the pool ten times a second); 16 leave 4 to 6.
BURST = 16
# 16 blocks of 4 tokens for 8 slots and 8 host blocks: requests of 5 + 24 tokens preempt.
POOL = ["--num-blocks", "16", "--block-size", "4", "--max-num-seqs", "8",
        "--preemption", "swap", "--swap-blocks", "8", "--served-model-name", MODEL]  # fmt: skip
WAIT_MS = 20_000

# Installed before the burst: for each block, the distinct requests seen holding it.
WATCH_OWNERS = """() => {
  window.seenOwners = {};
  new MutationObserver((changes) => {
    for (const change of changes) {
      const block = change.target;
      const owner = Number(block.dataset.owner);
      if (owner < 0) continue;
      const index = [...block.parentNode.children].indexOf(block);
      (window.seenOwners[index] ||= new Set()).add(owner);
    }
  }).observe(document.getElementById("pool"),
             {subtree: true, attributes: true, attributeFilter: ["data-owner"]});
}"""
MOST_OWNERS = "() => Math.max(0, ...Object.values(window.seenOwners).map((s) => s.size))"
DRAINED = f"""() => ["running", "waiting", "swapped"].every(
    (id) => document.getElementById(id).dataset.count === "0")
  && document.querySelectorAll("#timeline li.finished").length === {BURST}"""


def send_burst(server: LiveServer, headers: dict[str, str]) -> None:
    """`BURST` completions at once, each finishing with 200."""

    def one(index: int) -> None:
        body = {"model": MODEL, "prompt": f"ROMEO {index}:", "max_tokens": 24, "ignore_eos": True}
        response = httpx.post(f"{server.api}/completions", json=body, headers=headers, timeout=30)
        assert response.status_code == 200, response.text

    threads = [threading.Thread(target=one, args=(index,)) for index in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


def watch_a_burst(page: Any, server: LiveServer, headers: dict[str, str]) -> None:
    """Send the burst with the page live, and check what it shows from its DOM."""
    page.wait_for_function("() => document.getElementById('status').className === 'live'")
    page.evaluate(WATCH_OWNERS)
    send_burst(server, headers)
    page.wait_for_selector("#timeline li.preempt", timeout=WAIT_MS)
    page.wait_for_function(DRAINED, timeout=WAIT_MS)
    assert page.evaluate(MOST_OWNERS) >= 2, "no block changed owner"
    assert "evicted for #" in page.inner_text("#timeline")
    assert int(page.get_attribute("#chart-tps", "data-points")) > 0
    assert int(page.get_attribute("#chart-step", "data-points")) > 0
    blocks = page.eval_on_selector_all("#pool .block", "(bs) => bs.map((b) => b.dataset.owner)")
    assert blocks == ["-1"] * 16  # all free again


def test_the_page_shows_a_preempting_burst(browser: Any, tmp_path: Path) -> None:
    with live_server(POOL) as server:
        page = browser.new_page()
        page.goto(f"{server.url}/dashboard")
        watch_a_burst(page, server, {})
        page.screenshot(path=tmp_path / "dashboard.png", full_page=True)
        assert (tmp_path / "dashboard.png").stat().st_size > 0
        page.close()


def test_with_an_api_key_the_page_asks_once_and_never_puts_it_in_a_url(browser: Any) -> None:
    with live_server([*POOL, "--api-key", KEY]) as server:
        page = browser.new_page()
        requests: list[Any] = []
        page.on("request", lambda request: requests.append(request))
        page.goto(f"{server.url}/dashboard")
        page.wait_for_selector("#key-form.shown", timeout=WAIT_MS)
        page.fill("#api-key", KEY)
        page.click("#key-form button")
        watch_a_burst(page, server, {"Authorization": f"Bearer {KEY}"})
        assert page.evaluate(f"() => sessionStorage.getItem('llmengine-api-key') === '{KEY}'")
        feeds = [r for r in requests if r.url.endswith("/v1/engine/events")]
        assert len(feeds) >= 2  # refused without the key, then read with it
        assert "authorization" not in feeds[0].headers
        assert feeds[-1].headers["authorization"] == f"Bearer {KEY}"
        assert all(KEY not in request.url for request in requests)
        page.close()
