"""Screenshots of looptune's HTML reports as a browser draws them, and the checks a person makes
on them (issue 34): every image decodes, the console shows no error, nothing is wider than the
page. tests/report/test_browser.py runs the same checks on the same reports.

    python tools/screenshots.py --data DIR     # rewrites docs/screenshots/*.png
    python tools/screenshots.py --data DIR --out OUT --keep REPORTS   # elsewhere, keep the reports

Each report is built by a small real run on MNIST (`looptune bench mnist --epochs 2` of two
recipes, `looptune diagnose` of examples/mnist_tutorial.py for 40 steps, `looptune tune loader`
and `tune batch-size` on mnist-mlp with a 4 s budget: about 30 s on 2 cores), opened in headless
Chromium (Debian's `chromium` package, or $LOOPTUNE_CHROMIUM) at 1280 px wide, checked, and its
first 1600 px saved as docs/screenshots/report-KIND.png (KIND: bench, diagnose, tune for tune
loader, tune-batch-size). No Python package beyond looptune[plot]: the browser is driven over
the Chrome DevTools Protocol on a pipe (--remote-debugging-pipe). Exits 1 when a
check fails (the screenshot is still written, to look at), 2 when no Chromium is found.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 1280  # px: a laptop's browser window
MAX_HEIGHT = 1600  # px of the page kept in a screenshot (the top: verdict, first table, plots)
NAMES = ("chromium", "chromium-browser")
# the report of each kind: its small looptune command ({data}: the MNIST folder, {report}: the
# report folder, {repo}: this checkout, relative to the working directory where it is inside it)
REPORTS = {
    "bench": ["bench", "mnist", "--epochs", "2", "--recipes", "tensorized,device",
              "--target", "0.95", "--data", "{data}", "--report", "{report}"],
    "diagnose": ["diagnose", "--steps", "40", "--warmup", "3", "--report", "{report}",
                 "{repo}/examples/mnist_tutorial.py", "--data", "{data}"],
    "tune": ["tune", "loader", "--workload", "mnist-mlp", "--data", "{data}", "--budget-s", "4",
             "--report", "{report}"],
    "tune-batch-size": ["tune", "batch-size", "--workload", "mnist-mlp", "--data", "{data}",
                        "--budget-s", "4", "--report", "{report}"],
}

# Run in the page once it has loaded: what a person would notice, as data. Elements clipped by
# a scrolling ancestor (overflow other than visible) do not widen the page and are not counted.
CHECK_JS = r"""
(async () => {
  await document.fonts.ready;
  const images = Array.from(document.images);
  const decoded = await Promise.all(images.map(
    img => img.decode().then(() => null, err => String(err))));
  const vw = window.innerWidth;
  const body = document.body.getBoundingClientRect();
  const pad = parseFloat(getComputedStyle(document.body).paddingRight) || 0;
  const column = body.right - pad;
  const name = el => el.tagName.toLowerCase() + (el.className ? '.' + el.className : '') +
    ' "' + (el.textContent || el.alt || '').trim().replace(/\s+/g, ' ').slice(0, 60) + '"';
  const clipped = el => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== 'visible') return true;
    }
    return false;
  };
  const wide = [], outside = [], scrolling = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (getComputedStyle(el).overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1) {
      scrolling.push({element: name(el), width: el.clientWidth, content: el.scrollWidth});
    }
    if (clipped(el)) continue;
    if (r.right > vw + 0.5 || r.left < -0.5) {
      wide.push({element: name(el), left: Math.round(r.left), right: Math.round(r.right)});
    } else if (r.right > column + 0.5) {
      outside.push({element: name(el), right: Math.round(r.right), column: Math.round(column)});
    }
  }
  return {
    title: document.title, innerWidth: vw,
    scrollWidth: document.documentElement.scrollWidth,
    scrollHeight: document.documentElement.scrollHeight,
    images: images.map((img, i) => ({
      alt: img.alt, complete: img.complete, naturalWidth: img.naturalWidth,
      naturalHeight: img.naturalHeight, shownWidth: Math.round(img.getBoundingClientRect().width),
      decodeError: decoded[i]})),
    tables: document.querySelectorAll('table').length,
    wide, outside, scrolling,
  };
})()
"""


def find_chromium() -> str | None:
    """The Chromium to drive: $LOOPTUNE_CHROMIUM, else ``chromium`` or ``chromium-browser`` on
    PATH; None when there is none."""
    given = os.environ.get("LOOPTUNE_CHROMIUM")
    if given:
        return shutil.which(given)
    return next((found for found in map(shutil.which, NAMES) if found), None)


class BrowserError(RuntimeError):
    """Chromium did not start, died, or did not answer in time."""


class Browser:
    """One headless Chromium driven over the DevTools Protocol on a pipe (fds 3 and 4 of the
    child: commands in, NUL-terminated JSON out). Use as a context manager."""

    def __init__(self, binary: str | None = None, timeout: float = 30.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no Chromium found: install Debian's chromium package, or set "
                               "LOOPTUNE_CHROMIUM to a Chromium or Chrome binary")
        self.timeout = timeout
        self._id = 0
        self._buffer = b""
        self._events: list[dict] = []

    def __enter__(self) -> Browser:
        self._profile = tempfile.TemporaryDirectory(prefix="looptune-chromium-")
        self._log = open(Path(self._profile.name) / "stderr.txt", "wb")
        to_child, self._to_browser = os.pipe()
        self._from_browser, from_child = os.pipe()
        # above 4, so placing them at 3 and 4 in the child cannot overwrite one with the other
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child, from_child)]
        os.close(to_child)
        os.close(from_child)

        def at_3_and_4() -> None:  # in the child, before exec: dup2 leaves them inheritable
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        args = [self.binary, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                "--hide-scrollbars", f"--user-data-dir={self._profile.name}",
                f"--window-size={WIDTH},900", "about:blank"]
        try:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=self._log,
                                          close_fds=False, preexec_fn=at_3_and_4)
        except OSError as err:
            for fd in (self._to_browser, self._from_browser):
                os.close(fd)
            self._log.close()
            self._profile.cleanup()
            raise BrowserError(f"cannot start {self.binary}: {err}") from None
        finally:
            for fd in high:
                os.close(fd)
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self.send("Target.attachToTarget",
                                      {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable", session=self._session)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._proc.poll() is None:
                try:
                    self.send("Browser.close", timeout=5)
                except BrowserError:
                    pass
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._log.close()
            self._profile.cleanup()

    # ------------------------------------------------------------------------------ protocol

    def _stderr_tail(self) -> str:
        self._log.flush()
        text = (Path(self._profile.name) / "stderr.txt").read_text(errors="replace")
        return "\n".join(text.splitlines()[-15:])

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer in {self.timeout:.0f} s")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium exited (status {self._proc.poll()}); its stderr "
                                   f"ends:\n{self._stderr_tail()}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, *, session: str | None = None,
             timeout: float | None = None) -> dict:
        """Send one command, wait for its answer (events meanwhile are kept); its result."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._to_browser, data):]
        except OSError as err:
            raise BrowserError(f"cannot talk to Chromium ({err}); its stderr ends:\n"
                               f"{self._stderr_tail()}") from None
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message')}")
                return answer.get("result", {})
            if "method" in answer:
                self._events.append(answer)

    def _wait_event(self, method: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method:
                    return self._events.pop(i)
            message = self._read_message(deadline)
            if "method" in message:
                self._events.append(message)

    # ------------------------------------------------------------------------------- pages

    def _errors(self) -> list[str]:
        """Console errors, uncaught exceptions and the browser's own error log lines since the
        last call (the events are consumed)."""
        errors, keep = [], []
        for event in self._events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = (details.get("exception") or {}).get("description") or details.get("text")
                errors.append(f"uncaught: {text}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error",
                                                                               "assert"):
                args = " ".join(str(a.get("value", a.get("description", "")))
                                for a in params.get("args", []))
                errors.append(f"console.{params['type']}: {args}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}"
                              .rstrip())
            elif not method.startswith(("Runtime.", "Log.")):
                keep.append(event)
        self._events = keep
        return errors

    def open(self, page: Path, width: int = WIDTH, height: int = 900) -> dict:
        """Load ``page`` in a window ``width`` px wide and say what a person would see: the
        :data:`CHECK_JS` record plus ``errors`` (the console's errors while it loaded)."""
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session=self._session)
        self._errors()
        self._events = [e for e in self._events if e["method"] != "Page.loadEventFired"]
        answer = self.send("Page.navigate", {"url": Path(page).resolve().as_uri()},
                           session=self._session)
        if answer.get("errorText"):
            raise BrowserError(f"cannot open {page}: {answer['errorText']}")
        self._wait_event("Page.loadEventFired")
        result = self.send("Runtime.evaluate", {"expression": CHECK_JS, "awaitPromise": True,
                                                "returnByValue": True}, session=self._session)
        if "exceptionDetails" in result:
            raise BrowserError(f"the check script failed in {page}: "
                               f"{result['exceptionDetails'].get('text')}")
        seen = result["result"]["value"]
        # a moment for errors logged after load (late scripts, lazy images)
        self.send("Runtime.evaluate", {"expression": "new Promise(r => setTimeout(r, 50))",
                                       "awaitPromise": True}, session=self._session)
        seen["errors"] = self._errors()
        return seen

    def screenshot(self, out: Path, height: int) -> Path:
        """PNG of the page opened last: ``WIDTH`` x ``height`` px from its top."""
        shot = self.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1}},
            session=self._session)
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(shot["data"]))
        return out


