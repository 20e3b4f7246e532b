"""WCCL runtime and engines.

Runtime: `node` (CLI and composition root), `config`, `supervisor`, `actor`
(actor base and mailboxes), `registry`, `timebase` (virtual and real time,
node clocks), `schedule`, `logs`.
Engines the actors drive: `room` (the simulated room medium), `media`
(the screen/camera interface and its implementations), `imaging` (finding
and reading codes in camera images), `training` (model, data, replicas).
Tools: `lab` (link measurements).
"""
