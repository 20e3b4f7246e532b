"""The live dashboard: a web page that watches a run (wccl/dashboard/static), served in the run's event loop.

`Hub` gathers what the page shows from the run's log events and the nodes'
messages; `DashboardServer` serves the page and streams the hub to it.
RoomRun (wccl.node) creates both when `[dashboard] enabled = true`.
"""

from wccl.dashboard.hub import Hub
from wccl.dashboard.server import DashboardServer

__all__ = ["DashboardServer", "Hub"]
