"""`python -m wccl.lab sync`: how well the nodes keep time and lockstep over a long run.

Runs the config's room as it is (every node, observers included: they are
part of the room's geometry; dashboard off; `--steps` steps) and reports, from the nodes' own results: the residual clock error of
every node against the server's true clock at each step (the simulated room
knows the truth; the nodes never see it), the auto schedule's step period,
and lockstep figures: updates each replica applied, averages and gradients
that went missing, snapshots adopted, and whether the replicas ended
identical.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from wccl.config import WcclConfig, with_values
from wccl.runtime.timebase import new_loop


def run_sync_bench(cfg: WcclConfig, steps: int) -> dict[str, Any]:
    from wccl.node import RoomRun

    cfg = with_values(cfg, training={"steps": steps}, dashboard={"enabled": False})
    wall = time.perf_counter()

    async def go():
        return await RoomRun(cfg).run()

    with asyncio.Runner(loop_factory=lambda: new_loop(cfg.room.clock)) as runner:
        result = runner.run(go())
    nodes = result["nodes"]
    residuals = np.array([abs(r) for n in nodes.values() for r in n.get("clock", {}).get("residuals_ms", [])])
    clocks = {n: {"offset_s": round(v["clock"].get("offset_s", 0.0), 4), "drift_ppm": round(v["clock"].get("drift_ppm", 0.0), 1)}
              for n, v in nodes.items() if "offset_s" in v.get("clock", {})}
    announce = next((v["clock"]["announce"] for v in nodes.values() if "announce" in v.get("clock", {})), None)
    return dict(
        profile=cfg.room.profile,
        steps=steps,
        step_period_s=round(sum(s for _, s in announce.phases), 4) if announce else None,
        residual_samples=int(residuals.size),
        residual_p50_ms=round(float(np.percentile(residuals, 50)), 3) if residuals.size else None,
        residual_p95_ms=round(float(np.percentile(residuals, 95)), 3) if residuals.size else None,
        residual_max_ms=round(float(residuals.max()), 3) if residuals.size else None,
        estimated_clocks=clocks,
        applied={n: v["worker"]["applied"] for n, v in nodes.items() if "worker" in v},
        average_missing={n: v["worker"]["average_missing"] for n, v in nodes.items() if "worker" in v},
        snapshots_adopted={n: v["worker"]["snapshots_adopted"] for n, v in nodes.items() if "worker" in v},
        gradient_missing=sum(v.get("server", {}).get("gradient_missing", 0) for v in nodes.values()),
        steps_skipped=sum(v.get("server", {}).get("skipped", 0) for v in nodes.values()),
        replicas_identical=result["replicas_identical"],
        test_accuracy=result["test_accuracy"],
        sim_seconds=result["sim_seconds"],
        wall_seconds=round(time.perf_counter() - wall, 1),
    )
