"""The daemon's search page (issue 32) in a real browser: Debian's Chromium, driven by Selenium
through chromedriver, against a real daemon. Screenshots of the main views are saved as
artifacts in each test's temporary folder (`pytest --basetemp=DIR` puts them in DIR)."""

from __future__ import annotations

import json
import math
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from conftest import MODELS_DIR, embedded_eval_and_notes, require, unavailable, write
from harness import Daemon, Env

pytestmark = pytest.mark.slow

WAIT_S = 60.0
HOSTILE = "evil.test"
"""A foreign origin the browser resolves to loopback (`--host-resolver-rules`), so a page
from it is a different site that can still reach the daemon's port."""

NOTES = {
    "fundraising.md": "# Raising a seed round\n\nIntro line.\n\n## Investors\n\nAngel investors fund early startups.\n"
    "We raise money from angels and VCs.\nKeep the pitch deck short.\n",
    "published.md": "---\nqmd:\n  metadata:\n    status: published\n---\n# Launch money\n\nThe launch budget: money.\n",
    "draft.md": "---\nqmd:\n  metadata:\n    status: draft\n---\n# Draft money\n\nA draft about money.\n",
    "cooking/bread.md": "# Sourdough bread\n\nMix flour, water and salt.\nBake at 230C for 40 minutes.\n",
}


# -- the browser ---------------------------------------------------------------------


