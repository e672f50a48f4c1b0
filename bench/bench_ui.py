"""The search page's cost over the API it calls (issue 32), in Chromium driven by Selenium.

    .venv/bin/python bench/bench_ui.py [--files 3000] [--seed 1] [--rounds 3] [--loads 20]

For the eval corpus (../shared/eval/qmd-eval/docs) and a generated corpus of --files files
(bench/corpus.py), each in a fresh isolated `qmdd`:

  (a) page load  `GET /` with its script, stylesheet and icon, cold (no cache, a new
                 navigation each time): Navigation Timing's load event, p50/p95 of --loads;
                 and the assets' total bytes
  (b) search     for each of bench_search.py's 20 queries, --rounds times, interleaved:
                 the bare `POST /v1/keyword` the page sends (a warm httpx client), and in
                 the page the time from submitting the box (Enter: no debounce) to the
                 results in the DOM, then to the next frame painted (a search that
                 changes nothing on screen draws none: counted, left out of that column)

The page's own cost is (b)'s page time minus its API time, p50 against p50. Figures only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import corpus as corpus_mod  # noqa: E402
from _common import ROOT, Daemon, Isolated, code_line, summary_ms, table, write_json  # noqa: E402
from bench_search import QUERIES  # noqa: E402

EVAL_DOCS = ROOT.parent / "shared" / "eval" / "qmd-eval" / "docs"
ASSETS = ("/", "/ui/ui.js", "/ui/ui.css", "/ui/icon.svg")
RESULTS = 20  # the page's limit (server/http/static/ui.js)

LOADED = "return performance.getEntriesByType('navigation')[0].loadEventEnd"
SEARCH = """
const [query, done] = arguments;
const results = document.getElementById('results');
const ready = () => results.dataset.query === query && !document.body.dataset.busy;
const t0 = performance.now();
const observer = new MutationObserver(() => {
  if (!ready()) return;
  observer.disconnect();
  const dom = performance.now() - t0;
  // headless Chromium skips the frame when nothing on screen changed (the same empty list)
  let sent = false;
  const finish = (painted) => sent || ((sent = true), done([dom, painted]));
  requestAnimationFrame(() => setTimeout(() => finish(performance.now() - t0)));
  setTimeout(() => finish(null), 500);
});
observer.observe(document.body, {subtree: true, childList: true, attributes: true});
const box = document.getElementById('q');
box.value = query;
box.dispatchEvent(new Event('input'));
document.getElementById('search-form').requestSubmit();
"""


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        sys.exit("Chromium is missing: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(arg)
    d = webdriver.Chrome(options=options, service=Service(driver))
    d.set_script_timeout(120)
    d.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
    return d


def measure(name: str, folder: Path, args: argparse.Namespace, driver: Any) -> dict[str, Any]:
    env = Isolated()
    daemon: Daemon | None = None
    try:
        daemon = Daemon(env)
        env.cli("collection", "add", str(folder), "--name", "bench")
        http = daemon.http
        assets = sum(len(http.get(path).content) for path in ASSETS)
        loads = []
        for _ in range(args.loads):
            driver.get("about:blank")
            driver.get(env.url + "/")
            while not (timing := driver.execute_script(LOADED)):
                time.sleep(0.01)
            loads.append(timing / 1000)
        api: list[float] = []
        dom: list[float] = []
        painted: list[float] = []
        for _, q in QUERIES:  # warm-up: connection, SQLite page cache, the page's first search
            http.post("/v1/keyword", json={"query": q, "limit": RESULTS, "filter": None}).raise_for_status()
            driver.execute_async_script(SEARCH, q + " ")
        hits = 0
        for _ in range(args.rounds):
            for _, q in QUERIES:
                t0 = time.perf_counter()
                r = http.post("/v1/keyword", json={"query": q, "limit": RESULTS, "filter": None})
                r.raise_for_status()
                api.append(time.perf_counter() - t0)
                hits += len(r.json()["results"])
                in_dom, on_screen = driver.execute_async_script(SEARCH, q)
                dom.append(in_dom / 1000)
                if on_screen is not None:
                    painted.append(on_screen / 1000)
        files = sum(1 for p in folder.rglob("*") if p.is_file())
        return {
            "corpus": name,
            "files": files,
            "assets_bytes": assets,
            "page_load": summary_ms(loads),
            "api": summary_ms(api),
            "page_dom": summary_ms(dom),
            "page_painted": summary_ms(painted),
            "unpainted": len(dom) - len(painted),
            "mean_hits": hits / (args.rounds * len(QUERIES)),
        }
    finally:
        if daemon is not None:
            daemon.stop()
        env.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the 20 queries")
    ap.add_argument("--loads", type=int, default=20, help="cold page loads")
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(code_line(), flush=True)
    generated = Path(tempfile.mkdtemp(prefix="qmd-bench-ui-")) / "corpus"
    corpus_mod.generate(generated, args.files, args.seed)
    driver = browser()
    try:
        rows = [measure("eval", EVAL_DOCS, args, driver), measure(f"generated {args.files}", generated, args, driver)]
    finally:
        driver.quit()
        shutil.rmtree(generated.parent, ignore_errors=True)
    print(
        table(
            ["corpus", "files", "assets KB", "load", "API p50", "DOM p50", "painted p50", "added p50", "painted p95"],
            [
                [
                    r["corpus"],
                    r["files"],
                    round(r["assets_bytes"] / 1024, 1),
                    r["page_load"]["p50_ms"],
                    r["api"]["p50_ms"],
                    r["page_dom"]["p50_ms"],
                    r["page_painted"]["p50_ms"],
                    round(r["page_painted"]["p50_ms"] - r["api"]["p50_ms"], 2),
                    r["page_painted"]["p95_ms"],
                ]
                for r in rows
            ],
            title="The search page against its API (ms)",
        )
    )
    for r in rows:
        if r["unpainted"]:
            print(f"{r['corpus']}: {r['unpainted']} searches drew no new frame (nothing changed on screen)")
    print(f"wrote {write_json('ui', {'results': rows})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
