"""A virtual X display (Xvfb) for the desktop loopback on a machine without a screen, and for tests.

Consumes: a size. Emits: a running `Xvfb` on a free display number (a
random one from 100 up, another if it is taken; Xvfb says when it is ready
through `-displayfd`), its name (":N") and the environment to give programs
that should draw on it.
Stopped (and waited for) on leaving the `with` block.

    with VirtualDisplay(1400, 480) as d:
        subprocess.run([...], env=d.env())
"""

from __future__ import annotations

import os
import random
import select
import shutil
import subprocess
import time


class XvfbMissing(RuntimeError):
    pass


class VirtualDisplay:
    def __init__(self, width: int = 1920, height: int = 1080, depth: int = 24, timeout_s: float = 10.0) -> None:
        self.width, self.height, self.depth = width, height, depth
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.name = ""

    def start(self) -> VirtualDisplay:
        exe = shutil.which("Xvfb")
        if exe is None:
            raise XvfbMissing("Xvfb is not installed (Debian/Ubuntu: apt-get install xvfb)")
        rng = random.Random()
        for _ in range(8):
            # A random high number: clear of the :0, :1, :99 that desktops and scripts take.
            number = rng.randrange(100, 10000)
            if os.path.exists(f"/tmp/.X{number}-lock"):
                continue
            if self._try(exe, number):
                self.name = f":{number}"
                return self
        raise RuntimeError(f"Xvfb did not start (8 display numbers tried, {self.timeout_s:.0f} s each at most)")

    def _try(self, exe: str, number: int) -> bool:
        r, w = os.pipe()
        data = b""
        try:
            self.proc = subprocess.Popen(
                [exe, f":{number}", "-displayfd", str(w), "-screen", "0",
                 f"{self.width}x{self.height}x{self.depth}", "-nolisten", "tcp", "-br", "-noreset"],
                pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            os.close(w)
            w = -1
            # Xvfb writes the number when it is ready, then a newline: read both (closing early kills it).
            deadline = time.monotonic() + self.timeout_s
            while not data.endswith(b"\n"):
                ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
                chunk = os.read(r, 64) if ready else b""
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        if data.decode().strip() == str(number) and self.proc.poll() is None:
            return True
        self.stop()  # taken, or it failed to start: try another number
        return False

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.pop("WAYLAND_DISPLAY", None)
        env["DISPLAY"] = self.name
        return env

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> VirtualDisplay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
