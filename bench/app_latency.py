"""App latency in a real browser: first render of each page and re-render after a page switch.

Peer, measured in the same run: a bare Streamlit app (st.navigation over two pages that only write a title
and a line) served the same way. Each figure is the median of --repeat measurements; ratios are
forgetlab / bare. "First render" = open the page's URL in a new browser session (a new Streamlit session;
the server process is warm, so process-wide caches such as the loaded pool are shared, as in real use).
"Re-render" = in one session, switch to another page and back through the sidebar. Times run until the
app's script is idle again (the page fully drawn). The cold start (the first request after the server
started: imports, pool opening) is printed on its own.

    python bench/app_latency.py [--home FORGETLAB_HOME] [--repeat 3]

Without --home, the tiny pico zoo is built into a temporary workspace first (about a minute).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.harness import chromium, click_nav, goto, streamlit_server  # noqa: E402

BARE_APP = """
import streamlit as st
pages = [st.Page("hello.py", title="Hello", default=True), st.Page("other.py", title="Other")]
nav = st.navigation(pages, position="hidden")
with st.sidebar:
    for p in pages:
        st.page_link(p, label=p.title)
    st.write("sidebar")
nav.run()
"""
BARE_PAGE = "import streamlit as st\nst.title({title!r})\nst.write('Hello, world.')\n"


def _timed_goto(page, url: str) -> float:
    start = time.monotonic()
    goto(page, url, timeout=180)
    return time.monotonic() - start


def measure(url: str, pages: list[tuple[str, str, str]], repeat: int, shots: Path) -> dict:
    """Cold start, then per (url path, title, other page's title): median first render in a new session and
    median re-render when coming back from the other page."""
    out: dict = {"pages": {}}
    with chromium() as page:
        out["cold"] = _timed_goto(page, url)
        for path, title, other in pages:
            first, again = [], []
            try:
                for _ in range(repeat):
                    first.append(_timed_goto(page, f"{url}/{path}"))
                    click_nav(page, other, timeout=180)
                    again.append(click_nav(page, title, timeout=180))
            except Exception:
                page.screenshot(path=str(shots / f"failed-{title}.png"))
                raise
            out["pages"][title] = (statistics.median(first), statistics.median(again))
    return out


def bare_app(folder: Path) -> Path:
    """A bare two-page app served like forgetlab's: same menu (st.page_link) and the same config.toml."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / ".streamlit", folder / ".streamlit", dirs_exist_ok=True)
    (folder / "app.py").write_text(BARE_APP)
    (folder / "hello.py").write_text(BARE_PAGE.format(title="Hello"))
    (folder / "other.py").write_text(BARE_PAGE.format(title="Other"))
    return folder / "app.py"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, help="a FORGETLAB_HOME holding zoo/ (default: build the tiny pico zoo)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (server logs)")
    args = ap.parse_args(argv)

    from forgetlab.ui.navigation import existing_pages

    tmp = Path(tempfile.mkdtemp(prefix="app-latency-"))
    home = args.home
    if home is None:
        from forgetlab.zoo import build

        home = tmp / "home"
        t = time.monotonic()
        build(preset="pico", size="tiny", home=home)
        print(f"built the tiny pico zoo in {time.monotonic() - t:.0f} s")
    specs = existing_pages(ROOT / "pages")
    # the default page lives at "/", the others at "/<stem>"; come back to each from Runs (Runs: from Models)
    ours = [("" if i == 0 else p.stem, p.title, specs[0].title if p.stem == "runs" else specs[-1].title)
            for i, p in enumerate(specs)]

    with streamlit_server(bare_app(tmp / "bare"), log=tmp / "bare.log") as url:
        bare = measure(url, [("", "Hello", "Other")], args.repeat, tmp)
    with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(home)}, log=tmp / "app.log") as url:
        app = measure(url, ours, args.repeat, tmp)
    b_first, b_again = bare["pages"]["Hello"]

    import os

    print(f"chromium headless, {args.repeat} repeats (median), workspace {home}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"cold start (first request after server start): forgetlab {app['cold']:.2f} s, "
          f"bare {bare['cold']:.2f} s, ratio {app['cold'] / bare['cold']:.1f}x")
    print(f"{'page':<12}{'first render s':>16}{'÷ bare':>9}{'re-render s':>14}{'÷ bare':>9}")
    print(f"{'(bare)':<12}{b_first:>16.2f}{1:>9.1f}{b_again:>14.2f}{1:>9.1f}")
    for title, (first, again) in app["pages"].items():
        print(f"{title:<12}{first:>16.2f}{first / b_first:>9.1f}{again:>14.2f}{again / b_again:>9.1f}")
    if args.keep:
        print(f"server logs in {tmp}")


if __name__ == "__main__":
    main()
