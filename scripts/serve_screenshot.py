"""The screenshot of docs/commands/serve.md: the page at 1280 × 900 px answering one question, in headless Chromium.

    python scripts/serve_screenshot.py [QUERY] [OUT.png]

QUERY is the page's URL state (default: Llama 3.1 70B on 32 H100s, TP 8, PP 2, ZeRO-1, selective recomputation).
"""

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import Browser, find_chromium  # noqa: E402 (tests/browser.py, the tests' own driver)

from lmcalc.serve import server as page_server  # noqa: E402

QUERY = (
    "?model=llama-3.1-70b&gpu_count=32&tp=8&pp=2&zero=1&recompute=selective&sequence_parallel=true"
    "&price_per_gpu_hour=2.5"
)
OUT = ROOT / "docs" / "images" / "serve.png"


def main() -> None:
    query = sys.argv[1] if len(sys.argv) > 1 else QUERY
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else OUT
    chromium = find_chromium()
    if chromium is None:
        sys.exit("no Chromium: apt-get install chromium")
    server = page_server.start()
    try:
        with tempfile.TemporaryDirectory() as profile, Browser(chromium, Path(profile), 1280, 900) as browser:
            browser.open(server.url + query)
            browser.evaluate("new Promise(done => setTimeout(done, 300))")
            browser.wait_for("document.body.dataset.busy === '0'", timeout_s=60)
            browser.screenshot(out, full_page=False)
    finally:
        server.shutdown()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
