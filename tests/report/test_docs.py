"""The documentation site (`make docs`): MkDocs builds it strictly (a broken link or a missing
page fails the build, and a planted broken link shows it), every page renders in Debian's
chromium, headless, with no console error, and every link on it resolves: to a file of the
site, and to an anchor that exists on the page it names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from .chromium import CHROMIUM, DRIVER, MISSING, headless

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"
PAGES = {"index.html", "architecture.html", "spec.html", "tutorials/review.html",
         "tutorials/regression.html", "tutorials/vllm.html", "guide/setup.html",
         "guide/commands.html", "guide/vllm.html", "reference/cli.html"}
"""The pages of the site (its nav): three tutorials, the architecture, the spec, the guides and
the command line reference."""


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("docs") / "site"
    done = build(ROOT / "mkdocs.yml", site)
    assert done.returncode == 0, done.stderr[-3000:]
    return site


def test_the_site_holds_every_page_and_the_generated_ones(site: Path) -> None:
    from ttmirror.cli import build_parser
    from ttmirror.resources import SPEC

    assert {str(p.relative_to(site)) for p in site.rglob("*.html")} >= PAGES
    # The spec is the package's, rendered; the reference has a section per subcommand.
    spec = (site / "spec.html").read_text()
    title = SPEC.read_text().splitlines()[0].lstrip("# ").strip()
    assert title in spec
    reference = (site / "reference" / "cli.html").read_text()
    commands = [a for a in build_parser()._actions if a.dest == "command"]
    names = sorted(commands[0].choices) if commands else []
    assert len(names) >= 12 and all(f"<code>{n}</code>" in reference for n in names)
    assert (site / "serving-step.svg").read_text().lstrip().startswith("<?xml")


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The twin: the strict build is what catches a link to a page that does not exist."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    page = tmp_path / "docs" / "tutorials" / "review.md"
    page.write_text(page.read_text() + "\n[gone](../no-such-page.md)\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stderr


@pytest.fixture(scope="module")
def browser(site: Path) -> Iterator[Any]:
    if CHROMIUM is None or DRIVER is None:
        pytest.skip(MISSING)
    driver = headless()
    yield driver
    driver.quit()


def _ids(driver: Any) -> set[str]:
    return set(driver.execute_script(
        "return Array.from(document.querySelectorAll('[id]'), e => e.id)"))


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_page_renders_and_every_link_resolves(site: Path, browser: Any, page: str) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get((site / page).as_uri())
    assert driver.find_element(By.TAG_NAME, "h1").text.strip()
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    links = [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a[href]")]
    assert len(links) > 5  # the nav at least
    broken = []
    anchors: dict[Path, list[str]] = {}
    for href in links:
        url = urlparse(href)
        if url.scheme != "file":
            continue  # the theme's credits (mkdocs.org, readthedocs.org): a reader's to follow
        target = Path(unquote(url.path))
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or not target.is_relative_to(site):
            broken.append(href)
        elif url.fragment:
            anchors.setdefault(target, []).append(url.fragment)
    for target, fragments in anchors.items():
        driver.get(target.as_uri())
        ids = _ids(driver)
        broken += [f"{target.relative_to(site)}#{f}" for f in fragments if unquote(f) not in ids]
    assert broken == []
    # Images load (the architecture page's drawing among them).
    driver.get((site / page).as_uri())
    images = driver.find_elements(By.TAG_NAME, "img")
    assert all(driver.execute_script("return arguments[0].naturalWidth", i) > 0 for i in images)
    if page == "architecture.html":
        assert any("serving-step.svg" in (i.get_attribute("src") or "") for i in images)
