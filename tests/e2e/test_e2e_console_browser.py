"""The web console in a real headless Chromium against a real `dmq serve` (http_api/console/).

One broker and one browser session serve the whole module (Debian's chromium and
chromium-driver, driven by Selenium; `make system-deps` installs them). Each page is saved
as a screenshot under `<pytest basetemp>/tests-output/console/`; the path is printed.

Proves that:
- the cluster page shows this broker's id, live, as a metadata voter, with its leaders;
- the topics page lists topics created through the API; a topic's page shows its
  partitions, replicas, offsets and config;
- a record produced through the API appears in the record browser, read from the start,
  the newest page, an offset and a timestamp, with its key, headers and its JSON value pretty-printed; markup in
  a record is shown as text (no element made, no script run); a value that is not UTF-8
  is shown in base64;
- a topic created with the console's form exists in the API with the partitions asked;
  a record produced with the console's form is read back through the API;
- a consumer group's lag per partition shows and follows a commit made through the API
  (the page polls), with its chart; a share group's backlog shows;
- the operations page shows the metadata voters;
- a topic's config comes typed from the API (remote_storage_enable a JSON boolean) and
  shows unquoted (`false`, `3600000`);
- the record browser opened on a topic shows its newest records without pressing Read and
  follows the partition: a record produced while it is open appears (live tail);
- a partition emptied by retention says why no records are shown, on the record browser and
  on its topic's page (records before offset N were removed by retention or compaction);
- no page, visited after all of the above (a record without a key included), shows the
  text "null" or "undefined";
- no page logs a JavaScript error in the browser console.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests_support import BrokerProcess

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 10.0
# Retention runs this often on the console's broker, so that a partition empties in the test.
RETENTION_CHECK_INTERVAL_MS = 200


class Console:
    """The browser on the broker's console, with helpers that wait for what they check."""

    def __init__(self, driver: WebDriver, broker: BrokerProcess, shots: Path) -> None:
        self.driver, self.broker, self.shots = driver, broker, shots

    def open(self, route: str) -> None:
        """Load /ui/#/<route> and wait until its page has rendered (main[data-ready])."""
        self.driver.get(f"{self.broker.url}/ui/#/{route}")
        page = route.split("?")[0].split("/")[0]
        self.until(lambda d: d.find_element(By.ID, "view").get_attribute("data-ready") == page)

    def until(self, check: Callable[[WebDriver], Any], what: str = "") -> Any:
        try:
            return WebDriverWait(self.driver, WAIT_S, poll_frequency=0.05).until(check)
        except TimeoutException:
            self.shot("timeout")
            error = self.driver.find_element(By.ID, "error").text
            raise AssertionError(
                f"waited {WAIT_S}s for {what or check}; error bar: {error!r}"
            ) from None

    def cells(self, css: str) -> list[list[str]]:
        """The rows of a table body, read in one script call: a polling page may re-render
        between two WebDriver calls, which would leave an element reference stale."""
        rows = self.driver.execute_script(
            "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
            ".map((tr) => [...tr.cells].map((td) => td.textContent));",
            css,
        )
        return [list(map(str, row)) for row in rows]

    def text(self, css: str) -> str:
        """The text of the elements css matches, joined, read in one script call."""
        found = self.driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])]"
            ".map((e) => e.innerText).join('\\n');",
            css,
        )
        return str(found)

    def until_text(self, css: str, expected: str, *, exact: bool = False) -> None:
        seen = [""]

        def shown(d: WebDriver) -> bool:
            seen[0] = text = self.text(css)
            return text == expected if exact else expected in text

        try:
            self.until(shown, f"{expected!r} in {css}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {css} showed: {seen[0][:500]!r}") from None

    def shot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.shots / f"{name}.png"))

    def js_errors(self) -> list[dict[str, Any]]:
        """SEVERE browser-log entries that are script errors (a 404 the page expects is not)."""
        return [e for e in self.driver.get_log("browser") if e.get("source") == "javascript"]

    def api(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        status, doc = self.broker.json(method, path, body)
        assert status == expect, (method, path, status, doc)
        return doc


@pytest.fixture(scope="module")
def console(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Console]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"the browser tests need Debian's chromium and chromium-driver; missing {missing}: "
            "run `make system-deps` (apt-get install chromium chromium-driver)",
            pytrace=False,
        )
    shots = tmp_path_factory.getbasetemp() / "tests-output" / "console"
    shots.mkdir(parents=True, exist_ok=True)
    broker = BrokerProcess(
        tmp_path_factory.mktemp("console") / "broker",
        extra_args=["--retention-check-interval-ms", str(RETENTION_CHECK_INTERVAL_MS)],
    )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1400,1000", "--lang=en-US"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = None
    try:
        broker.start()
        # An explicit driver path: Selenium Manager never looks for (or downloads) one.
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        yield Console(driver, broker, shots)
    finally:
        if driver is not None:
            driver.quit()
        broker.stop()
        # Printed past pytest's output capture, so that it shows in every run's log.
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\nconsole screenshots: {shots}")


