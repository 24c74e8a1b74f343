"""App latency in a real browser: first render of each page and re-render after a page switch; and the
time of a background job in the app against the same job on the CLI.

Peer, measured in the same run: a bare Streamlit app (st.navigation over two pages that only write a title
and a line) served the same way. Each figure is the median of --repeat measurements; ratios are
forgetlab / bare. "First render" = open the page's URL in a new browser session (a new Streamlit session;
the server process is warm, so process-wide caches such as the loaded pool are shared, as in real use).
"Re-render" = in one session, switch to another page and back through the sidebar. Times run until the
app's script is idle again (the page fully drawn). The cold start (the first request after the server
started: imports, pool opening) is printed on its own.

Jobs (--jobs): a fine-tune comparison (AdamW/MoFO/SFA/L2/L1) and a WiSE-FT α sweep with the same settings, run
by `forgetlab finetune --compare` / `forgetlab sweep alpha` (wall time of the command: Python start, imports
and pool opening included; also shown without that start-up, measured by a command that only imports and
opens the pool) and by the app in Chromium (click to result drawn; the server is warm, the pool already
open). Ratios are app / CLI; the issue asks for ≤ 1.3.

    python bench/app_latency.py [--home FORGETLAB_HOME] [--repeat 3] [--jobs] [--no-pages]

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

from tests.e2e.harness import chromium, click_nav, goto, streamlit_server, wait_jobs  # noqa: E402

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


FINETUNE = {"steps": 30, "record every k steps": 5, "general blocks (max)": 16, "eval pairs (max)": 50}
SWEEP = {"α values": "0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1", "general blocks (max)": 32,
         "pairs per task (max)": 50}     # the Forgetting page's defaults


CPU: dict[str, list[float]] = {}      # CPU seconds per job and side ("cli:<job>", "app:<job>"), robust to load


def _cli(args: list[str], home: Path, name: str = "") -> float:
    import os
    import resource
    import subprocess

    exe = Path(sys.executable).with_name("forgetlab")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([str(exe), *args], check=True, env={**os.environ, "FORGETLAB_HOME": str(home)},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if name:
        CPU.setdefault(f"cli:{name}", []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return time.monotonic() - start


def cli_startup(pool_yaml: Path) -> float:
    """Seconds for a fresh Python to import the CLI's modules and open the pool with its base model (its CPU
    seconds go to CPU["cli:start-up"])."""
    import resource
    import subprocess

    code = ("import forgetlab.cli, forgetlab.train.runs, forgetlab.analysis.sweeps; from forgetlab.core.pool import ModelPool; "
            f"ModelPool.from_yaml({str(pool_yaml)!r}).load('base')")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault("cli:start-up", []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return time.monotonic() - start


def cli_jobs(pool_yaml: Path, home: Path, task: str, model: str) -> dict[str, float]:
    """Wall time of the CLI commands running the two jobs with the app's settings."""
    f, w = FINETUNE, SWEEP
    return {
        "fine-tune comparison": _cli(["finetune", str(pool_yaml), "--task", task, "--compare", "--steps",
                                      str(f["steps"]), "--eval-every", str(f["record every k steps"]),
                                      "--max-general", str(f["general blocks (max)"]), "--max-task",
                                      str(f["eval pairs (max)"]), "--device", "cpu"], home, "fine-tune comparison"),
        "WiSE-FT α sweep": _cli(["sweep", "alpha", str(pool_yaml), "--model", model, "--alphas",
                                 w["α values"].replace(" ", ""), "--max-general", str(w["general blocks (max)"]),
                                 "--max-task", str(w["pairs per task (max)"]), "--device", "cpu"], home,
                                "WiSE-FT α sweep"),
    }


def _fill(page, values: dict) -> None:
    from tests.e2e.harness import wait_idle

    for label, value in values.items():
        box = page.get_by_label(label, exact=True).first
        box.fill(str(value))
        box.press("Enter")
        wait_idle(page)


def _timed_click(page, name: str, pid: int | None = None, job: str = "") -> float:
    """Seconds from the click until the job's progress bar has come and gone and the page is idle (and the
    server's CPU seconds meanwhile, kept in CPU["app:<job>"] when `pid` is given)."""
    from tests.e2e.harness import PROGRESS, count, cpu_seconds, wait_for

    cpu0 = cpu_seconds(pid) if pid else 0.0
    start = time.monotonic()
    page.get_by_role("button", name=name, exact=True).first.click()
    wait_for(page, lambda: count(page, PROGRESS) > 0, 120, f"the job of {name!r} to start")
    wait_jobs(page, 1800)
    if pid:
        CPU.setdefault(f"app:{job}", []).append(cpu_seconds(pid) - cpu0)
    return time.monotonic() - start


