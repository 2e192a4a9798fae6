"""The search page (`GET /` of `cpr serve`) in a real headless browser: Debian's chromium through
its chromedriver and Selenium, against `cpr serve` in its own process with an API key and the
scripted LLM. One service and one browser session serve every check (module-scoped), and every
wait is an explicit one. The result page's screenshot is saved under pytest's temporary folder;
with CPR_PAGE_SCREENSHOT_TO_DOCS=1 it also replaces docs/search-page.png (docs/search.md's)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from tests.search_corpus import build_search_index, papers
from tests.standins.launch import CPR, start_local_server

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
KEY_ENV, KEY = "CPR_PAGE_TEST_KEY", "page-test-key-71c3e0"
BIOLOGY = "Biochemistry, Genetics and Molecular Biology"
PROBLEM = "How to fold a protein into its native structure?"
WAIT_S = 120  # an explanation's first LLM call starts a pool of LLM actors in the replica
SCREENSHOT_LIMIT = 200_000  # docs/search-page.png is copied only below it


@pytest.fixture(scope="module")
def page_service(minilm, ray_session, scripted_llm, tmp_path_factory):
    """`cpr serve` over 120 papers of four fields, its key in `KEY_ENV`, explanations from the
    scripted LLM (one request at a time, one queued: a third is refused with 503)."""
    tmp = tmp_path_factory.mktemp("page")
    rows = papers(120)
    build_search_index(tmp, rows, minilm)
    ray_tmp = tempfile.mkdtemp(prefix="cprpage-", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
    sets = {
        "search.serve.api_key_env": KEY_ENV,
        "search.serve.max_ongoing_requests": 1,
        "search.serve.max_queued_requests": 1,
        "eval.llm_root": tmp / "llm",
        "llm.actors": 1,
        "ray.num_cpus": 2,
        "ray.temp_dir": ray_tmp,
    }
    args = [
        *CPR,
        "serve",
        str(tmp / "idx"),
        "--port",
        "{port}",
    ]
    args += ["--llm-base-url", scripted_llm.base_url, "--llm-model", "scripted"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    try:
        proc, url = start_local_server(
            args,
            "/healthz",
            tmp / "serve.log",
            timeout_s=180,
            env={**os.environ, KEY_ENV: KEY, "RAY_ADDRESS": ""},
            new_session=True,
        )
    except RuntimeError:
        pytest.fail("cpr serve did not come up:\n" + (tmp / "serve.log").read_text()[-4000:])
    yield url, {r["corpus_id"]: r for r in rows}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of its Ray is left
    except ProcessLookupError:
        pass
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    """Headless chromium; Selenium is given both paths, so Selenium Manager never looks for a
    browser on the network. Missing ones fail the test: `make browser` installs them."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing: run `make browser`", pytrace=False)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: run `make install` (the dev extra)", pytrace=False)

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    # the page's own size, whatever the window's decorations (the screenshot's size)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1000, "height": 800, "deviceScaleFactor": 1, "mobile": False},
    )
    yield driver
    driver.quit()