def problems(seen: dict, narrow: bool = False) -> list[str]:
    """What a person would see wrong on a page :meth:`Browser.open` looked at; [] if nothing.
    In a ``narrow`` window (a phone, half a screen) a wide table may scroll sideways inside its
    box; at full width (1280 px) every table fits, nothing needs scrolling sideways."""
    found = [f"console error while loading: {e}" for e in seen["errors"]]
    for img in seen["images"]:
        if not (img["complete"] and img["naturalWidth"] > 0 and img["decodeError"] is None):
            found.append(f"image {img['alt']!r} does not decode (naturalWidth "
                         f"{img['naturalWidth']}, {img['decodeError'] or 'no error given'})")
    if seen["scrollWidth"] > seen["innerWidth"]:
        found.append(f"the page scrolls sideways: {seen['scrollWidth']} px of content in a "
                     f"{seen['innerWidth']} px window")
    found += [f"wider than the window: {w['element']} spans {w['left']}..{w['right']} px"
              for w in seen["wide"]]
    found += [f"sticks out of the text column: {o['element']} ends at {o['right']} px, the "
              f"column at {o['column']} px" for o in seen["outside"]]
    if not narrow:
        found += [f"needs scrolling sideways to read: {s['element']} holds {s['content']} px in "
                  f"{s['width']} px" for s in seen["scrolling"]]
    return found


