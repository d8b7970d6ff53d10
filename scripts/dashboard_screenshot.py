"""A picture of the dashboard mid-burst, for the README: `figures/wallclock/dashboard.png`.

Starts `llmengine serve` on a cramped pool with prefix caching and a swap space, opens
`/dashboard` in headless Chromium (the distribution's, driven by Playwright), sends waves of
requests that share a prompt prefix and outgrow the pool, and takes the screenshot while the
pool is full, requests are swapped out or waiting, and the charts have a few seconds of
points. Needs `chromium` on PATH and Playwright (the dev extras).

Usage: dashboard_screenshot.py [--out figures/wallclock/dashboard.png]
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time

import httpx
from playwright.sync_api import sync_playwright

from llmengine.lessons.artifacts import figures_dir
from llmengine.lessons.live_server import LiveServer, live_server

MODEL = "tiny"
OPTIONS = ["--num-blocks", "96", "--block-size", "4", "--max-num-seqs", "12",
           "--preemption", "swap", "--swap-blocks", "24", "--enable-prefix-caching",
           "--served-model-name", MODEL]  # fmt: skip
PREFIX = "ROMEO:\nBut soft, what light through yonder window breaks? "
WAVES, PER_WAVE, MAX_TOKENS = 6, 8, 64


def waves(server: LiveServer) -> list[threading.Thread]:
    """Waves of requests half a second apart, started in the background."""

    def one(index: int) -> None:
        body = {"model": MODEL, "prompt": f"{PREFIX}{index}", "max_tokens": MAX_TOKENS,
                "ignore_eos": True}  # fmt: skip
        httpx.post(f"{server.api}/completions", json=body, timeout=120)

    threads = []
    for wave in range(WAVES):
        for index in range(PER_WAVE):
            thread = threading.Thread(target=one, args=(wave * PER_WAVE + index,), daemon=True)
            thread.start()
            threads.append(thread)
        time.sleep(0.5)
    return threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(figures_dir(wallclock=True) / "dashboard.png"))
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    with live_server(OPTIONS) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{server.url}/dashboard")
        page.wait_for_function("() => document.getElementById('status').className === 'live'")
        sender = threading.Thread(target=waves, args=(server,), daemon=True)
        sender.start()
        page.wait_for_selector("#timeline li.preempt", timeout=60_000)
        page.wait_for_timeout(2_000)  # a few seconds of points on the charts
        page.wait_for_function(
            "() => document.getElementById('swapped').dataset.count !== '0'", timeout=60_000
        )
        page.screenshot(path=args.out, full_page=True)
        browser.close()
        sender.join(120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