def get(url: str, path: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def post(
    url: str, path: str, body: dict, key: str | None = KEY, with_headers: bool = False
) -> tuple:
    """(status, JSON body), or (status, headers, JSON body) `with_headers`."""
    headers = {"content-type": "application/json", **({"x-api-key": key} if key else {})}
    req = urllib.request.Request(url + path, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as resp:
            status, seen, answer = resp.status, resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        status, seen, answer = exc.code, exc.headers, json.loads(exc.read())
    return (status, seen, answer) if with_headers else (status, answer)


def judged(llm) -> int:
    """Analogy judgments the scripted LLM was asked (the explanations)."""
    return llm.stats().get("AnalogyJudgment", 0)


# -- the page in the browser ----------------------------------------------------------------


def wait(driver, condition, timeout: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def fill(driver, element_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, element_id)
    box.clear()
    if text:
        box.send_keys(text)


def enter_key(driver) -> None:
    """Type the key in the page's key field (opening its box if a kept key closed it), once
    the page has shown the box: it does when the service's healthz says it asks for a key."""
    from selenium.webdriver.common.by import By

    wait(driver, lambda d: d.find_element(By.ID, "key-box").is_displayed())
    if not driver.find_element(By.ID, "api-key").is_displayed():
        driver.find_element(By.CSS_SELECTOR, "#key-box summary").click()
    fill(driver, "api-key", KEY)
    driver.find_element(By.ID, "query").click()  # leaving the field keeps the key


def set_checked(driver, element_id: str, on: bool) -> None:
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, element_id)
    if box.is_selected() != on:
        box.click()


def search(driver, query: str, k: int | str = 5, **filters) -> list[dict[str, str]]:
    """Fill the form, submit, wait for the answer; the hits as the page shows them."""
    from selenium.webdriver.common.by import By

    fill(driver, "query", query)
    fill(driver, "k", str(k))
    fill(driver, "exclude-fields", filters.get("exclude", ""))
    fill(driver, "before", str(filters.get("before", "")))
    set_checked(driver, "other-fields-only", filters.get("other_fields_only", False))
    form = driver.find_element(By.ID, "search-form")
    answered = int(form.get_attribute("data-answered") or 0)
    driver.find_element(By.ID, "search-button").click()
    wait(driver, lambda d: int(form.get_attribute("data-answered") or 0) > answered)
    return shown_hits(driver)


def shown_hits(driver) -> list[dict[str, str]]:
    """The hits the page shows."""
    from selenium.webdriver.common.by import By

    return [
        {
            "corpus_id": li.get_attribute("data-corpus-id"),
            **{
                part: li.find_element(By.CLASS_NAME, part).text
                for part in ("title", "year", "field", "domain", "score", "ranks", "abstract")
            },
        }
        for li in driver.find_elements(By.CSS_SELECTOR, "#results li.hit")
    ]


def shown_error(driver) -> str:
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "error")
    return box.text if box.is_displayed() else ""


def explanation_box(driver, n: int):
    """Click the explain button of hit `n` (1-based); its explanation box."""
    from selenium.webdriver.common.by import By

    hit = driver.find_elements(By.CSS_SELECTOR, "#results li.hit")[n - 1]
    hit.find_element(By.CSS_SELECTOR, "button.explain").click()
    return hit.find_element(By.CLASS_NAME, "explanation")


def answered(box) -> str | None:
    """The box's text once it holds an explanation or an error, else None."""
    from selenium.webdriver.common.by import By

    done = box.find_elements(By.CSS_SELECTOR, ".decision, .error")
    return box.text if done else None


@pytest.mark.slow
def test_search_filter_and_explain_in_the_browser(page_service, browser, llm, tmp_path_factory):
    """Type a problem, see k hits with their fields, years, domains, scores and abstracts (or
    "withheld by licence"), the problem's inferred field; "other fields only" drops its own
    field, the date and field filters cut; the key asked for once and kept; the explain button
    shows the scripted LLM's mappings, shared relations and transfer path in place."""
    from selenium.webdriver.common.by import By

    url, rows = page_service
    browser.get(url + "/")
    assert browser.title.startswith("cpr-ray search")

    # this service asks for a key (its healthz says so): the key panel is shown, open
    wait(browser, lambda d: d.find_element(By.ID, "key-box").is_displayed())
    assert browser.find_element(By.ID, "api-key").is_displayed()
    # no key yet: the 401 as a message asking for it, and the key field opened
    search(browser, PROBLEM)
    assert "API key" in shown_error(browser) and "missing or wrong X-API-Key" in shown_error(
        browser
    )
    assert browser.find_element(By.ID, "api-key").is_displayed()
    enter_key(browser)

    hits = search(browser, PROBLEM, k=10)
    assert shown_error(browser) == ""
    assert len(hits) == 10
    assert browser.find_element(By.ID, "query-field").text == BIOLOGY
    assert browser.find_element(By.ID, "query-field-source").text == "(inferred)"
    for hit in hits:
        row = rows[int(hit["corpus_id"])]
        assert (hit["title"], hit["field"], hit["domain"]) == (
            row["title"],
            row["field"],
            row["domain"],
        )
        assert hit["year"] == str(row["year"]) and re.fullmatch(r"score -?\d\.\d{4}", hit["score"])
        assert hit["abstract"] == (row["abstract"] or "Abstract withheld by licence.")
        # hybrid by default: each hit's rank on each side, "–" where it was not in its depth
        assert re.fullmatch(r"dense (#\d+|–) · BM25 (#\d+|–)", hit["ranks"]), hit["ranks"]
    assert any(h["ranks"] != "dense – · BM25 –" for h in hits)
    assert BIOLOGY in {h["field"] for h in hits}  # so the filter below has something to drop

    # the key was entered once: a reload keeps it
    browser.refresh()
    assert browser.find_element(By.ID, "api-key").get_attribute("value") == KEY

    # a link with a query and filters runs that search as the page opens, its form filled
    link = "/?" + urlencode({"q": PROBLEM, "other_fields_only": 1, "before": 2020, "k": 6})
    form_answered = 'return document.getElementById("search-form").dataset.answered'
    browser.get(url + link)
    wait(browser, lambda d: d.execute_script(form_answered) == "1")
    linked = shown_hits(browser)
    assert len(linked) == 6 and BIOLOGY not in {h["field"] for h in linked}
    assert all(int(h["year"]) < 2020 for h in linked)
    assert browser.find_element(By.ID, "query").get_attribute("value") == PROBLEM
    assert browser.find_element(By.ID, "other-fields-only").is_selected()
    # and the URL follows the form: a new search is a new link, back gives the old one
    search(browser, PROBLEM, k=4, before=2010)
    shown = parse_qs(urlparse(browser.current_url).query)
    assert shown == {"q": [PROBLEM], "before": ["2010"], "k": ["4"]}
    browser.back()
    wait(browser, lambda d: d.execute_script(form_answered) == "3")
    assert (
        len(shown_hits(browser)) == 6
        and browser.find_element(By.ID, "before").get_attribute("value") == "2020"
    )

    others = search(browser, PROBLEM, k=5, other_fields_only=True)
    assert len(others) == 5 and BIOLOGY not in {h["field"] for h in others}
    assert "outside " + BIOLOGY in browser.find_element(By.ID, "status").text

    cut = search(browser, PROBLEM, k=8, exclude="Physics and Astronomy, Computer Science")
    cut += search(browser, PROBLEM, k=8, before=2000)
    assert len(cut) == 16
    assert not {"Physics and Astronomy", "Computer Science"} & {h["field"] for h in cut[:8]}
    assert all(int(h["year"]) < 2000 for h in cut[8:])

    # explain one hit: the LLM's answer in place, under that hit
    others = search(browser, PROBLEM, k=5, other_fields_only=True)
    box = explanation_box(browser, 1)
    text = wait(browser, lambda d: answered(box), WAIT_S)
    assert text.startswith("Observed analogy · transfer: method"), text
    mappings = [li.text for li in box.find_elements(By.CSS_SELECTOR, "ul.mappings li")]
    assert mappings == [
        "data distribution ↔ initial state (start)",
        "noise distribution ↔ equilibrium state (end)",
    ]
    relations = box.find_element(By.CSS_SELECTOR, "ul.relations").text
    assert relations.startswith("Converts(data distribution, noise distribution) ↔ Converts(")
    assert "the diffusion process of d" in box.find_element(By.CLASS_NAME, "transfer-path").text
    asked = judged(llm)

    shot = tmp_path_factory.mktemp("screenshots") / "search-page.png"
    assert browser.save_screenshot(str(shot))
    size = shot.stat().st_size
    print(f"screenshot: {shot} ({size:,} bytes)")
    if size < SCREENSHOT_LIMIT and os.environ.get("CPR_PAGE_SCREENSHOT_TO_DOCS"):
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, ROOT / "docs" / "search-page.png")  # docs/search.md's picture

    # the button then hides and shows the answer; the same question again is the cache's
    button = browser.find_elements(By.CSS_SELECTOR, "#results li.hit button.explain")[0]
    button.click()
    wait(browser, lambda d: not box.is_displayed() and button.text == "Show the explanation")
    button.click()
    wait(browser, lambda d: box.is_displayed())
    assert judged(llm) == asked
    again = {"query": PROBLEM, "corpus_id": int(others[0]["corpus_id"]), "query_field": BIOLOGY}
    status, body = post(url, "/explain", again)
    assert status == 200 and body["status"] == "ok" and judged(llm) == asked