def build_reports(out: Path, data: str | os.PathLike, kinds: list[str] | None = None) -> dict:
    """Run each report's small command with ``--report out/KIND``; {kind: report.html}."""
    from looptune.cli.main import main

    pages = {}
    for kind in kinds or list(REPORTS):
        folder = Path(out) / kind
        repo = os.path.relpath(ROOT)
        argv = [a.format(data=data, report=folder, repo=ROOT if repo.startswith("..") else repo)
                for a in REPORTS[kind]]
        code = main(argv)
        if code != 0:
            raise RuntimeError(f"looptune {' '.join(argv)} exited {code}")
        pages[kind] = folder / "report.html"
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("LOOPTUNE_DATA"),
                        help="the MNIST folder (default: $LOOPTUNE_DATA)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots"),
                        help="folder for report-KIND.png (default docs/screenshots)")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="build the reports in DIR and keep them (default: a temp folder)")
    parser.add_argument("--kinds", default=",".join(REPORTS),
                        help=f"comma-separated, of {', '.join(REPORTS)}")
    args = parser.parse_args(argv)
    if not args.data:
        parser.error("--data DIR (the MNIST files) is needed, or set LOOPTUNE_DATA")
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(REPORTS))
    if unknown:
        parser.error(f"unknown kinds {unknown}: give some of {', '.join(REPORTS)}")
    if find_chromium() is None:
        print("no Chromium found: apt-get install chromium (or set LOOPTUNE_CHROMIUM)",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="looptune-reports-") as tmp:
        pages = build_reports(Path(args.keep or tmp), args.data, kinds)
        failed = 0
        with Browser() as browser:
            for kind, page in pages.items():
                seen = browser.open(page)
                shot = browser.screenshot(Path(args.out) / f"report-{kind}.png",
                                          min(seen["scrollHeight"], MAX_HEIGHT))
                found = problems(seen)
                failed += bool(found)
                print(f"{kind}: {len(seen['images'])} images, {seen['tables']} tables, page "
                      f"{seen['scrollWidth']} x {seen['scrollHeight']} px -> {shot}")
                for problem in found:
                    print(f"  PROBLEM: {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