@pytest.fixture(autouse=True)
def no_script_errors(console: Console) -> Iterator[None]:
    console.js_errors()  # drop what earlier tests left
    yield
    assert console.js_errors() == []


def test_cluster_page_shows_this_broker_live_voting_and_leading(console: Console) -> None:
    node = console.api("GET", "/v1/cluster")["node_id"]
    console.api("POST", "/v1/topics", {"name": "lead", "partitions": 2}, expect=201)
    console.open("cluster")
    console.until_text("#this-broker", node)
    [row] = console.cells("#brokers")
    assert row[0] == node and row[3] == "live" and row[4] == "voter", row
    console.until(lambda d: int(console.cells("#brokers")[0][5]) >= 2, "leaders >= 2")
    assert node in console.text("#whoami")
    console.shot("cluster")


def test_topics_page_and_topic_detail_show_what_the_api_has(console: Console) -> None:
    console.api("POST", "/v1/topics", {"name": "orders", "partitions": 3,
                "config": {"retention_ms": 3600000}}, expect=201)  # fmt: skip
    console.api("POST", "/v1/topics/orders/records?partition=1", {"records": [{"value": "x"}] * 4})
    console.open("topics")
    console.until_text("#topics", "orders")
    console.shot("topics")
    console.driver.find_element(By.LINK_TEXT, "orders").click()
    console.until_text("#topic-name", "orders")
    rows = console.cells("#partitions")
    assert len(rows) == 3
    cells = rows[1]
    node = console.api("GET", "/v1/cluster")["node_id"]
    assert cells[:7] == ["1", node, node, "active", "0", "4", "4"], cells
    config = dict(console.cells("#config"))  # type: ignore[arg-type]
    assert config["retention_ms"] == "3600000" and config["remote_storage_enable"] == "false"
    described = console.api("GET", "/v1/topics/orders")["config"]
    assert described["remote_storage_enable"] is False and described["retention_ms"] == 3600000
    console.shot("topic")


def test_record_produced_through_the_api_appears_in_the_record_browser(console: Console) -> None:
    console.api("POST", "/v1/topics", {"name": "browse", "partitions": 1}, expect=201)
    console.api("POST", "/v1/topics/browse/records", {"records": [{"value": "plain"}] * 3})
    # Strictly after the three records' timestamps, at or before the next one's: taken in
    # the same millisecond as their answer, a lookup from it also found them (4 shown).
    before_ms = int(time.time() * 1000) + 1
    while int(time.time() * 1000) < before_ms:
        time.sleep(0.001)
    value = json.dumps({"order": 17, "items": ["a", "b"]}, separators=(",", ":"))
    produced = console.api("POST", "/v1/topics/browse/records", {"records": [
        {"key": "k-17", "value": value, "headers": [{"key": "trace", "value": "t-1"}]}]})  # fmt: skip
    offset = produced["offsets"][0]["offset"]
    assert offset == 3
    console.open("records?topic=browse&partition=0&offset=earliest")
    console.until_text("#records", "k-17")
    pretty = console.text("#records pre.json")
    assert pretty == json.dumps(json.loads(value), indent=2), pretty
    assert "trace: t-1" in console.text("#records")
    console.shot("records")
    # From an offset, then from a timestamp: only the new record.
    console.open(f"records?topic=browse&partition=0&offset={offset}")
    console.until_text("#records", "1 record shown")
    console.open("records?topic=browse&partition=0&offset=newest")  # the last page
    console.until_text("#records", "4 records shown")
    console.open(f"records?topic=browse&partition=0&timestamp={before_ms}")
    console.until_text("#records", "1 record shown")
    assert "k-17" in console.text("#records tbody")
    console.shot("records-by-time")