@pytest.mark.slow
def test_errors_read_as_messages_on_the_page(page_service, browser, llm):
    """422 (an empty problem, a bad k), 503 (every replica busy, its queue full) and a network
    failure: each a readable line on the page, never a stack trace or a silent failure."""
    from selenium.webdriver.common.by import By

    url, _ = page_service
    browser.get(url + "/")
    enter_key(browser)

    search(browser, "   ")
    assert shown_error(browser) == (
        'The service refused the request: query q1 is empty: ask a research problem, e.g. "How '
        'to …"'
    )
    search(browser, PROBLEM, k=0)
    assert "k 0: hits per query go from 1 to search.max_k" in shown_error(browser)
    assert browser.find_elements(By.CSS_SELECTOR, "#results li.hit") == []  # none before

    # 503: one explanation held at the LLM, one queued behind it, a third refused
    hits = search(browser, PROBLEM, k=5, other_fields_only=True)
    assert shown_error(browser) == "" and len(hits) == 5
    llm.pause()
    try:
        before = judged(llm)
        held = explanation_box(browser, 2)
        wait(browser, lambda d: judged(llm) > before, WAIT_S)
        boxes = [explanation_box(browser, 3), explanation_box(browser, 4)]
        busy = wait(browser, lambda d: [b for b in boxes if "busy" in (answered(b) or "")])
        assert [b.text for b in busy] == [
            "The service is busy: every search replica is busy: retry shortly"
        ]
    finally:
        llm.resume()
    queued = next(b for b in boxes if b not in busy)
    for box in (held, queued):
        assert wait(browser, lambda d, box=box: answered(box), WAIT_S).startswith(
            "Observed analogy"
        )

    # the network gone: a message saying so
    browser.set_network_conditions(offline=True, latency=0, throughput=0)
    try:
        search(browser, PROBLEM)
        assert shown_error(browser).startswith("Could not reach the search service")
    finally:
        browser.delete_network_conditions()


