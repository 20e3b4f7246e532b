"""The live dashboard: real HTTP on the run's own event loop, and the page driven in a real headless Chromium."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import structlog
from conftest import ROOT, make_config, run_virtual
from test_observer import FAST

from protocols.layout import render_idle
from protocols.messages import Capture, Tick
from wccl.dashboard import DashboardServer, Hub

CHROMIUM = os.environ.get("WCCL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


async def _get(url_port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", url_port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()  # the server closes every answer
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


async def _next_record(reader: asyncio.StreamReader) -> dict:
    line = await reader.readuntil(b"\n\n")
    assert line.startswith(b"data: ")
    return json.loads(line[6:])


def test_server_answers_over_real_http_on_the_virtual_loop():
    cfg = make_config(**FAST, dashboard={"enabled": True, "port": 0})

    async def go():
        hub = Hub(cfg)
        server = DashboardServer(hub, "127.0.0.1", 0)
        url = await server.start()
        port = int(url.rsplit(":", 1)[1].strip("/"))
        log = structlog.get_logger("wccl")
        try:
            status, headers, page = await _get(port, "/")
            assert status == 200 and headers["Content-Type"].startswith("text/html")
            assert b'id="chart-acc-step"' in page and b"/app.js" in page and b"http" not in page.replace(b"http-equiv", b"")
            status, headers, js = await _get(port, "/app.js")
            assert status == 200 and b"EventSource" in js and headers["Content-Length"] == str(len(js))
            assert (await _get(port, "/../config.toml"))[0] == 404
            assert (await _get(port, "/", "POST"))[0] == 405
            # A log event reaches the hub through the logging tap; a message through the supervisor's tap.
            structlog.contextvars.bind_contextvars(node="alice", step=0)
            log.info("step_applied", loss=2.3, test_accuracy=0.178, test_loss=float("nan"))
            hub.on_message("alice", Tick(sender="alice", step=0, time=1.0, phase="compute", start=1.0, end=1.1))
            image = render_idle(cfg.link.layout(), cfg.screen.width, cfg.screen.height)
            hub.on_message("bob", Capture(sender="bob", time=1.0, image=image, seq=0))
            state = json.loads((await _get(port, "/state.json"))[2])
            events = [r["event"] for r in state["history"]]
            assert events == ["dashboard_listening", "step_applied", "tick"]
            applied = state["history"][1]
            assert applied["test_accuracy"] == 0.178 and applied["test_loss"] is None and applied["node"] == "alice"
            # The event stream: hello, the history so far, the latest thumbnail, then what comes live.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"text/event-stream" in head
            hello = await _next_record(reader)
            assert hello["event"] == "hello" and hello["steps"] == cfg.training.steps
            assert [d["label"] for d in hello["digits"]] and all(d["src"].startswith("data:image/png") for d in hello["digits"])
            got = [(await _next_record(reader))["event"] for _ in range(4)]
            assert got == ["dashboard_listening", "step_applied", "tick", "thumb"]
            log.info("observer_step", applied=1, test_accuracy=0.2, test_loss=2.1, predictions=[1, 2])
            live = await _next_record(reader)
            assert live["event"] == "observer_step" and live["predictions"] == [1, 2]
            thumb = hub.thumbs["bob"]
            assert thumb["codes"] == 1 and thumb["src"].startswith("data:image/jpeg;base64,")
        finally:
            await server.close()
        assert (await _next_record(reader))["event"] == "end"
        assert await reader.read() == b""  # and the stream is closed
        structlog.contextvars.clear_contextvars()

    run_virtual(go)


def test_a_busy_port_falls_back_to_a_free_one(_quiet_logs):
    cfg = make_config(**FAST)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]

        async def go():
            server = DashboardServer(Hub(cfg), "127.0.0.1", busy)
            url = await server.start()
            await server.close()
            return url

        url = run_virtual(go)
    assert url.startswith("http://127.0.0.1:") and not url.endswith(f":{busy}/")
    assert '"dashboard_port_busy"' in _quiet_logs.getvalue()


# ---------------------------------------------------------------------------------- the page in Chromium

def _room_toml(steps: int) -> str:
    phases = ", ".join(f'{{name = "{p["name"]}", seconds = {p["seconds"]}}}' for p in FAST["schedule"]["phases"])
    nodes = "\n".join(f'[[room.nodes]]\nname = "{n["name"]}"\nroles = {json.dumps(n["roles"])}\n'
                      for n in FAST["room"]["nodes"])
    link = "\n".join(f"{k} = {v}" for k, v in FAST["link"].items())
    return f"""[room]
