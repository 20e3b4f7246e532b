"""The simulated room: the default medium, where nodes' screens and cameras meet.

The room is the only thing nodes share, as the air between real laptops is:
screens put light into it, cameras take images out of it. It keeps the true
time (the event loop's) and each screen's history.
"""

from wccl.room.room import RoomCamera, RoomScreen, SimulatedRoom

__all__ = ["RoomCamera", "RoomScreen", "SimulatedRoom"]
