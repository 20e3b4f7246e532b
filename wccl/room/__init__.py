"""The simulated room: the default medium, where nodes' screens and cameras meet.

The room is the only thing nodes share, as the air between real laptops is:
screens put light into it, cameras take images out of it. It keeps the true
time (the event loop's) and each screen's history.

Modules: room (the room, its screens and cameras), params (profiles and
channel parameters), geometry (poses, planes, pinholes), channel (the
rendering of one camera's captures), timing (capture times, drops, stalls,
auto exposure), record (record a camera's stream, replay it as a camera),
realcaps + fit (the fit to real photos), bench, snapshot. See NOTES.md.
"""

from wccl.room.room import RoomCamera, RoomScreen, SimulatedRoom

__all__ = ["RoomCamera", "RoomScreen", "SimulatedRoom"]
