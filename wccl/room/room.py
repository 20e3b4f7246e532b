"""The simulated room and its per-node screens and cameras.

Profile `exact`: a camera sees every other node's screen pixel for pixel,
side by side in room order (a perfect camera). Profiles `ideal`, `webcam`
and `harsh` (wccl/room/params.py) put the nodes in a room (poses, screens
as planes, cameras as pinholes) and render each capture through the
channel of wccl/room/channel.py: optics, sensor, auto exposure, time
mixing, compression.

Consumes: images shown on each node's screen (with the true time they went
up). Emits: for each camera capture, one image of what that camera sees.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import math
from fractions import Fraction

import numpy as np
import structlog

from protocols.layout import blank
from wccl.room import geometry
from wccl.room.channel import CameraModel, ScreenModel
from wccl.room.params import (OTHER_PROFILES, POSE_KEYS, ChannelParams, check_overrides, check_profile,
                              exact_room_problem, resolve)
from wccl.room.timing import CaptureSchedule, Exposure, capture_rng
from wccl.runtime.timebase import NodeClock


# Parameters that stay as the run started: the camera's resolution, the stream's codec, the stage switches
# (a change is the room's light, a laptop's pose, a screen's brightness, the camera's rate or optics).
FIXED_KEYS = frozenset({"camera_width", "camera_height", "codec", "h264_preset", "disable"})
RAMP_STEP_S = 0.25  # a ramp moves in steps this long (the room is rebuilt at each)


def _between(a, b, f: float):
    """`a` moved a share `f` of the way to `b`: numbers and tuples of numbers glide, the rest switch at once."""
    if f >= 1.0:
        return b
    if isinstance(b, bool) or a is None or b is None:
        return b
    if isinstance(b, (int, float)) and isinstance(a, (int, float)):
        v = a + (b - a) * f
        return round(v) if isinstance(b, int) else v
    if isinstance(b, tuple) and isinstance(a, tuple) and len(a) == len(b):
        return tuple(_between(x, y, f) for x, y in zip(a, b))
    return b


class SimulatedRoom:
    HISTORY = 8  # screen images kept per node: enough for any exposure window

    def __init__(self, node_names: list[str], screen_w: int, screen_h: int, fps: float,
                 profile: str = "exact", seed: int = 0, channel: dict | None = None,
                 node_channels: list[dict] | None = None) -> None:
        check_profile(profile)
        if len(set(node_names)) != len(node_names):
            raise ValueError("node names must be unique")
        node_channels = list(node_channels) if node_channels is not None else [{} for _ in node_names]
        if len(node_channels) != len(node_names):
            raise ValueError("node_channels needs one table per node")
        self.profile = profile
        self.nodes = list(node_names)
        self.screen_w, self.screen_h = screen_w, screen_h
        self.fps = fps
        self.seed = seed
        self.exact = profile == "exact"
        if self.exact:
            check_overrides(channel, "room.channel")  # (unknown keys name themselves first)
            for i, table in enumerate(node_channels):
                check_overrides({k: v for k, v in table.items() if k not in POSE_KEYS}, f"room.nodes[{i}].channel")
            problem = exact_room_problem(channel, node_channels)
            if problem is not None:
                text, keys = problem
                where = "".join(f"[{k}]" if isinstance(k, int) else ("." if j else "") + k for j, k in enumerate(keys))
                raise ValueError(f"room.{where}: {text}")
        black = blank(screen_w, screen_h)
        black.setflags(write=False)
        # Per node: times (ascending) and the images shown from those times on.
        self._times: dict[str, list[float]] = {n: [float("-inf")] for n in self.nodes}
        self._images: dict[str, list[np.ndarray]] = {n: [black] for n in self.nodes}
        self._serials: dict[str, list[int]] = {n: [0] for n in self.nodes}
        self._serial = 0
        self.captures = 0
        # A hand over a camera: (start, end) in room seconds after the first camera started; it sees black.
        self._covers: dict[str, list[tuple[float, float]]] = {n: [] for n in self.nodes}
        self._hidden: set[tuple[str, str]] = set()  # (camera, screen) pairs kept apart (the exact profile)
        self._t0: float | None = None  # when the first camera started (room time)
        if not self.exact:
            self._build(channel or {}, node_channels)

    # ---- construction --------------------------------------------------------------------------

    def _build(self, channel: dict, node_channels: list[dict]) -> None:
        self._seed_seq = [self.seed & 0xFFFFFFFF, (self.seed >> 32) & 0xFFFFFFFF, 0x3CC1]
        self._channel, self._node_channels = channel, node_channels
        self.params: dict[str, ChannelParams] = {}
        for i, (n, table) in enumerate(zip(self.nodes, node_channels)):
            self.params[n] = resolve(self.profile, channel, table, f"room.nodes[{i}].channel")
        self._place()
        plist = [self.params[n] for n in self.nodes]
        circle = len(self.nodes) >= 3 and all(p.position_m is None and p.aim is None for p in plist)
        for i, n in enumerate(self.nodes):
            p = self.params[n]
            if circle and "hfov_deg" not in channel and "hfov_deg" not in node_channels[i]:
                # On the default circle of 3+ nodes a laptop camera sees the screens beside it only if it is
                # wide enough: the default layout promises every camera every screen, so widen the lens.
                need = self._needed_hfov(n)
                if need > p.hfov_deg:
                    structlog.get_logger("wccl.room").info("room_camera_widened", node=n, hfov_deg=round(need, 1),
                                                           profile_hfov_deg=p.hfov_deg)
                    self.params[n] = dataclasses.replace(p, hfov_deg=need)
        self._base = dict(self.params)  # each node's parameters before any change (SimulatedRoom.change)
        self._changes: dict[str, list[tuple[float, float, dict]]] = {n: [] for n in self.nodes}
        self._begun: set[tuple[str, int]] = set()  # the changes logged as begun
        self._changed_to = -math.inf  # the latest room time (after the first camera started) the room was at
        self._due = math.inf  # the next room time (after the first camera started) a change begins or a ramp steps
        self.cams: dict[str, CameraModel] = {}
        self.exposures: dict[str, Exposure] = {}
        self.views: dict[tuple[str, str], geometry.ScreenView] = {}
        self._models(None)
        self._streams: dict[str, object] = {}

    def _place(self) -> None:
        """Where each laptop stands and where its screen is, from the nodes' parameters."""
        plist = [self.params[n] for n in self.nodes]
        bodies = geometry.layout(plist, self.screen_w, self.screen_h, self.nodes)
        planes = [geometry.screen_of(b, p, self.screen_w, self.screen_h) for b, p in zip(bodies, plist)]
        self.bodies = dict(zip(self.nodes, bodies))
        self.planes = dict(zip(self.nodes, planes))

    def _models(self, t: float | None) -> None:
        """The screens, lids, cameras and views from the nodes' parameters and places: at the start (`t`
        None), or again at true time `t` after a change (each camera's auto exposure goes on from where it
        was, towards what it now meters; a screen newly in or out of a camera's view is logged)."""
        log = structlog.get_logger("wccl.room")
        self.screens = {n: ScreenModel(n, i, self.params[n], self.planes[n], self._seed_seq)
                        for i, n in enumerate(self.nodes)}
        # Every laptop's lid is an opaque rectangle: it hides what lies behind it from the other cameras.
        self.lids = {n: geometry.lid_of(n, self.planes[n], self.params[n].bezel_m) for n in self.nodes}
        before = dict(self.views)
        # (after a change: what each screen's image gives now; its brightness may have changed)
        lum = {} if t is None else {m: self.screens[m].luminance(self._images[m][-1]) for m in self.nodes}
        for i, n in enumerate(self.nodes):
            p = self.params[n]
            cam = geometry.camera_of(self.bodies[n], p, self.planes[n])
            seen = []
            for m in self.nodes:
                if m == n:
                    continue
                v = geometry.view(cam, self.planes[m], self.params[m].bezel_m)
                if v.visible:
                    by = geometry.occluder(cam, self.planes[m].body.origin,
                                           [self.lids[k] for k in self.nodes if k not in (n, m)])
                    if by is not None:  # its centre is behind another laptop's lid: what is left is not read
                        v = dataclasses.replace(v, visible=False, reason=f"hidden by {by}")
                self.views[(n, m)] = v
                seen.append((self.screens[m], v))
            hidden = [(s.name, v.reason) for s, v in seen if not v.visible]
            # With many laptops a camera not seeing some screens is the arrangement (discovery finds what
            # it reads); a camera that sees no screen at all is a room that cannot work.
            lone = len(hidden) == len(seen) or len(self.nodes) == 2
            for m, why in hidden:
                if t is None or before[(n, m)].visible:
                    (log.warning if lone else log.info)("room_screen_not_visible", camera=n, screen=m, reason=why)
            if t is not None:
                for s, v in seen:
                    if v.visible and not before[(n, s.name)].visible:
                        log.info("room_screen_visible", camera=n, screen=s.name)
            old = self.cams.get(n)
            cm = CameraModel(n, i, p, cam, seen, self._seed_seq,
                             occluders=[self.lids[k] for k in self.nodes if k != n])
            if old is not None:
                cm.stats = old.stats
            self.cams[n] = cm
            if t is None:
                self.exposures[n] = Exposure(p, cm.ae_weights, cm.ae_room, self._seed_seq, i)
            else:
                self.exposures[n].relit(t, p, cm.ae_weights, cm.ae_room, lum)

    def _needed_hfov(self, node: str, margin_deg: float = 3.0) -> float:
        """The horizontal field of view `node`'s camera needs to see every other screen whole (degrees)."""
        p = self.params[node]
        cam = geometry.camera_of(self.bodies[node], p, self.planes[node])
        aspect = p.camera_width / p.camera_height
        need = 0.0
        for m in self.nodes:
            if m == node:
                continue
            pl = self.planes[m]
            corners = [pl.point(u, v) for u in (-0.5, pl.width_px - 0.5) for v in (-0.5, pl.height_px - 0.5)]
            xyz = np.array([cam.to_camera(c) for c in corners])
            if (xyz[:, 2] <= 0.05).any() or np.dot(pl.normal, cam.position - pl.body.origin) <= 0:
                continue  # behind the camera or facing away: no lens helps
            h = np.degrees(np.arctan(np.abs(xyz[:, 0] / xyz[:, 2]))).max()
            v = np.tan(np.radians(np.degrees(np.arctan(np.abs(xyz[:, 1] / xyz[:, 2]))).max()))
            need = max(need, 2 * (h + margin_deg), 2 * (np.degrees(np.arctan(v * aspect)) + margin_deg))
        return float(min(need, 150.0))

    @classmethod
    def from_config(cls, config) -> SimulatedRoom:
        """The room a `WcclConfig` describes; ValueError names a bad profile or override."""
        room = cls([n.name for n in config.room.nodes], config.screen.width, config.screen.height,
                   config.camera.fps, profile=config.room.profile, seed=config.room.seed,
                   channel=dict(config.room.channel), node_channels=[dict(n.channel) for n in config.room.nodes])
        room.set_clocks(config.room.clock_offset_max_s, config.room.clock_drift_max_ppm,
                        {n.name: (n.clock_offset_s, n.clock_drift_ppm) for n in config.room.nodes})
        for n in config.room.nodes:
            for start, end in n.covered_s:
                room.cover(n.name, start, end)
            for c in n.changes:
                room.change(n.name, c.at_s, dict(c.channel), c.ramp_s)
        return room

    # ---- changes while the run goes ------------------------------------------------------------

    def change(self, node: str, at_s: float, values: dict, ramp_s: float = 0.0) -> None:
        """Change channel parameters of `node` (wccl/room/params.py names) `at_s` room seconds after the first
        camera started: at once, or linearly over `ramp_s` (numbers and triples glide; other values switch
        at the start). A lamp switched on: `ambient`, `glare`; a lid nudged: `yaw_deg`, `pitch_deg`,
        `position_m`; a screen dimmed: `screen_brightness`; a busy laptop's camera: `fps`. Each change is
        logged as it begins (`room_changed`). ValueError names a bad key or value, or a parameter that cannot change while
        the run goes."""
        self._check(node)
        if self.exact:
            raise ValueError(f"room changes: the 'exact' profile has no channel to change {OTHER_PROFILES}")
        if not at_s >= 0 or not ramp_s >= 0:
            raise ValueError(f"a change of {node}'s channel needs at_s >= 0 and ramp_s >= 0, got {at_s}, {ramp_s}")
        where = f"room.nodes[{self.nodes.index(node)}].changes"
        fixed = sorted(set(values) & FIXED_KEYS)
        if fixed:
            raise ValueError(f"{where}: {', '.join(fixed)} cannot change while the run goes (they are the camera's "
                             f"and the stream's make-up); changeable: what a lamp, a nudge, a dimmed screen or "
                             f"another light does")
        table = {**self._node_channels[self.nodes.index(node)], **values}
        full = resolve(self.profile, self._channel, table, where + ".channel")
        target = {k: getattr(full, k) for k in values}
        self._changes[node].append((float(at_s), float(ramp_s), target))
        self._changes[node].sort(key=lambda c: c[0])
        self._due = min(self._due, float(at_s))

    def _params_at(self, node: str, rel: float) -> tuple[ChannelParams, float]:
        """`node`'s parameters `rel` room seconds after the first camera started (ramps in RAMP_STEP_S steps),
        and the next time after `rel` they can move (inf: never)."""
        p, due = self._base[node], math.inf
        for at, ramp, target in self._changes[node]:
            if rel < at:
                return p, min(due, at)
            steps = math.floor((rel - at) / RAMP_STEP_S)
            f = 1.0 if ramp <= 0 else min(1.0, steps * RAMP_STEP_S / ramp)
            if f < 1.0:
                due = min(due, at + (steps + 1) * RAMP_STEP_S)
            p = dataclasses.replace(p, **{k: _between(getattr(p, k), v, f) for k, v in target.items()})
        return p, due

    def follow_changes(self, t: float) -> None:
        """Bring the room up to the changes due by true time `t` (its cameras' captures call it: nothing to do
        until the next time a change begins or a ramp steps, then rebuilt only if a parameter moved)."""
        if self._t0 is None or t - self._t0 < self._due:
            return
        # (the room only moves forward: a capture rendered after another camera's later one sees the room as
        # that one did, so the room is not rebuilt back and forth around a change)
        rel = self._changed_to = max(t - self._t0, self._changed_to)
        for n in self.nodes:
            for i, (at, ramp, target) in enumerate(self._changes[n]):
                if at <= rel and (n, i) not in self._begun:
                    self._begun.add((n, i))
                    structlog.get_logger("wccl.room").info(
                        "room_changed", node=n, at_s=at, ramp_s=ramp,
                        channel={k: list(v) if isinstance(v, tuple) else v for k, v in target.items()})
        at = {n: self._params_at(n, rel) for n in self.nodes if self._changes[n]}
        self._due = min(due for _, due in at.values())
        now = {n: at[n][0] if n in at else self.params[n] for n in self.nodes}
        if now == self.params:
            return
        self.params = now
        self._place()
        self._models(t)

    def cover(self, node: str, start_s: float, end_s: float) -> None:
        """Put a hand over `node`'s camera from `start_s` to `end_s` room seconds after the first camera
        started: its captures are black then (someone reaching across, a lid knocked shut)."""
        self._check(node)
        if not 0 <= start_s < end_s:
            raise ValueError(f"cover of {node}'s camera: need 0 <= start < end, got {start_s}, {end_s}")
        self._covers[node].append((start_s, end_s))

    def hide(self, camera: str, screen: str) -> None:
        """Exact profile: `camera` never sees `screen` (something stands between them), as a camera of a
        rendered room does not see a screen out of its view; the other screens stay side by side."""
        self._check(camera)
        self._check(screen)
        if not self.exact:
            raise ValueError("hide: the rendered profiles hide screens by where the laptops stand (poses)")
        self._hidden.add((camera, screen))

    def covered(self, node: str, t: float) -> bool:
        """Is `node`'s camera covered at true time `t`?"""
        if not self._covers[node] or self._t0 is None:
            return False
        rel = t - self._t0
        return any(a <= rel < b for a, b in self._covers[node])

    # ---- the laptops' clocks -------------------------------------------------------------------

    def set_clocks(self, offset_max_s: float, drift_max_ppm: float,
                   given: dict[str, tuple[float | None, float | None]] | None = None) -> None:
        """Give each laptop its own clock: an offset within +-offset_max_s and a drift within
        +-drift_max_ppm against the room's true time, drawn from the room's seed (or as given)."""
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 0xC10C])
        given = given or {}
        self.clocks = {}
        for n in self.nodes:
            off, ppm = rng.uniform(-1, 1) * offset_max_s, rng.uniform(-1, 1) * drift_max_ppm
            g_off, g_ppm = given.get(n, (None, None))
            self.clocks[n] = (off if g_off is None else g_off, ppm if g_ppm is None else g_ppm)

    def clock_for(self, node: str, origin: float) -> NodeClock:
        """`node`'s own clock (the room's true time is `loop.time() - origin`)."""
        self._check(node)
        off, ppm = getattr(self, "clocks", {}).get(node, (0.0, 0.0))
        return NodeClock(offset=off, drift_ppm=ppm, origin=origin)

    def true_reading(self, node: str, origin: float):
        """A function: `node`'s clock reading at a given true loop time (the room's truth, for logs)."""
        off, ppm = getattr(self, "clocks", {}).get(node, (0.0, 0.0))
        return lambda loop_t: (loop_t - origin) * (1 + ppm * 1e-6) + off

    # ---- the public surface --------------------------------------------------------------------

    @staticmethod
    def now() -> float:
        """The room's true time."""
        return asyncio.get_running_loop().time()

    def screen(self, node: str) -> RoomScreen:
        self._check(node)
        return RoomScreen(self, node)

    def camera(self, node: str, clock: NodeClock) -> RoomCamera:
        self._check(node)
        self.camera_started(self.now())
        return RoomCamera(self, node, clock)

    @property
    def cameras_started_at(self) -> float | None:
        """The true time the first camera started (covers count from it), or None before."""
        return self._t0

    def camera_started(self, t: float) -> None:
        """A camera started at true time `t`: the first one sets the time covers count from."""
        if self._t0 is None:
            self._t0 = t

    def camera_fps(self, node: str) -> float:
        """Captures per second of `node`'s camera (a profile may override config.camera.fps)."""
        if self.exact:
            return self.fps
        return self.params[node].fps or self.fps

    def _check(self, node: str) -> None:
        if node not in self.nodes:
            raise KeyError(f"node {node!r} is not in the room ({', '.join(self.nodes)})")

    def _show(self, node: str, image: np.ndarray) -> None:
        self.show_at(node, image, self.now())

    def show_at(self, node: str, image: np.ndarray, t: float) -> None:
        """Put `image` on `node`'s screen at true time `t` (times must not go backwards)."""
        self._check(node)
        if image.shape != (self.screen_h, self.screen_w, 3) or image.dtype != np.uint8:
            raise ValueError(
                f"screen of {node} is {self.screen_w}x{self.screen_h} BGR uint8, got {image.shape} {image.dtype}"
            )
        times, images, serials = self._times[node], self._images[node], self._serials[node]
        if not self.exact:
            if np.array_equal(images[-1], image):
                return  # the same picture again: nothing changes on the panel
            t_up = self.screens[node].display_time(t)
        else:
            t_up = t
        frozen = image.copy()  # the room owns its copy: the sender may reuse its array
        frozen.setflags(write=False)
        self._serial += 1
        if times[-1] == t_up:
            images[-1] = frozen
            serials[-1] = self._serial
        else:
            times.append(t_up)
            images.append(frozen)
            serials.append(self._serial)
        if len(times) > self.HISTORY:
            del times[0], images[0], serials[0]
        if not self.exact:
            lum = self.screens[node].luminance(frozen)
            for n, ex in self.exposures.items():
                if n != node:
                    ex.screen_changed(node, t, lum)

    def screen_at(self, node: str, t: float) -> np.ndarray:
        """What `node`'s screen showed at true time `t` (its top row; read-only)."""
        times = self._times[node]
        i = bisect.bisect_right(times, t) - 1
        return self._images[node][max(i, 0)]

    def visible_from(self, node: str) -> list[str]:
        """The other nodes whose screens `node`'s camera sees (in the exact profile all but those hidden)."""
        if self.exact:
            return [n for n in self.nodes if n != node and (node, n) not in self._hidden]
        return [n for n in self.nodes if n != node and self.views[(node, n)].visible]

    def hidden_from(self, node: str) -> dict[str, str]:
        """The other nodes whose screens `node`'s camera cannot see, with the reason."""
        if self.exact:
            return {n: "kept apart (SimulatedRoom.hide)" for n in self.nodes if (node, n) in self._hidden}
        return {n: self.views[(node, n)].reason for n in self.nodes if n != node and not self.views[(node, n)].visible}

    def project(self, viewer: str, shown: str, pts: np.ndarray) -> np.ndarray:
        """Camera pixel coordinates (N x 2) where `viewer`'s camera sees screen pixels `pts` of `shown`.

        NaN rows for a screen out of view. Exact profile: screens side by side, unscaled.
        """
        pts = np.asarray(pts, dtype=np.float64).reshape(-1, 2)
        if self.exact:
            order = self.visible_from(viewer)
            return pts + np.array([order.index(shown) * self.screen_w, 0.0])
        v = self.views[(viewer, shown)]
        if not v.visible:
            return np.full_like(pts, np.nan)
        xyz = np.c_[pts, np.ones(len(pts))] @ v.H.T
        px, py = self.cams[viewer].camera.distort(xyz[:, 0] / xyz[:, 2], xyz[:, 1] / xyz[:, 2])
        return np.stack([px, py], axis=1)

    def capture_at(self, node: str, t: float, k: int = 0, stream: bool = False) -> np.ndarray:
        """The image `node`'s camera takes with row 0 starting at true time `t`, as capture number `k`.

        No asyncio needed; `k` seeds the capture's noise. Same room, seed, shows,
        t and k: the same bytes. With H.264, each call encodes a one-frame stream
        unless `stream` (then it continues the camera's stream, as RoomCamera does).
        """
        self._check(node)
        if self.exact:
            return self._view(node, t)
        rng = capture_rng(self._seed_seq, self.nodes.index(node), k)
        rng.standard_normal(), rng.random()  # the timing draws of CaptureSchedule.draw
        return self._render(node, t, rng, stream=stream)

    # ---- rendering -----------------------------------------------------------------------------

    def _history(self, node: str) -> list[tuple[float, int, np.ndarray]]:
        return list(zip(self._times[node], self._serials[node], self._images[node]))

    def _view(self, node: str, t: float) -> np.ndarray:
        if not self.exact:
            return self.capture_at(node, t)
        shown = [self.screen_at(n, t) for n in self.visible_from(node)]
        self.captures += 1
        if self.covered(node, t):
            return np.zeros((self.screen_h, self.screen_w * len(shown), 3), np.uint8)
        if len(shown) == 1:
            return shown[0].copy()
        return np.concatenate(shown, axis=1)

    def _render(self, node: str, t: float, rng: np.random.Generator, stream: bool) -> np.ndarray:
        self.follow_changes(t)
        cm = self.cams[node]
        if self.covered(node, t):
            self.captures += 1
            return np.zeros((cm.params.camera_height, cm.params.camera_width, 3), np.uint8)
        frames = {s.name: self._history(s.name) for s, _ in cm.candidates}
        ex = self.exposures[node]
        img = cm.render(t, frames, ex.gain(t), ex.white_balance_bgr(t), rng)
        if cm.params.codec == "h264":
            if stream:
                enc = self._streams.get(node)
                if enc is None:
                    enc = self._streams[node] = H264Stream(cm.params, self.camera_fps(node))
                img = enc.process(img)
            else:
                img = H264Stream(cm.params, self.camera_fps(node)).process(img)
        self.captures += 1
        return img


