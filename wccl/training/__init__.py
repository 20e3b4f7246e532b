"""Model, data and replica code for WCCL's distributed training."""
