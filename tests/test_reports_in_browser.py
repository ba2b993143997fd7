"""Every shipped study, run as a user runs it: `--json` parses, and report.html renders in a real browser.

The browser is Debian's Chromium driven by Playwright (CI installs both, as .ci/run says); each report
must load without console errors, every image and chart must render, every chart's labels must lie inside it
and clear of each other (their bounding boxes, as the browser lays them out), and the headline must be there.
Screenshots are kept in reports/ in pytest's base temporary folder for a person to look at (its path is printed:
`pytest -s` shows it).
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STUDIES = sorted((ROOT / "studies").glob("*.yaml"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


LABELS_CLEAR = """() => {
  const out = [];
  for (const svg of document.querySelectorAll('figure.chart svg')) {
    const box = svg.getBoundingClientRect();
    const texts = Array.from(svg.querySelectorAll('text')).map(t => [t.textContent, t.getBoundingClientRect()]);
    const ticks = Array.from(svg.querySelectorAll('text.tick'));
    if (ticks.length < 4 || !svg.querySelector('text.legend') || svg.querySelectorAll('text.axis').length < 2)
      out.push(`ticks, legend or axis titles missing (${ticks.length} ticks)`);
    for (const [text, r] of texts)
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
        out.push(`'${text}' outside its chart`);
    for (let i = 0; i < texts.length; i++)
      for (let j = i + 1; j < texts.length; j++) {
        const [a, ra] = texts[i], [b, rb] = texts[j];
        if (ra.left < rb.right - 0.5 && rb.left < ra.right - 0.5 && ra.top < rb.bottom - 0.5 && rb.top < ra.bottom - 0.5)
          out.push(`'${a}' overlaps '${b}'`);
      }
  }
  return out;
}"""
"""The charts' text (tick labels, axis titles, legend) inside each chart's box and clear of each other; every chart
with ticks on both axes, a legend and its axis titles."""


@pytest.fixture(scope="module")
def shipped_runs(shipped):
    """Every shipped study's session run (`dse run --json`); those not yet run go two at a time (CI has two cores)."""
    names = [s.stem for s in STUDIES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(shipped, names), strict=True))


@pytest.mark.parametrize("study", [s.stem for s in STUDIES])
def test_json_output_parses(shipped_runs, study):
    r = shipped_runs[study]
    out = r.out
    assert r.returncode in (0, 3), r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["study"] and summary["status"] in ("optimal", "feasible", "infeasible")
    assert (out / "report.html").exists()


def test_every_report_renders_in_chromium(shipped_runs, tmp_path_factory):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: .ci/run installs Debian's chromium package")
        pytest.skip("no Chromium on this machine (CI installs it)")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    screenshots = tmp_path_factory.getbasetemp() / "reports"
    screenshots.mkdir(exist_ok=True)
    print(f"screenshots: {screenshots}")
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        for study, run in shipped_runs.items():
            out = run.out
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            requests: list[str] = []
            page.on("request", lambda r, requests=requests: requests.append(r.url))
            page.goto((out / "report.html").as_uri())
            page.wait_for_load_state("load")
            images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
            charts = page.evaluate("Array.from(document.querySelectorAll('figure.chart svg'))"
                                   ".map(s => [s.getBoundingClientRect().width, s.querySelectorAll('circle').length])")
            crowded = page.evaluate(LABELS_CLEAR)
            headline = page.inner_text("#headline") if page.query_selector("#headline") else ""
            page.screenshot(path=str(screenshots / f"{study}.png"), full_page=True)
            page.close()
            if errors:
                problems.append(f"{study}: console errors {errors}")
            if any(not done or width == 0 for done, width in images):
                problems.append(f"{study}: an image did not render {images}")
            if any(width == 0 or points == 0 for width, points in charts):
                problems.append(f"{study}: a chart did not render {charts}")
            if crowded:
                problems.append(f"{study}: chart labels clipped or overlapping: {crowded}")
            if "Answer" not in headline or len(headline.splitlines()) < 2:
                problems.append(f"{study}: no headline ({headline!r})")
            if any(not u.startswith(("file:", "data:")) for u in requests):
                problems.append(f"{study}: the report asked the network for {requests}")
        browser.close()
    assert not problems, "\n".join(problems)


def test_report_cells_carry_units():
    from dse.report.present import cell

    assert cell("tpot_s", 0.0123) == "12.3 ms" and cell("hits_per_s", 20.0) == "20 /s"
    assert cell("tokens_per_s_per_gpu", 1.5e6) == "1.5 M" and cell("hbm_bytes_per_chip", 6.8e10) == "68 GB"
    assert cell("usd_per_mtok", 0.123456) == "0.1235" and cell("batch", 4096) == "4,096"
    assert cell("ttft_s", float("nan")) == "–" and cell("fits", True) == "yes"