class Page:
    """The driver, with the few moves these tests make."""

    def __init__(self, driver: Any, shots: Path) -> None:
        self.driver = driver
        self.shots = shots

    def get(self, url: str) -> None:
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait(self, condition: Callable[[], Any], what: str) -> Any:
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, WAIT_S).until(lambda _: condition())
        except TimeoutException:
            raise AssertionError(f"timed out waiting for {what}; page text:\n{self.text('body')}") from None

    def shown(self, element_id: str) -> bool:
        from selenium.webdriver.common.by import By

        return bool(self.driver.find_element(By.ID, element_id).is_displayed())

    def text(self, css: str) -> str:
        return str(self.js("const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css))

    def texts(self, css: str) -> list[str]:
        return list(self.js("return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", css))

    def click(self, css: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver.find_element(By.CSS_SELECTOR, css).click()

    def choose(self, css: str, label: str) -> None:
        """Pick the option shown as `label` in the select at `css`, as a person would."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        Select(self.driver.find_element(By.CSS_SELECTOR, css)).select_by_visible_text(label)

    def keys(self, *keys: str) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        ActionChains(self.driver).send_keys(*keys).perform()

    def results_for(self, query: str) -> list[tuple[str, str]]:
        """The hits painted for `query`: (file, lines) of each, once the answer is in."""
        self.wait(
            lambda: self.js(
                "const r = document.getElementById('results');"
                "return r.dataset.query === arguments[0] && !document.body.dataset.busy",
                query,
            ),
            f"results for {query!r}",
        )
        rows = self.js(
            "return [...document.querySelectorAll('#results .hit')].map(h => [h.dataset.file, h.dataset.lines])"
        )
        return [(file, lines) for file, lines in rows]

    def doc_lines(self) -> list[str]:
        """The open range as `N: text`, the way `qmd get` numbers it."""
        self.wait(lambda: self.js("return document.querySelectorAll('#doc-lines li[data-n]').length > 0"), "the range")
        rows = self.js(
            "return [...document.querySelectorAll('#doc-lines li')]"
            ".map(li => [li.dataset.n, li.querySelector('.text').textContent, li.classList.contains('matched')])"
        )
        return [f"{n}: {text}" + (" <matched>" if matched else "") for n, text, matched in rows]

    def shot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.shots / f"ui-{name}.png"))

    def console_errors(self) -> list[str]:
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is missing: pip install -e '.[test]'")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        unavailable("no Chromium to test the search page in: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
        f"--host-resolver-rules=MAP {HOSTILE} 127.0.0.1",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Page]:
    browser.delete_all_cookies()
    browser.set_window_size(1200, 900)
    browser.get_log("browser")  # the last test's messages
    yield Page(browser, tmp_path)
    browser.get("about:blank")


@pytest.fixture
def notes_daemon(env: Env, daemon: Daemon, tmp_path: Path) -> Env:
    env.ok("collection", "add", str(write(tmp_path / "notes", dict(NOTES))), "--name", "notes")
    return env


class Foreign(ThreadingHTTPServer):
    """A site of another origin: serves `page` and counts every request that reaches it."""

    def __init__(self, page: str) -> None:
        self.page = page.encode()
        self.hits: list[str] = []
        super().__init__(("127.0.0.1", 0), _ForeignHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def origin(self) -> str:
        return f"http://{HOSTILE}:{self.server_address[1]}"


class _ForeignHandler(BaseHTTPRequestHandler):
    server: Foreign

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.server.page)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign() -> Iterator[Callable[[str], Foreign]]:
    servers: list[Foreign] = []

    def start(page: str) -> Foreign:
        servers.append(Foreign(page))
        return servers[-1]

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def cli_get(env: Env, file: str, start: int, count: int) -> list[str]:
    """`qmd get FILE:FROM:COUNT`'s numbered lines, without its header."""
    out = env.ok("get", f"{file}:{start}:{count}")
    return out.split("---\n\n", 1)[1].rstrip("\n").split("\n")


# -- search ----------------------------------------------------------------------------


def test_a_search_typed_in_the_box_shows_the_clis_pointers_and_keeps_its_state_in_the_url(
    notes_daemon: Env, page: Page
) -> None:
    env = notes_daemon
    page.get(env.url + "/")
    page.click("#q")
    page.keys("raise money")
    hits = page.results_for("raise money")
    cli = env.json("search", "raise money", "--json")
    assert hits == [(h["file"], h["lines"]) for h in cli]
    page.wait(lambda: "q=raise+money" in page.driver.current_url, "the query in the URL")
    first = page.text("#results .hit")
    assert re.search(r"^\d+%", first) and "Raising a seed round" in first
    assert f"{cli[0]['file']}:" in first and f"lines {cli[0]['lines']}" in first
    assert page.texts("#results .hit:first-child mark")  # matched terms marked in the snippet
    page.shot("search")

    # The URL is the state: opened afresh, it shows the same search.
    page.get(env.url + "/?q=raise+money")
    assert page.results_for("raise money") == hits
    assert page.js("return document.getElementById('q').value") == "raise money"


def test_metadata_facets_and_collections_narrow_the_results(notes_daemon: Env, page: Page) -> None:
    env = notes_daemon
    page.get(env.url + "/?q=money")
    every = {file for file, _ in page.results_for("money")}
    assert {"qmd://notes/published.md", "qmd://notes/draft.md"} <= every
    page.wait(lambda: page.texts("#facets legend"), "the metadata facets")
    page.click('#facets input[data-value="status=\\"published\\""]')
    narrowed = page.results_for("money")
    assert [file for file, _ in narrowed] == ["qmd://notes/published.md"]
    page.wait(lambda: "f=status%3D%22published%22" in page.driver.current_url, "the facet in the URL")
    cli = env.json("search", "money", "--json", "--filter", '{"field":"status","operator":"eq","value":"published"}')
    assert narrowed == [(h["file"], h["lines"]) for h in cli]

    # A collection that does not exist: the daemon's 404, said on the page, nothing painted.
    page.get(env.url + "/?q=money&c=nope")
    assert page.results_for("money") == []
    assert "nope" in page.text("#notes")


def test_query_mode_shows_skipped_stages_as_the_cli_does(notes_daemon: Env, page: Page) -> None:
    """No vectors yet: the hybrid query still answers from keywords and says what it skipped."""
    env = notes_daemon
    page.get(env.url + "/?q=money&mode=query")
    assert page.results_for("money")
    cli = env.qmd("query", "money", "--json")
    notes = page.text("#notes")
    for line in cli.stderr.strip().splitlines():
        assert line in notes


# -- relevance ---------------------------------------------------------------------------

ON_TOPIC = "Series A fundraising"
OFF_TOPIC = "how long should I boil an egg for a runny yolk"
"""test_relevance.py's questions: the eval notes hold the one and nothing near the other."""


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon]]:
    """The eval notes embedded with the MiniLM test model, so a plain query is ranked by relevance."""
    env, d = embedded_eval_and_notes(tmp_path_factory.mktemp("ui-relevance"))
    yield env, d
    d.stop()


def percent(p: float) -> str:
    """A relevance as the page writes it (ui.js `percent`): truncated, one decimal under 10%."""
    v = p * 100 + 1e-9
    if v >= 10:
        return f"{math.floor(v)}%"
    return f"{math.floor(v * 10) / 10:.1f}%" if v >= 0.1 else "<0.1%"


def full_query(d: Daemon, text: str, **body: object) -> dict[str, Any]:
    """`/v1/query` as the page asks it (20 results, no filter), in the eval collection."""
    r = d.http.post("/v1/query", json={"query": text, "limit": 20, "filter": None, "collections": ["eval"], **body})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def test_a_full_query_shows_how_likely_each_hit_is_relevant(embedded: tuple[Env, Daemon], page: Page) -> None:
    env, d = embedded
    page.get(f"{env.url}/?{urlencode({'q': ON_TOPIC, 'mode': 'query', 'c': 'eval'})}")
    hits = page.results_for(ON_TOPIC)
    api = full_query(d, ON_TOPIC)["results"]
    assert hits == [(h["file"], f"{h['start_line']}-{h['end_line']}") for h in api]
    assert page.texts("#results .hit .relevance") == [f"relevance {percent(h['relevance'])}" for h in api]
    assert api[0]["relevance"] > 0.5 and page.text("#results .hit").startswith(
        f"relevance {percent(api[0]['relevance'])}"
    )
    # A plain query is ranked and scored by its relevance: one number per hit, explained on hover.
    assert page.texts("#results .hit .score") == []
    assert "how likely this result is relevant" in page.js("return document.querySelector('#results .relevance').title")
    assert page.shown("floor") and page.js("return document.getElementById('floor').value") == ""
    page.shot("query-relevance")

    # Keyword search has no relevance: its score as before, and no floor to set.
    page.get(f"{env.url}/?{urlencode({'q': ON_TOPIC, 'c': 'eval'})}")
    assert page.results_for(ON_TOPIC)
    assert re.search(r"^\d+%", page.text("#results .hit")) and page.texts("#results .relevance") == []
    assert not page.shown("floor")
    assert not page.console_errors()


def test_a_relevance_floor_above_every_hit_shows_the_closest_below_it(embedded: tuple[Env, Daemon], page: Page) -> None:
    env, d = embedded
    page.get(f"{env.url}/?{urlencode({'q': OFF_TOPIC, 'mode': 'query', 'c': 'eval'})}")
    assert len(page.results_for(OFF_TOPIC)) > 1  # no floor: every result, however unlikely
    page.choose("#floor", "relevance ≥ 50%")
    said = "No result above the relevance floor (50%); the closest:"
    page.wait(lambda: said in page.text("#notes"), "the floor's answer")
    hits = page.results_for(OFF_TOPIC)
    answer = full_query(d, OFF_TOPIC, min_relevance=0.5)
    closest = answer["closest"]
    assert answer["results"] == [] and closest["relevance"] < 0.5
    assert hits == [(closest["file"], f"{closest['start_line']}-{closest['end_line']}")]
    assert page.js("return document.querySelector('#results .hit').classList.contains('below-floor')")
    assert page.texts("#results .hit .relevance") == [f"relevance {percent(closest['relevance'])} · below the floor"]
    assert closest["title"] in page.text("#results .hit .title")
    page.wait(lambda: "floor=0.5" in page.driver.current_url, "the floor in the URL")
    page.shot("below-floor")

    # The URL is the state: a floor no option names gets its own; a keyword search sends none.
    page.get(f"{env.url}/?{urlencode({'q': OFF_TOPIC, 'mode': 'query', 'c': 'eval', 'floor': '0.25'})}")
    page.wait(
        lambda: "No result above the relevance floor (25%); the closest:" in page.text("#notes"), "a floor from a link"
    )
    assert page.js("const f = document.getElementById('floor'); return [f.value, f.selectedOptions[0].text]") == [
        "0.25",
        "relevance ≥ 25%",
    ]
    page.get(f"{env.url}/?{urlencode({'q': OFF_TOPIC, 'c': 'eval', 'floor': '0.5'})}")
    assert page.results_for(OFF_TOPIC) and "relevance floor" not in page.text("#notes")
    assert not page.console_errors()


# -- a result's range --------------------------------------------------------------------


def test_opening_a_result_shows_the_files_own_numbered_lines(notes_daemon: Env, page: Page) -> None:
    env = notes_daemon
    page.get(env.url + "/?q=raise+money")
    (file, lines), *_ = page.results_for("raise money")
    start, end = map(int, lines.split("-"))
    page.click("#results .hit .title")
    shown = page.doc_lines()
    first = int(shown[0].split(":")[0])
    assert first == max(1, start - 5)
    assert [line.removesuffix(" <matched>") for line in shown] == cli_get(env, file, first, len(shown))
    assert [int(x.split(":")[0]) for x in shown if x.endswith("<matched>")] == list(range(start, end + 1))
    assert page.text("#doc-pointer") == f"{file}:{start}:{end - start + 1}"
    assert page.shown("doc-view") and not page.shown("search-view") and not page.shown("status-view")
    assert page.js("return document.getElementById('doc-editor').href").startswith("vscode://file/")
    page.shot("document")

    # The range ends at the file's last line (down is off); widening up reaches line 1.
    assert page.js("return document.getElementById('doc-down').disabled")
    assert first > 1
    page.click("#doc-up")
    page.wait(lambda: page.doc_lines()[0].startswith("1: "), "a wider range")
    wider = page.doc_lines()
    assert [line.removesuffix(" <matched>") for line in wider] == cli_get(env, file, 1, len(wider))
    assert page.js("return document.getElementById('doc-up').disabled")
    page.wait(lambda: "from=1&" in page.driver.current_url, "the wider range in the URL")

    # A range past the end of a document, opened from a link: the daemon's answer, no error.
    page.get(env.url + "/?open=qmd%3A%2F%2Fnotes%2Fnope.md&from=1&lines=5")
    page.wait(lambda: "nope.md" in page.text("#doc-lines"), "the daemon's refusal")


def test_keyboard_slash_arrows_enter_and_escape(notes_daemon: Env, page: Page) -> None:
    env = notes_daemon
    page.get(env.url + "/")
    page.keys("/")
    assert page.js("return document.activeElement.id") == "q"
    page.keys("money")
    hits = page.results_for("money")
    assert len(hits) >= 2
    page.keys("\ue015")  # ArrowDown
    assert page.js("return document.activeElement.dataset.file") == hits[0][0]
    page.keys("\ue015")
    assert page.js("return document.activeElement.dataset.file") == hits[1][0]
    assert page.texts('#results [aria-selected="true"]') and len(page.texts('#results [aria-selected="true"]')) == 1
    page.keys("\ue013")  # ArrowUp
    assert page.js("return document.activeElement.dataset.file") == hits[0][0]
    page.keys("\ue007")  # Enter
    page.doc_lines()
    assert page.js("return document.body.dataset.view") == "doc"
    page.keys("\ue00c")  # Escape
    page.wait(lambda: page.js("return document.body.dataset.view") == "search", "the results again")
    assert page.results_for("money") == hits
    assert page.shown("search-view") and not page.shown("doc-view")
    assert "open=" not in page.driver.current_url
    page.keys("\ue00c")
    assert page.js("return document.activeElement.id") == "q"


def test_a_narrow_window_needs_no_sideways_scrolling(notes_daemon: Env, page: Page) -> None:
    env = notes_daemon
    page.driver.set_window_size(380, 800)
    page.get(env.url + "/?q=money")
    page.results_for("money")
    assert page.js("return document.documentElement.scrollWidth <= window.innerWidth")
    page.shot("narrow")
    # A full query adds the floor's select, and a hit below it a longer head: a floor of 1, which
    # no probability reaches (keywords alone rate "money" 0.99 for the notes all about it)
    page.get(env.url + "/?q=money&mode=query&floor=1")
    page.results_for("money")
    page.wait(lambda: "No result above the relevance floor (100%)" in page.text("#notes"), "the closest hit")
    assert page.js("return document.documentElement.scrollWidth <= window.innerWidth")


# -- safety --------------------------------------------------------------------------------


def test_hostile_note_content_is_shown_as_text_and_runs_nothing(
    env: Env, daemon: Daemon, page: Page, tmp_path: Path, foreign: Callable[[str], Foreign]
) -> None:
    spy = foreign("<p>nothing here</p>")
    hostile = (
        "# Hostile <b>bold</b>\n\n"
        "<script>window.pwned = 'script'</script>\n"
        "<img src=x onerror=\"window.pwned = 'img'\">\n"
        f'<img src="{spy.origin}/leak">\n'
        f'<iframe src="{spy.origin}/frame"></iframe>\n'
        "pwned marker line\n"
    )
    env.ok("collection", "add", str(write(tmp_path / "h", {"hostile.md": hostile})), "--name", "h")
    page.get(env.url + "/?q=pwned")
    assert page.results_for("pwned")
    snippet = page.text("#results .snippet")
    assert "<script>window.pwned = 'script'</script>" in snippet
    assert "onerror=\"window.pwned = 'img'\"" in snippet
    assert page.text("#results .title") == "Hostile <b>bold</b>"
    page.click("#results .title")
    shown = "\n".join(page.doc_lines())
    assert f'<img src="{spy.origin}/leak">' in shown
    assert page.js("return document.querySelectorAll('main script, main img, main iframe, main b').length") == 0
    assert page.js("return window.pwned === undefined")
    assert spy.hits == []


def test_the_page_and_its_assets_carry_a_strict_csp_and_nosniff(daemon: Daemon) -> None:
    for path, kind in (("/", "text/html"), ("/ui/ui.js", "text/javascript"), ("/ui/ui.css", "text/css")):
        r = daemon.http.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    html = daemon.http.get("/").text
    assert "<script>" not in html and " style=" not in html and " on" not in html.replace(" one", "")
    assets = sum(len(daemon.http.get(p).content) for p in ("/", "/ui/ui.js", "/ui/ui.css", "/ui/icon.svg"))
    assert assets < 100_000, f"the page's assets weigh {assets} bytes"
    for bad in ("/ui/nope.js", "/ui/..%2Fui.py", "/ui/index.html"):
        r = daemon.http.get(bad)
        assert r.status_code == 404 and "error" in r.json()


def test_a_page_from_another_origin_cannot_drive_the_api(
    notes_daemon: Env, page: Page, tmp_path: Path, foreign: Callable[[str], Foreign]
) -> None:
    """The guard refuses the foreign Origin: no answer to read, and the update it asked
    for never runs (a new note stays unindexed)."""
    env = notes_daemon
    attack = (
        "<script>"
        f"const d = 'http://127.0.0.1:{env.port}';"
        "fetch(d + '/v1/keyword', {method: 'POST', headers: {'Content-Type': 'application/json'},"
        " body: JSON.stringify({query: 'money'})})"
        ".then(r => r.text()).then(t => document.title = 'read:' + t, e => document.title = 'refused');"
        "fetch(d + '/v1/update', {method: 'POST', mode: 'no-cors', body: '{}'});"
        "fetch(d + '/v1/update', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'},"
        " body: JSON.stringify({collections: ['notes']})});"
        "</script>"
    )
    site = foreign(attack)
    (tmp_path / "notes" / "late.md").write_text("# Late\n\nzebrafish arrive late\n")
    page.get(site.origin + "/")
    page.wait(lambda: page.driver.title in ("refused",) or page.driver.title.startswith("read:"), "the attack")
    assert page.driver.title == "refused"
    r = httpx.post(f"{env.url}/v1/update", headers={"Origin": site.origin}, json={})
    assert r.status_code == 403 and "Origin not allowed" in r.text
    assert env.json("search", "zebrafish", "--json") == []


def test_with_a_token_the_page_needs_the_ticket_qmd_ui_hands_over(env: Env, page: Page) -> None:
    token = "ui-test-token-0123456789"
    d = Daemon(env, extra_env={"QMD_TOKEN": token})
    try:
        env.vars.update(QMD_TOKEN=token, QMD_NO_AUTOSTART="1")
        page.get(env.url + "/")
        assert "unauthorized" in page.text("body")
        out = env.ok("ui", "--no-browser")
        match = re.search(r"(http://\S+/ui/login\?ticket=\S+)", out)
        assert match, out
        page.get(match.group(1))
        page.wait(lambda: page.driver.current_url == env.url + "/", "the redirect to the page")
        assert page.js("return document.cookie") == ""  # HttpOnly: no script reads the token
        cookie = page.driver.get_cookie("qmd_token")
        assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        page.get(env.url + "/?q=anything")
        assert page.results_for("anything") == []
        assert "unauthorized" not in page.text("body")
        # A ticket is good once; a made-up one never.
        for url in (match.group(1), env.url + "/ui/login?ticket=made-up"):
            r = httpx.get(url, follow_redirects=False)
            assert r.status_code == 401 and "qmd ui" in r.json()["error"] and "set-cookie" not in r.headers
    finally:
        d.stop()


def test_without_a_token_there_are_no_tickets_and_no_login(daemon: Daemon) -> None:
    r = daemon.http.post("/v1/ui/ticket")
    assert r.status_code == 409 and "no token" in r.json()["error"]
    for params in ({"ticket": "x"}, {}):
        r = daemon.http.get("/ui/login", params=params, follow_redirects=False)
        assert r.status_code == 401 and "set-cookie" not in r.headers


# -- status ------------------------------------------------------------------------------


def test_status_shows_coverage_and_runs_update_and_embed_with_live_progress(
    env: Env, page: Page, tmp_path: Path
) -> None:
    embed = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder (../shared/models)")
    d = Daemon(env, extra_env={"QMD_EMBED_MODEL": str(embed)})
    try:
        env.vars.update(QMD_EMBED_MODEL=str(embed), QMD_NO_AUTOSTART="1")
        folder = write(tmp_path / "notes", {**NOTES, "bad.md": b"\xff\xfe\x00binary\x00"})
        env.ok("collection", "add", str(folder), "--name", "notes")
        page.get(env.url + "/")
        page.click("#status-link")
        page.wait(lambda: page.texts('.collection[data-collection="notes"]'), "the status view")
        assert page.shown("status-view") and not page.shown("search-view")
        box = '.collection[data-collection="notes"]'
        coverage = json.loads(env.ok("status", "--files", "--json"))[0]
        legend = page.texts(f"{box} .legend li")
        assert f"indexed {coverage['indexed']}" in legend and f"skipped {coverage['skipped']}" in legend
        assert f"vectors pending {coverage['pending_vectors']}" in legend
        assert "Watcher: off" in page.text(box)
        page.shot("status")

        write(folder, {"later.md": "# Later\n\nwritten after the first update\n"})
        page.click(f'{box} button[data-job="update"]')
        page.wait(lambda: "✓ update notes done" in page.text(box), "the update")
        assert env.json("search", "written after", "--json")

        # Every text the embed's line shows, recorded as it changes: its progress, then done.
        page.js(
            "const job = document.querySelector(arguments[0]); window.seen = [];"
            "new MutationObserver(() => window.seen.push(job.innerText))"
            ".observe(job, {subtree: true, childList: true, characterData: true})",
            f"{box} .job",
        )
        page.click(f'{box} button[data-job="embed"]')
        page.wait(lambda: "✓ embed notes done" in page.text(box), "the embed")
        seen = "\n".join(page.js("return window.seen"))
        assert re.search(r"embed: \d+/\d+ documents · \d+ chunks · [\d.]+ chunks/s", seen), seen
        page.wait(lambda: "vectors pending 0" in page.texts(f"{box} .legend li"), "the refreshed coverage")
        page.shot("status-embedded")
        assert not page.console_errors()
    finally:
        d.stop()


# -- qmd ui ------------------------------------------------------------------------------


def test_qmd_ui_opens_the_browser_or_prints_the_url(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    """`BROWSER` names the browser (Python's webbrowser): here a script that notes its URL."""
    opener = tmp_path / "opener"
    opener.write_text(f'#!/bin/sh\necho "$1" > {tmp_path / "opened"}\n')
    opener.chmod(0o755)
    out = env.ok("ui", env={"BROWSER": str(opener)})
    assert out.strip() == f"Opened in your browser: {env.url}/"
    assert (tmp_path / "opened").read_text().strip() == f"{env.url}/"
    assert env.ok("ui", "--no-browser").strip() == f"{env.url}/"
    nothing = {"BROWSER": "", "PATH": str(tmp_path / "no-programs"), "DISPLAY": "", "WAYLAND_DISPLAY": ""}
    assert env.ok("ui", env=nothing).strip() == f"No browser opened; visit {env.url}/"
    assert env.ok("--index", "other", "ui", "--no-browser").strip() == f"{env.url}/?index=other"


def test_qmd_ui_without_a_daemon_is_a_clean_error(env: Env) -> None:
    r = env.qmd("ui", "--no-browser", env={"QMD_NO_AUTOSTART": "1"})
    assert r.returncode != 0 and "no qmd daemon answers" in r.stderr and "Traceback" not in r.stderr


def test_inside_a_project_qmd_ui_opens_the_projects_index(env: Env, daemon: Daemon, page: Page) -> None:
    """As every command run inside a project serves its `.qmd/` index, so does the page."""
    repo = write(env.home / "café repo", {"README.md": "# Widget\n\nThe zanzibar widget manual.\n"})
    env.ok("init", cwd=repo)
    env.ok("update", cwd=repo)
    url = env.ok("ui", "--no-browser", cwd=repo).strip()
    assert url == f"{env.url}/?project={quote(str(repo))}"
    page.get(url)
    page.click("#q")
    page.keys("zanzibar")
    assert page.results_for("zanzibar") == [
        (h["file"], h["lines"]) for h in env.json("search", "zanzibar", "--json", cwd=repo)
    ]
    page.wait(lambda: "project=" in page.driver.current_url, "the project kept in the URL")