def test_record_browser_shows_markup_as_text_and_binary_as_base64(console: Console) -> None:
    console.api("POST", "/v1/topics", {"name": "hostile", "partitions": 1}, expect=201)
    markup = '<img id="injected" src="x"><script>window.pwned = 1</script>'
    console.api(
        "POST", "/v1/topics/hostile/records", {"records": [{"key": markup, "value": markup}]}
    )
    console.open("records?topic=hostile&partition=0&offset=0")
    console.until_text("#records tbody", '<img id="injected"')
    assert console.driver.find_elements(By.ID, "injected") == []
    assert console.driver.execute_script("return window.pwned === undefined") is True
    # A value that is not UTF-8: the page is read again as base64 (the fetch answers 406).
    console.api("POST", "/v1/topics/hostile/records",
                {"records": [{"value": "/w=="}], "value_encoding": "base64"})  # fmt: skip
    console.open("records?topic=hostile&partition=0&offset=1")
    console.until_text("#records", "in base64")
    assert console.cells("#records")[0][3] == "/w=="
    console.shot("records-base64")


def test_topic_created_in_the_console_exists_in_the_api(console: Console) -> None:
    console.open("topics")
    form = console.driver.find_element(By.ID, "create-topic")
    form.find_element(By.NAME, "name").send_keys("made-in-ui")
    form.find_element(By.NAME, "partitions").send_keys("5")
    form.find_element(By.NAME, "config").send_keys('{"retention_ms": 7200000}')
    console.shot("create-topic")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    console.until_text("#topic-name", "made-in-ui")
    described = console.api("GET", "/v1/topics/made-in-ui")
    assert len(described["partitions"]) == 5
    assert described["config"]["retention_ms"] == 7200000


def test_record_produced_in_the_console_is_read_through_the_api(console: Console) -> None:
    console.api("POST", "/v1/topics", {"name": "typed", "partitions": 2}, expect=201)
    console.open("produce?topic=typed")
    form = console.driver.find_element(By.ID, "produce")
    assert Select(form.find_element(By.NAME, "topic")).first_selected_option.text == "typed"
    form.find_element(By.NAME, "partition").send_keys("1")
    form.find_element(By.NAME, "key").send_keys("ui-key")
    form.find_element(By.NAME, "value").send_keys('{"from": "console"}')
    form.find_element(By.NAME, "headers").send_keys("source: selenium")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    console.until_text("#produced", "Produced to partition 1 at offset 0")
    console.shot("produce")
    got = console.api("GET", "/v1/topics/typed/partitions/1/records?offset=0")["records"]
    assert [(r["key"], r["value"], r["headers"]) for r in got] == [
        ("ui-key", '{"from": "console"}', [{"key": "source", "value": "selenium"}])
    ]


def test_consumer_group_lag_shows_and_follows_commits(console: Console) -> None:
    console.api("POST", "/v1/topics", {"name": "lagged", "partitions": 2}, expect=201)
    console.api("POST", "/v1/topics/lagged/records?partition=0", {"records": [{"value": "v"}] * 5})
    console.api("POST", "/v1/topics/lagged/records?partition=1", {"records": [{"value": "v"}] * 2})
    member = console.api("POST", "/v1/groups/readers/members",
                         {"topics": ["lagged"], "session_timeout_ms": 60000}, expect=201)  # fmt: skip
    console.open("groups")
    console.until_text("#groups", "readers")
    console.shot("groups")
    console.open("groups/readers")
    console.until_text("#total-lag", "7", exact=True)
    lags = {row[1]: row[5] for row in console.cells("#group-partitions")}
    assert lags == {"0": "5", "1": "2"}
    commit = {"member_id": member["member_id"], "generation": member["generation"],
              "offsets": [{"topic": "lagged", "partition": 0, "offset": 4}]}  # fmt: skip
    console.api("POST", "/v1/groups/readers/offsets", commit)
    console.until_text("#total-lag", "3", exact=True)  # the next poll (every 2 s) sees the commit
    series = console.driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('svg.chart polyline')]"
        ".map((l) => [l.dataset.series, l.getAttribute('points').split(' ').length]));"
    )
    assert set(series) == {"lagged/0", "lagged/1"}
    assert min(series.values()) >= 2, series  # sampled at least twice
    console.shot("group-lag")