def app_jobs(url: str, task: str) -> dict[str, float]:
    """Click to result of the two jobs in the app (Fine-tune page in comparison mode; Forgetting page)."""
    out = {}
    with chromium() as page:
        goto(page, f"{url}/finetune", timeout=180)
        from tests.e2e.harness import wait_idle

        page.get_by_label("task", exact=True).first.click()
        page.get_by_role("option", name=task, exact=True).click()
        wait_idle(page)
        page.get_by_text("comparison", exact=True).click()
        wait_idle(page)
        _fill(page, FINETUNE)
        out["fine-tune comparison"] = _timed_click(page, "Fine-tune", getattr(url, "pid", None),
                                                   "fine-tune comparison")
        goto(page, f"{url}/forgetting", timeout=180)
        _fill(page, SWEEP)
        out["WiSE-FT α sweep"] = _timed_click(page, "Run sweep", getattr(url, "pid", None), "WiSE-FT α sweep")
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
    ap.add_argument("--jobs", action="store_true", help="also time a fine-tune comparison and a sweep, app vs CLI")
    ap.add_argument("--no-pages", action="store_true", help="skip the page latencies")
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

    import os

    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    if not args.no_pages:
        with streamlit_server(bare_app(tmp / "bare"), log=tmp / "bare.log") as url:
            bare = measure(url, [("", "Hello", "Other")], args.repeat, tmp)
        with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(home)}, log=tmp / "app.log") as url:
            app = measure(url, ours, args.repeat, tmp)
        b_first, b_again = bare["pages"]["Hello"]
        print(f"chromium headless, {args.repeat} repeats (median), workspace {home}, {load}")
        print(f"cold start (first request after server start): forgetlab {app['cold']:.2f} s, "
              f"bare {bare['cold']:.2f} s, ratio {app['cold'] / bare['cold']:.1f}x")
        print(f"{'page':<12}{'first render s':>16}{'÷ bare':>9}{'re-render s':>14}{'÷ bare':>9}")
        print(f"{'(bare)':<12}{b_first:>16.2f}{1:>9.1f}{b_again:>14.2f}{1:>9.1f}")
        for title, (first, again) in app["pages"].items():
            print(f"{title:<12}{first:>16.2f}{first / b_first:>9.1f}{again:>14.2f}{again / b_again:>9.1f}")
    if args.jobs:
        import torch
        from forgetlab.core.pool import ModelPool
        from forgetlab.core.workspace import use_home
        from forgetlab.ui.settings import zoo_presets

        use_home(home)
        pool_yaml = next(iter(zoo_presets().values()))
        pool = ModelPool.from_yaml(pool_yaml)
        task, model = pool.task_names[0], pool.model_names[0]
        cli_runs, app_runs, starts = [], [], []
        with streamlit_server(ROOT / "app.py", env={"FORGETLAB_HOME": str(home)}, log=tmp / "jobs.log") as url:
            for _ in range(args.repeat):        # interleaved, so that a change of load hits both sides
                starts.append(cli_startup(pool_yaml))
                cli_runs.append(cli_jobs(pool_yaml, home, task, model))
                app_runs.append(app_jobs(url, task))
        startup = statistics.median(starts)
        cli = {k: statistics.median(r[k] for r in cli_runs) for k in cli_runs[0]}
        app_t = {k: statistics.median(r[k] for r in app_runs) for k in app_runs[0]}
        print(f"jobs on {pool_yaml} (task {task}, model {model}); torch {torch.get_num_threads()} threads by "
              f"default; medians of {args.repeat}, CLI and app interleaved; {load} at the start, "
              f"{os.getloadavg()[0]:.1f} at the end; CLI start-up (imports + pool) {startup:.1f} s")
        print(f"{'job':<22}{'CLI s':>8}{'CLI − start s':>15}{'app s':>8}{'app ÷ CLI':>11}{'÷ (CLI − start)':>17}")
        for name, c in cli.items():
            a = app_t[name]
            print(f"{name:<22}{c:>8.1f}{c - startup:>15.1f}{a:>8.1f}{a / c:>11.2f}{a / max(c - startup, 1e-9):>17.2f}")
        print("every run (CLI s / app s): " + "; ".join(
            f"{k}: " + ", ".join(f"{c[k]:.1f}/{a[k]:.1f}" for c, a in zip(cli_runs, app_runs)) for k in cli))
        # CPU seconds: what the job cost the machine, much less sensitive to other load than wall time
        boot = statistics.median(CPU["cli:start-up"])
        print(f"CPU seconds (medians; CLI start-up {boot:.1f} CPU-s; app = the whole server while the job ran):")
        for name in cli:
            c, a = statistics.median(CPU[f"cli:{name}"]), statistics.median(CPU[f"app:{name}"])
            print(f"  {name:<22} CLI {c:.1f}, CLI − start-up {c - boot:.1f}, app {a:.1f}: app ÷ (CLI − start-up) "
                  f"{a / max(c - boot, 1e-9):.2f}")
    if args.keep:
        print(f"server logs in {tmp}")


if __name__ == "__main__":
    main()