class H264Stream:
    """A camera's H.264 stream: each capture is encoded (libx264, zero latency) and decoded back at once."""

    def __init__(self, params: ChannelParams, fps: float) -> None:
        import av

        self.enc = av.CodecContext.create("libx264", "w")
        self.enc.width, self.enc.height = params.camera_width, params.camera_height
        self.enc.pix_fmt = "yuv420p"
        rate = Fraction(fps).limit_denominator(1000)
        self.enc.time_base = 1 / rate
        self.enc.framerate = rate
        self.enc.thread_count = 1  # deterministic output
        self.enc.options = {"crf": str(params.h264_crf), "preset": params.h264_preset, "tune": "zerolatency"}
        self.dec = av.CodecContext.create("h264", "r")
        self.dec.thread_count = 1
        self.pts = 0

    def process(self, image: np.ndarray) -> np.ndarray:
        import av

        frame = av.VideoFrame.from_ndarray(image, format="bgr24")
        frame.pts = self.pts
        self.pts += 1
        out = None
        for packet in self.enc.encode(frame):
            for decoded in self.dec.decode(packet):
                out = decoded.to_ndarray(format="bgr24")
        if out is None:
            raise RuntimeError("H.264 encoder held a frame back (expected zero latency)")
        return out


class RoomScreen:
    """A node's screen in the room."""

    def __init__(self, room: SimulatedRoom, node: str) -> None:
        self._room, self._node = room, node

    def show(self, image: np.ndarray) -> None:
        self._room._show(self._node, image)


