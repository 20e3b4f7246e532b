"""The actor runtime every node runs on, whatever it carries: the actor base and its mailboxes (`actor`),
the supervisor that wires and restarts a node's actors (`supervisor`), time (`timebase`: the virtual-time
loop and clocks; `clocksync`: clocks synced over the light; `schedule`: a step's deadlines), structured
logs (`logs`), checkpoints (`recovery`), the platform glue (`hostos`) and a harness that drives one actor
alone (`harness`)."""
