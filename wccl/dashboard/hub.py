"""The dashboard's hub: what the page shows, gathered from the run's logs and messages.

Consumes: every log event that passes the level filter (a tap in wccl.runtime.logs)
and every message a node's supervisor routes (`on_message`, a one-way tap:
the hub never answers a node, so it is no channel between nodes).
Emits: records for the page, kept in order for the whole run (`history`),
so that a page opened late, or a run that virtual time finished in
seconds, still shows every point; and the latest thumbnail of each camera
(`thumbs`: a downscaled JPEG with the codes the reader finds outlined).
Each reader subscribes to an event that is set when something was added,
then reads what is new; nothing here blocks.

The hub is a monitoring tool outside the nodes: it loads its own copy of the
held-out digits to draw them, and pairs them with the predictions the
observer logs.
"""

from __future__ import annotations

import asyncio
import base64
import math
import time
import uuid
from typing import Any

import cv2
import numpy as np

from protocols.messages import Capture, Message, Tick

# The log events the page uses (everything else stays in the terminal).
EVENTS = frozenset({
    "run_started", "run_finished", "run_interrupted", "run_failed", "node_started", "node_finished",
    "step_applied", "worker_finished", "average_missing", "gradients_averaged", "gradient_missing",
    "step_skipped", "steps_made_up", "link_report", "clock_synced", "observer_step", "observer_missed_step",
    "observer_recovered", "observer_finished", "observer_snapshot_checked", "dashboard_listening",
    "actor_restarted", "actor_failed", "schedule_sized", "schedule_changed", "snapshot_shown", "snapshot_adopted",
    "layout_used", "layout_asked", "screen_lost", "screen_unread", "screen_found_again", "camera_reads_nothing",
})
_SKIP_FIELDS = {"level", "timestamp", "actor", "exc_info"}
THUMB_WIDTH = 320
DIGITS = 8


def _clean(v: Any) -> Any:
    """A value JSON (and the browser's JSON.parse) can take: no NaN, no numpy scalars."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (np.floating, np.integer)):
        return _clean(v.item())
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if v is None or isinstance(v, (str, int, bool)):
        return v
    return str(v)


class Hub:
    def __init__(self, config: Any) -> None:
        self.config = config
        self.run_id = uuid.uuid4().hex[:12]
        self.history: list[dict[str, Any]] = []
        self.thumbs: dict[str, dict[str, Any]] = {}  # node -> latest thumbnail record (with "v")
        self.thumb_every = 1.0 / config.dashboard.thumbs_per_s
        self._thumb_due: dict[str, float] = {}
        self._layout = config.link.layout()
        self._readers: set[asyncio.Event] = set()
        self.pages = 0  # event streams opened so far (pages that watched)
        self.closed = False
        self.digits = self._digits(config)

    # ------------------------------------------------------------------ feeds
    def on_event(self, event: dict[str, Any]) -> None:
        """A log event (called by the logging tap, in the logging call: keep it cheap)."""
        name = event.get("event")
        if name not in EVENTS:
            return
        rec = {k: _clean(v) for k, v in event.items() if k not in _SKIP_FIELDS}
        self._add(rec)

    def on_message(self, node: str, msg: Message) -> None:
        """A message a node routed (called by its supervisor before delivery: keep it cheap)."""
        if isinstance(msg, Tick):
            if msg.step >= self.config.training.steps:
                return  # the reduce ticks up to the last step's deadline: no step of the run
            self._add({"event": "tick", "node": node, "step": msg.step, "phase": msg.phase,
                       "t": round(self._now(), 3), "start": msg.start, "end": msg.end})
        elif isinstance(msg, Capture):
            now = time.monotonic()  # thumbnails are paced for the people watching, in wall time
            if now < self._thumb_due.get(node, 0.0):
                return
            self._thumb_due[node] = now + self.thumb_every
            self._thumb(node, msg.image)

    def _add(self, rec: dict[str, Any]) -> None:
        self.history.append(rec)
        self._wake()

    def _wake(self) -> None:
        for ev in self._readers:
            ev.set()

    @staticmethod
    def _now() -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return float("nan")

    # ------------------------------------------------------------------ pictures
    def _thumb(self, node: str, image: np.ndarray) -> None:
        from wccl.imaging.reader import find_quads

        h, w = image.shape[:2]
        scale = THUMB_WIDTH / w
        small = cv2.resize(image, (THUMB_WIDTH, max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
        quads = find_quads(image, self._layout)
        for q in quads:
            pts = np.round(q.corners * scale).astype(np.int32).reshape(-1, 1, 2)
            cv2.polylines(small, [pts], isClosed=True, color=(80, 255, 80), thickness=1, lineType=cv2.LINE_AA)
        ok, jpg = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, 70])
        if not ok:
            return
        v = self.thumbs.get(node, {}).get("v", 0) + 1
        self.thumbs[node] = {"event": "thumb", "node": node, "v": v, "codes": len(quads),
                             "t": round(self._now(), 3), "width": small.shape[1], "height": small.shape[0],
                             "src": "data:image/jpeg;base64," + base64.b64encode(jpg.tobytes()).decode()}
        self._wake()

    @staticmethod
    def _digits(config: Any) -> list[dict[str, Any]]:
        """The first held-out digits (the observer logs its predictions for the same ones)."""
        from wccl.training.data import load_dataset

        tr = config.training
        ds = load_dataset(tr.dataset, seed=tr.data_seed, test_size=tr.test_size)
        out = []
        for i in range(min(DIGITS, len(ds.test_y))):
            img = (ds.test_x[i, 0].numpy() * 255).round().astype(np.uint8)
            _, png = cv2.imencode(".png", cv2.resize(img, (56, 56), interpolation=cv2.INTER_NEAREST))
            out.append({"label": int(ds.test_y[i]),
                        "src": "data:image/png;base64," + base64.b64encode(png.tobytes()).decode()})
        return out

    # ------------------------------------------------------------------ readers
    def hello(self) -> dict[str, Any]:
        """The first record a page gets: which run this is, and what does not change."""
        cfg = self.config
        # A fixed schedule is known now; an `auto` one when the server sized it (`schedule_sized`, ticks).
        fixed = cfg.schedule.resolved() if cfg.schedule.preset != "auto" else []
        return {"event": "hello", "run_id": self.run_id, "steps": cfg.training.steps,
                "step_period_s": sum(s for _, s in fixed) or None,
                "phases": [[n, s] for n, s in fixed],
                "nodes": [{"name": n.name, "roles": list(n.roles)} for n in cfg.room.nodes],
                "server": cfg.room.server, "profile": cfg.room.profile, "clock": cfg.room.clock,
                "digits": self.digits}

    def subscribe(self) -> asyncio.Event:
        """An event set whenever something is added (or the hub closes); the reader clears it."""
        ev = asyncio.Event()
        ev.set()
        self._readers.add(ev)
        return ev

    def unsubscribe(self, ev: asyncio.Event) -> None:
        self._readers.discard(ev)

    def close(self) -> None:
        self.closed = True
        self._wake()
