"""The link lab: measure the optical link in the simulated room (`python -m wccl.lab`)."""