def test_share_group_backlog_and_operations_show(console: Console) -> None:
    console.api("POST", "/v1/topics", {"name": "jobs-in", "partitions": 1}, expect=201)
    console.api("POST", "/v1/topics/jobs-in/records", {"records": [{"value": "job"}] * 4})
    console.api("PUT", "/v1/share-groups/jobs", {"lock_duration_ms": 10000})
    member = console.api("POST", "/v1/share-groups/jobs/members", {"topics": ["jobs-in"]},
                         expect=201)["member_id"]  # fmt: skip
    polled = console.api("GET", f"/v1/share-groups/jobs/members/{member}/records?max_records=1")
    assert len(polled["records"]) == 1
    console.open("share-groups/jobs")
    console.until_text("#total-lag", "4", exact=True)
    console.until_text("#group-partitions", "jobs-in")
    console.shot("share-group")
    console.open("operations")
    node = console.api("GET", "/v1/cluster")["node_id"]
    console.until_text("dl.facts", node)
    assert "no change running" in console.text("dl.facts")
    console.shot("operations")


def test_record_browser_opens_on_the_newest_records_and_follows_new_ones(
    console: Console,
) -> None:
    console.api("POST", "/v1/topics", {"name": "tailed", "partitions": 1}, expect=201)
    console.api("POST", "/v1/topics/tailed/records",
                {"records": [{"value": f"old-{i}"} for i in range(60)]})  # fmt: skip
    console.open("records?topic=tailed")  # no offset: no Read pressed
    console.until_text("#records", "50 records shown")
    assert console.cells("#records")[0][0] == "10"  # the newest 50 of 60
    assert "live" in console.text("#live-tail")
    console.api("POST", "/v1/topics/tailed/records", {"records": [{"value": "fresh"}]})
    console.until_text("#records tbody", "fresh")
    rows = console.cells("#records")
    assert len(rows) == 50 and rows[-1][0] == "60" and rows[0][0] == "11", rows[-1]
    console.shot("records-live-tail")


def test_a_partition_emptied_by_retention_says_why(console: Console) -> None:
    console.api("POST", "/v1/topics",
                {"name": "aged", "partitions": 1, "config": {"retention_ms": 60000}},
                expect=201)  # fmt: skip
    hour_ago_ms = int(time.time() * 1000) - 3_600_000
    console.api("POST", "/v1/topics/aged/records",
                {"records": [{"value": v, "timestamp": hour_ago_ms} for v in "ab"]})  # fmt: skip
    deadline = time.monotonic() + 30
    while console.api("GET", "/v1/topics/aged/partitions/0/offsets")["log_start_offset"] < 2:
        assert time.monotonic() < deadline, "retention did not remove aged-0's records in 30 s"
        time.sleep(0.1)
    why = "records before offset 2 were removed by retention or compaction"
    console.open("records?topic=aged")
    console.until_text("#records", "0 records shown")
    assert why in console.text("#removed-note")
    console.open("records?topic=aged&partition=0&offset=earliest")
    console.until_text("#removed-note", why)
    console.open("topics/aged")
    console.until_text("#removed-note", f"Partition 0: {why}")
    console.shot("records-removed")


def test_no_page_shows_null_or_undefined(console: Console) -> None:
    """Last: every page, with what the tests before made (groups, share groups, topics)."""
    console.api("POST", "/v1/topics", {"name": "keyless", "partitions": 1}, expect=201)
    keyless = {"records": [{"value": "no key"}, {"key": "k", "value": "v"}]}
    console.api("POST", "/v1/topics/keyless/records", keyless)
    topics = [t["name"] for t in console.api("GET", "/v1/topics")["topics"]]
    routes = ["cluster", "topics", "records", "produce", "groups", "operations"]
    routes += [f"topics/{t}" for t in topics] + [f"records?topic={t}" for t in topics]
    routes += [f"groups/{g['group']}" for g in console.api("GET", "/v1/groups")["groups"]]
    shares = console.api("GET", "/v1/share-groups")["share_groups"]
    routes += [f"share-groups/{g['group']}" for g in shares]
    stray = re.compile(r"\b(null|undefined)\b")
    found = {}
    for route in routes:
        console.open(route)
        text = console.text("body")
        if stray.search(text):
            found[route] = [line for line in text.splitlines() if stray.search(line)]
    assert found == {}, found
    console.open("records?topic=keyless")  # the missing key: a muted "none"
    console.until_text("#records", "2 records shown")
    assert [row[2] for row in console.cells("#records")] == ["none", "k"]