profile = "exact"
clock = "virtual"
{nodes}
[link]
{link}
[schedule]
preset = "custom"
phases = [{phases}]
[training]
steps = {steps}
[logging]
format = "json"
[dashboard]
enabled = true
port = 0
wait_for_page_s = 120   # the run starts when the page is watching: virtual time would not wait for it
linger_s = 120          # and the page can still be read (and reloaded) after the run; SIGINT ends it
"""


class _Lines:
    """A process's stdout as JSON events, read in a thread so the test can drive the browser meanwhile."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.q: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            if line.startswith("{"):
                self.q.put(json.loads(line))
        self.q.put(None)

    def until(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                e = self.q.get(timeout=0.1)
            except queue.Empty:
                continue
            if e is None:
                break
            self.events.append(e)
            if e["event"] == event:
                return e
        raise AssertionError(f"no {event} event; got {[e['event'] for e in self.events][-10:]}")

    def named(self, event: str) -> list[dict]:
        while not self.q.empty():
            e = self.q.get()
            if e is not None:
                self.events.append(e)
        return [e for e in self.events if e["event"] == event]


def _series(page, kind: str) -> dict[str, list[list]]:
    return page.evaluate(f"() => Object.fromEntries(Object.entries(wccl.{kind}).map(([n, ps]) => "
                         "[n, ps.map(p => [p.step, p.value])]))")


def _colour_pixels(page, canvas_id: str, hex_colour: str) -> int:
    return page.evaluate("""([id, hex]) => {
        const c = document.getElementById(id), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const want = [1, 3, 5].map(i => parseInt(hex.substr(i, 2), 16));
        let n = 0;
        for (let i = 0; i < d.length; i += 4)
            if (d[i + 3] > 200 && Math.abs(d[i] - want[0]) + Math.abs(d[i + 1] - want[1]) + Math.abs(d[i + 2] - want[2]) < 30) n++;
        return n;
    }""", [canvas_id, hex_colour])


@pytest.mark.slow
def test_page_in_chromium_follows_a_run_live(tmp_path):
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), f"{CHROMIUM} missing: apt-get install chromium (or set WCCL_CHROMIUM)"
    steps = 4
    cfg_path = tmp_path / "room.toml"
    cfg_path.write_text(_room_toml(steps))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        proc = subprocess.Popen([sys.executable, "-m", "wccl.node", "--config", str(cfg_path)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            out = _Lines(proc)
            url = out.until("dashboard_listening", 60)["url"]
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            problems: list[str] = []
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.goto(url)
            assert page.title() == "WCCL: watching it learn"
            # Watch the server's accuracy chart while the room runs.
            seen, deadline = [], time.monotonic() + 240
            while time.monotonic() < deadline:
                n, done = page.evaluate("() => [wccl.acc && wccl.acc.alice ? wccl.acc.alice.length : 0, !!wccl.finished]")
                seen.append(n)
                if done:
                    break
                time.sleep(0.05)
            finished = out.until("run_finished", 60)
            page.wait_for_timeout(300)  # the last frame of drawing
            # The charts grew while the run went on, one point per step, never by a jump back.
            assert seen == sorted(seen) and seen[-1] == steps
            assert len({n for n in seen if 0 < n < steps}) >= 2, seen
            acc, loss = _series(page, "acc"), _series(page, "loss")
            for node in ("alice", "bob"):
                logged = [e for e in out.named("step_applied") if e["node"] == node]
                assert acc[node] == [[e["step"], e["test_accuracy"]] for e in logged]
                assert loss[node] == [[e["step"], e["test_loss"]] for e in logged]
            watched = out.named("observer_step")
            assert acc["carol"] == [[e["step"], e["test_accuracy"]] for e in watched]
            assert [p[0] for p in acc["alice"]] == list(range(steps))
            # The page shows the accuracy of run_finished, and that the observer matched the server.
            assert float(page.inner_text("#final-accuracy")) == finished["test_accuracy"] == acc["alice"][-1][1]
            assert page.inner_text("#observer-identical") == ("yes" if finished["observer_identical"] else "no")
            assert finished["observer_identical"] is True
            # What was drawn: the lines in the nodes' colours, the frame bars, the cameras, the digits.
            colours = page.evaluate("() => Object.fromEntries(Object.values(wccl.nodes).map(n => [n.name, n.colour]))")
            # (the observer's dashed line is drawn last, over the trainers' equal ones; a legend swatch is 30 px)
            assert _colour_pixels(page, "chart-acc-step", colours["carol"]) > 100
            assert _colour_pixels(page, "chart-frames", "#2e9e54") > 50
            for node in ("alice", "bob", "carol"):
                assert page.get_attribute(f"#node-{node} .cam img", "src").startswith("data:image/jpeg;base64,")
                assert "in view" in page.inner_text(f"#node-{node} .cam .codes")
            shown = page.eval_on_selector_all("#digits .pred", "els => els.map(e => Number(e.textContent))")
            assert shown == watched[-1]["predictions"]
            assert page.inner_text("#node-bob .where").startswith(f"step {steps - 1} ·")
            # Each screen's layout in words, as its node logged it, on its card and in the events.
            for e in out.named("layout_used"):
                words = (f"{e['rows']}x{e['cols']} cells of {e['cell_px']} px, {e['colours']} colours, "
                         f"frames held {round(e['hold_s'] * 1000)} ms")
                assert page.inner_text(f"#node-{e['node']} .layout") == f"screen: {words}"
                assert any(n["text"].startswith(f"{e['node']}'s screen: {words}")
                           for n in page.evaluate("() => wccl.events"))
            assert {e["node"] for e in out.named("layout_used")} == {"alice", "bob"}
            # A reader that asks for another layout mid-run: the screen's card says what it shows that reader,
            # and the events say who asked and why (the records a run logs then, fed to the page's handler).
            page.evaluate("""() => {
              handle({event: "layout_asked", node: "bob", direction: "alice -> bob", read: "31%", why: "worse",
                      layout: "56x103 cells of 12 px, 8 colours, frames held 66 ms",
                      was: "68x124 cells of 10 px, 8 colours, frames held 50 ms"});
              handle({event: "layout_used", node: "alice", reader: "bob", rows: 56, cols: 103, cell_px: 12,
                      colours: 8, hold_s: 0.066, measured: true,
                      was: "68x124 cells of 10 px, 8 colours, frames held 50 ms"});
            }""")
            page.wait_for_function("() => document.querySelector('#node-alice .layout').textContent.includes('to bob')")
            assert page.inner_text("#node-alice .layout") == ("screen: 56x103 cells of 12 px, 8 colours, frames held "
                                                              "66 ms to bob")
            texts = [n["text"] for n in page.evaluate("() => wccl.events")]
            assert any(t.startswith("alice -> bob: asks for 56x103 cells of 12 px") and "31% of its captures read" in t
                       for t in texts), texts[-3:]
            assert "alice's screen to bob: 56x103 cells of 12 px, 8 colours, frames held 66 ms (was 68x124" in " ".join(texts)
            # A page opened after the run gets the whole history.
            late = browser.new_page()
            late.goto(url)
            late.wait_for_function("() => wccl.finished")
            assert _series(late, "acc") == acc
            assert not problems, problems
        finally:
            proc.send_signal(signal.SIGINT)  # ends the linger: the run itself was over
            try:
                proc.wait(timeout=30)
            finally:
                proc.kill()
            browser.close()
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
