"""Drive the real app in a real browser: start `streamlit run app.py`, open pages in Debian's Chromium.

Used by tests/test_e2e_browser.py and bench/app_latency.py. Every wait is bounded; the server runs in its
own process group and is always stopped.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 860}
PLOT = ".js-plotly-plot"
EXCEPTION = '[data-testid="stException"]'
PROGRESS = '[data-testid="stProgress"]'


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server(str):
    """The base URL of a running `streamlit run` (a str), with the server's process id as `.pid`."""

    pid: int

    def __new__(cls, url: str, pid: int) -> "Server":
        obj = super().__new__(cls, url)
        obj.pid = pid
        return obj


def streamlit_command() -> list[str]:
    """The README's command, `.venv/bin/streamlit run`, with this interpreter's venv (no extra flags)."""
    exe = Path(sys.executable).with_name("streamlit")
    return [str(exe), "run"] if exe.exists() else [sys.executable, "-m", "streamlit", "run"]


@contextlib.contextmanager
def streamlit_server(script: str | Path, *, env: dict[str, str] | None = None, log: Path | None = None,
                     timeout: float = 90.0) -> Iterator[Server]:
    """Run `streamlit run <script>` exactly as the README starts the app; yield its base URL; stop it after.

    The command is the README's, run from the script's folder, so the server reads the checkout's
    `.streamlit/config.toml` (file watcher, address, menu) as a user's server does, with no extra flags.
    The one difference is the port, given through Streamlit's environment variable STREAMLIT_SERVER_PORT
    (a free one, so that a test run never meets an app the user is running on 8501).
    """
    port = free_port()
    script = Path(script)
    cmd = [*streamlit_command(), script.name]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {}), "STREAMLIT_SERVER_PORT": str(port)}
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, cwd=str(script.parent), env=full_env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"streamlit did not answer on {url} within {timeout:.0f} s")
            time.sleep(0.2)
        yield Server(url, proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if log:
            out.close()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) that process `pid` has used so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pid: int, seconds: float = 20.0) -> float:
    """Share of one core that process `pid` uses over the next `seconds` (1.0 = a whole core)."""
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - start)


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A Playwright browser page in Debian's headless Chromium (no `playwright install` needed)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport=VIEWPORT)
            page = context.new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def wait_idle(page, timeout: float = 60.0, settle: float = 0.25) -> float:
    """Wait until the app's script has finished running (and stays finished for `settle` s); returns seconds."""
    start = time.monotonic()
    deadline = start + timeout
    idle_since = None
    while True:
        state = page.get_attribute('[data-testid="stApp"]', "data-test-script-state", timeout=timeout * 1000)
        now = time.monotonic()
        if state == "notRunning":
            idle_since = idle_since or now
            if now - idle_since >= settle:
                return idle_since - start
        else:
            idle_since = None
        if now > deadline:
            raise TimeoutError(f"the app was still running after {timeout:.0f} s")
        page.wait_for_timeout(50)


def wait_jobs(page, timeout: float = 180.0) -> float:
    """Wait until the page shows no background job's progress bar and the app is idle; returns seconds.

    A running job redraws its progress every half second (an st.fragment), so `wait_idle` alone can return
    while it runs; when it ends, the page reruns once more to show the result.
    """
    start = time.monotonic()
    wait_for(page, lambda: count(page, PROGRESS) == 0, timeout, "background jobs to finish")
    wait_idle(page, max(1.0, timeout - (time.monotonic() - start)))
    return time.monotonic() - start


def wait_for(page, predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `predicate()` until true (bounded); returns the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        page.wait_for_timeout(100)
    return time.monotonic() - start


def count(page, selector: str) -> int:
    """How many elements match `selector` right now."""
    return page.locator(selector).count()


def exceptions(page) -> list[str]:
    """Texts of the Streamlit exception boxes on the page (should be empty)."""
    return [t[:500] for t in page.locator(EXCEPTION).all_inner_texts()]


def alerts(page) -> list[str]:
    """Texts of the st.error / st.warning / st.info boxes on the page."""
    return [t[:300] for t in page.locator('[data-testid="stAlert"]').all_inner_texts()]


def goto(page, url: str, timeout: float = 60.0) -> None:
    """Open a URL (a new browser session) and wait for the app to render and go idle."""
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout * 1000)
    wait_idle(page, timeout)


NAV_LINK = '[data-testid="stSidebar"] [data-testid="stPageLink-NavLink"]'


def record_outside_requests(page, url: str) -> list[str]:
    """Start recording every request the browser makes to a host other than the app's (`url`'s host and port,
    on any loopback name); returns the list, which fills as the page loads things. The app is a local, offline
    tool: this list must stay empty (a Material page icon once fetched its favicon from fonts.gstatic.com)."""
    from urllib.parse import urlsplit

    app = urlsplit(url)
    local = {"localhost", "127.0.0.1", "::1", "[::1]"}
    seen: list[str] = []

    def check(request) -> None:
        u = urlsplit(request.url)
        if u.scheme in ("data", "blob", "about"):
            return
        if u.hostname in local and u.port == app.port:
            return
        seen.append(request.url)

    page.on("request", check)
    return seen


def click_nav(page, title: str, timeout: float = 60.0) -> float:
    """Switch page through the app's sidebar menu link titled `title` (same session, no reload).

    Returns the seconds from the click until the app is idle again with that page's title shown.
    """
    link = page.locator(NAV_LINK).filter(has_text=title).first
    start = time.monotonic()
    link.click()
    page.wait_for_function("(t) => { const h = document.querySelector('h1'); return h && h.innerText.trim() === t; }",
                           arg=title, timeout=timeout * 1000)
    wait_idle(page, timeout)
    return time.monotonic() - start


def screenshot_folder() -> Path:
    """Where screenshots go: $FORGETLAB_SCREENSHOTS if set (e.g. docs/screenshots to refresh the README's),
    else a folder under the system temp dir, so that a test run never changes tracked files."""
    import os
    import tempfile

    env = os.environ.get("FORGETLAB_SCREENSHOTS")
    return Path(env) if env else Path(tempfile.gettempdir()) / "forgetlab-e2e-screenshots"


def screenshot(page, name: str, folder: Path | None = None) -> Path:
    """A viewport-sized PNG of the page as <folder>/<name>.png (toasts hidden); see `screenshot_folder`."""
    folder = folder or screenshot_folder()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=False, animations="disabled",
                    style='[data-testid="stToast"], [data-testid="stToastContainer"] {display: none !important}')
    return path
