"""README's picture of the review report: the report in headless chromium, a state clicked.

    .venv/bin/python docs/screenshot.py [out/report/index.html] [docs/report.png]

Run after `make demo` (which writes out/report); the picture shows what that run computed.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def main(index: Path, png: Path) -> int:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    if not index.is_file():
        print(f"screenshot: {index} not found: run `make demo` first", file=sys.stderr)
        return 2
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options,
                              service=Service(executable_path=shutil.which("chromedriver")))
    try:
        driver.get(index.resolve().as_uri())
        nodes = driver.find_elements(By.CSS_SELECTOR, "div.graph[data-view=slot] g.node.clickable")
        target = nodes[len(nodes) // 2]
        driver.execute_script("document.getElementById('view-slot').scrollIntoView()")
        ActionChains(driver).move_to_element(target).click().perform()
        driver.execute_script("document.getElementById('view-slot').scrollIntoView()")
        driver.save_screenshot(str(png))
    finally:
        driver.quit()
    print(png)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(Path(args[0] if args else "out/report/index.html"),
                  Path(args[1] if len(args) > 1 else "docs/report.png")))