def test_page_is_served_from_the_package_and_explain_checks_like_search(page_service, llm):
    """The page and its assets need no key and load nothing from elsewhere (its CSP says so);
    /explain is in the OpenAPI, asks for the key and refuses what /search refuses; an LLM
    endpoint that refuses the service's key is the service's trouble (503), not the request's."""
    url, rows = page_service
    status, headers, html = get(url, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in headers["content-security-policy"]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        status, headers, body = get(url, f"/page/{name}")
        assert status == 200 and headers["content-type"].startswith(kind)
        assert not re.search(rb"(src|href)=\"?(https?:)?//|url\(\s*['\"]?(https?:)?//", body)
    assert not re.search(rb"(src|href)=\"(https?:)?//", html)
    status, _, body = get(url, "/page/secrets.txt")
    assert status == 404 and json.loads(body) == {"error": "no page file secrets.txt"}

    status, _, body = get(url, "/openapi.json")
    schema = json.loads(body)
    assert {"/search", "/explain", "/healthz"} <= set(schema["paths"])
    assert "/" not in schema["paths"]

    some_id = next(iter(rows))
    assert post(url, "/explain", {"query": PROBLEM, "corpus_id": some_id}, key=None) == (
        401,
        {"error": "missing or wrong X-API-Key"},
    )
    status, body = post(url, "/explain", {"query": " ", "corpus_id": some_id})
    assert status == 422 and "query q1 is empty" in body["error"]
    assert post(url, "/explain", {"query": PROBLEM, "corpus_id": 7}) == (
        422,
        {"error": "corpus id 7 is not in this index"},
    )
    status, body = post(url, "/explain", {"query": PROBLEM, "corpus_id": some_id, "k": 3})
    assert status == 422 and "k" in body["error"]
    llm.faults({"kind": "401", "always": True})
    status, headers, body = post(
        url,
        "/explain",
        {"query": "a question not asked before", "corpus_id": some_id},
        with_headers=True,
    )
    assert status == 503 and body["error"].startswith("the LLM endpoint is unavailable: ")
    assert headers.get("retry-after") == "5"  # a client's back-off: the endpoint may come back
    assert "refused the API key (HTTP 401)" in body["error"]
    llm.reset()  # the service's other tests find the endpoint answering