class RoomCamera:
    """A node's camera in the room: captures at its fps, timestamped on the node's clock.

    Exact profile: capture k is taken at start + k / fps and returned then.
    Other profiles: capture k starts at start + k / fps + jitter, is delivered
    after exposure + readout + latency, and carries the node-clock time of its
    delivery (what an application reading a real webcam sees); dropped
    captures and stalls are skipped (counted in `dropped`).
    """

    def __init__(self, room: SimulatedRoom, node: str, clock: NodeClock) -> None:
        self._room, self._node, self._clock = room, node, clock
        fps = room.camera_fps(node)
        self._period = 1.0 / fps
        # Cameras start at different phases: their captures do not line up with screen changes.
        phase = (room.nodes.index(node) * 0.37 + room.seed * 0.11) % 1.0
        self._start = room.now() + phase * self._period
        self._k = 0
        self.missed = 0   # capture slots skipped because nobody asked in time
        self.dropped = 0  # captures the camera lost (drops, stalls)
        self.closed = False
        self._schedule = None
        if not room.exact:
            self._schedule = CaptureSchedule(room.params[node], fps, self._start, room._seed_seq,
                                             room.nodes.index(node))

    async def recv(self) -> tuple[np.ndarray, float]:
        if self.closed:
            raise RuntimeError("camera is closed")
        if self._schedule is None:
            now = self._room.now()
            late = int((now - self._start) / self._period) - self._k
            if late > 0:  # a real camera keeps running while nobody reads it
                self.missed += late
                self._k += late
            t = self._start + self._k * self._period
            self._k += 1
            delay = t - now
            if delay > 0:
                await asyncio.sleep(delay)
            image = self._room._view(self._node, t)
            return image, self._clock.now()
        sched = self._schedule
        wait = sched.deliver_delay()
        while True:
            now = self._room.now()
            self._k, late = sched.slot(self._k, now, self._room)
            self.missed += late
            k = self._k
            self._k += 1
            t, delivered, rng = sched.draw(k)
            if not delivered:
                self.dropped += 1
                continue
            delay = t + wait - now
            if delay > 0:
                await asyncio.sleep(delay)
            image = self._room._render(self._node, t, rng, stream=True)
            return image, self._clock.now()

    def close(self) -> None:
        self.closed = True
