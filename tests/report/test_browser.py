"""`ttmirror report` in a real browser: Debian's chromium, headless, through Selenium.

The page loads with no console error and no network; its figures are `check --json`'s; a click
on a state shows its variables; a counterexample steps to its end and names the violated
invariant; every link and asset resolves inside the report's folder; a report of a failing check
(a violated invariant, a "sometimes" check not reached) shows what failed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from ttmirror import manifest
from ttmirror.cli import main
from ttmirror.model.explore import explore
from ttmirror.model.state import RING, Bounds
from ttmirror.report import check as report

from .chromium import CHROMIUM, DRIVER, MISSING, headless

BOUNDS = Bounds(requests=1)
"""The site's bounds: one request, state rows and vLLM's freedoms (the defaults)."""
RING_FLAGS = manifest.flags(RING).split()
pytestmark = pytest.mark.skipif(CHROMIUM is None or DRIVER is None, reason=MISSING)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    kills = out.parent / "kills.json"
    done = subprocess.run(
        [sys.executable, "-m", "ttmirror", "mutants", "--bug", "guard-off", "--bug",
         "mask-inverted", "--config", "eager-2cq", "--json", "--traces", str(out.parent)],
        capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    kills.write_text(done.stdout)
    # The plot's input, in the shape `bench_engine.py --json` writes (the figures are made up:
    # the benchmark takes minutes; what is checked here is that the page draws them).
    bench = out.parent / "bench.json"
    bench.write_text(json.dumps({"rounds": 1, "points": [
        {"ratio": r, "measured_ratio": r, "speedup": s, "ideal": i, "overlapped": 0.99,
         "overlapped_drain": 0.25} for r, s, i in ((0.5, 1.1, 1.5), (1, 1.6, 2.0), (4, 1.2, 1.25))
    ]}))
    code = main(["report", "--requests", "1", "--fuzz-seconds", "3600", "-o", str(out / "site"),
                 "--mutants", str(kills), "--bench-engine", str(bench)])
    assert code == 0
    return out / "site"


@pytest.fixture(scope="module")
def browser(site: Path) -> Iterator[Any]:
    driver = headless()
    driver.get((site / "index.html").as_uri())
    yield driver
    driver.quit()


def test_the_page_loads_without_a_console_error(browser: Any) -> None:
    driver = browser
    assert "ttmirror review" in driver.title
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_the_figures_are_those_check_json_prints(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    expected = json.loads(json.dumps(report.as_json(explore(BOUNDS))))  # as check prints it
    shown = {e.get_attribute("data-figure"): e.text
             for e in driver.find_elements(By.CSS_SELECTOR, "[data-figure]")}
    for key in ("states", "transitions", "deadlocks", "cannot_finish", "final_states"):
        assert shown[key] == f"{expected[key]:,}", key
    verdicts = {e.get_attribute("data-verdict"): e.text
                for e in driver.find_elements(By.CSS_SELECTOR, "[data-verdict]")}
    assert verdicts == expected["invariants"]
    printed = driver.find_element(By.ID, "check-json").get_attribute("textContent")
    timing = ("seconds", "states_per_second")  # this run's, not the report's
    assert ({k: v for k, v in json.loads(printed).items() if k not in timing}
            == {k: v for k, v in expected.items() if k not in timing})
    # The fuzz walked every edge at one request, and the graphs say so.
    assert float(shown["edges_covered"]) == 1.0
    walked = driver.find_element(By.CSS_SELECTOR, "[data-walked=slot]").text
    done, total = walked.split(" of ")
    assert done == total and int(total) > 5


def test_a_click_on_a_state_shows_its_variables(browser: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver = browser
    for view in ("slot", "request"):
        nodes = driver.find_elements(
            By.CSS_SELECTOR, f"div.graph[data-view={view}] g.node.clickable")
        assert len(nodes) > 3
        target = nodes[-1]
        label = target.find_element(By.TAG_NAME, "title").get_attribute("textContent")
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", target)
        ActionChains(driver).move_to_element(target).click().perform()
        panel = driver.find_element(By.ID, f"state-{view}")
        variables = {row.get_attribute("data-variable")
                     for row in panel.find_elements(By.CSS_SELECTOR, "tr[data-variable]")}
        assert variables == {"allocated", "next_slot", "queue", "slots", "requests", "broken",
                             "table"}
        assert "model states look like this" in panel.text, label
    # The request view marks the states whose host ids are stale, and says what ends it.
    stale = driver.find_elements(
        By.CSS_SELECTOR, "div.graph[data-view=request] g.node.stale")
    assert stale
    caption = driver.find_element(By.CSS_SELECTOR, "#view-request > p").text
    assert "stale" in caption and "what ends it here: " in caption


def test_a_counterexample_steps_to_the_violated_invariant(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    box = driver.find_element(By.CSS_SELECTOR, "[data-cex]")
    heading = box.find_element(By.TAG_NAME, "h3").text
    assert heading.startswith("guard-off: StaleHostIdsGuard in ")
    steps = int(heading.split(" in ")[1].split()[0])
    verdict = box.find_element(By.CSS_SELECTOR, ".verdict")
    nxt = box.find_element(By.CSS_SELECTOR, "[data-step=next]")
    for at in range(1, steps + 1):
        assert verdict.text == ""  # not before the end
        driver.execute_script("arguments[0].click()", nxt)
        assert box.find_element(By.CSS_SELECTOR, ".where").text == f"state {at} of {steps}"
        # The action's changes are highlighted: some variable row is marked changed.
        assert box.find_elements(By.CSS_SELECTOR, "table.state tr.changed")
    assert verdict.text.startswith("Violated: StaleHostIdsGuard.")
    assert "newest token" in verdict.text  # the invariant, in words


def test_every_link_and_asset_resolves_inside_the_report(browser: Any, site: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    urls = [e.get_attribute(attr)
            for selector, attr in (("a[href]", "href"), ("link[href]", "href"),
                                   ("script[src]", "src"), ("img[src]", "src"))
            for e in driver.find_elements(By.CSS_SELECTOR, selector)]
    assert len(urls) > 10
    for url in urls:
        parsed = urlparse(url)
        assert parsed.scheme == "file", f"{url}: the report must not need the network"
        path = Path(unquote(parsed.path))
        assert path.is_file() and path.resolve().is_relative_to(site.resolve()), url
        if parsed.fragment:
            found = driver.execute_script(
                "return document.getElementById(arguments[0]) !== null", parsed.fragment)
            assert found, f"#{parsed.fragment} is not on the page"
    # The script and the style sheet loaded (the page is styled and scripted).
    clickable = driver.find_elements(By.CSS_SELECTOR, "g.node.clickable")
    assert clickable
    header = driver.find_element(By.TAG_NAME, "header")
    assert header.value_of_css_property("position") == "sticky"
    # The kill matrix is the mutants run's.
    kills = driver.find_element(By.ID, "kills").text
    assert "2 of 2 planted bugs killed" in kills and "mask-inverted" in kills


def test_the_benchmark_is_plotted(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    plot = driver.find_element(By.CSS_SELECTOR, "#bench svg.plot")
    assert len(plot.find_elements(By.TAG_NAME, "polyline")) == 2  # measured and ideal
    assert len(plot.find_elements(By.TAG_NAME, "circle")) == 2 * 3
    rows = driver.find_elements(By.CSS_SELECTOR, "#bench table tr")
    assert len(rows) == 1 + 3 and "80%" in rows[2].text  # 1.6x of 2.0x


FAILING = {
    # The guard off: StaleHostIdsGuard violated (and, every combine reading the host's ids,
    # none from the mirror).
    "violated": (["--variant", "guard-off", "--requests", "1", *RING_FLAGS],
                 RING._replace(requests=1, guard=False),
                 "FAIL: violated: StaleHostIdsGuard; not reached: combined_from_mirror"),
    # One token: every invariant holds, but nothing combines from the mirror or overlaps.
    "not-reached": (["--requests", "1", "--max-tokens", "1", *RING_FLAGS],
                    RING._replace(requests=1, max_tokens=1),
                    "FAIL: not reached: combined_from_mirror, steps_overlap"),
}


@pytest.mark.parametrize("case", sorted(FAILING))
def test_a_failing_check_is_shown_failing(case: str, browser: Any, tmp_path: Path) -> None:
    """A report of a failing check, opened in a tab of the same browser: its verdict rows, its
    header and its embedded JSON say what failed, as `check --json` does."""
    from selenium.webdriver.common.by import By

    args, bounds, header = FAILING[case]
    assert main(["report", *args, "--fuzz-seconds", "0", "--no-tlc", "--no-prove", "--jobs", "1",
                 "-o", str(tmp_path)]) == 1
    expected = json.loads(json.dumps(report.as_json(explore(bounds))))
    assert expected["passed"] is False
    driver = browser
    home = driver.current_window_handle
    driver.switch_to.new_window("tab")
    try:
        driver.get((tmp_path / "index.html").as_uri())
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
        assert driver.find_element(By.ID, "passed").text == header
        cells = {attr: {e.get_attribute(attr): e
                        for e in driver.find_elements(By.CSS_SELECTOR, f"[{attr}]")}
                 for attr in ("data-verdict", "data-sometimes")}
        assert {n: e.text for n, e in cells["data-verdict"].items()} == expected["invariants"]
        assert {n: e.text for n, e in cells["data-sometimes"].items()} == {
            n: "reached" if hit else "NOT reached" for n, hit in expected["sometimes"].items()}
        # Each failing row is marked bad (red), each other one ok.
        rows = {n: e.find_element(By.XPATH, "..").get_attribute("class")
                for shown in cells.values() for n, e in shown.items()}
        failing = {n for n, v in expected["invariants"].items() if v != "ok"} | {
            n for n, hit in expected["sometimes"].items() if not hit}
        assert {n for n, c in rows.items() if c == "bad"} == failing
        printed = json.loads(driver.find_element(By.ID, "check-json")
                             .get_attribute("textContent"))
        timing = ("seconds", "states_per_second")
        assert ({k: v for k, v in printed.items() if k not in timing}
                == {k: v for k, v in expected.items() if k not in timing})
    finally:
        driver.close()
        driver.switch_to.window(home)
