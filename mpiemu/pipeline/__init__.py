"""Pipeline parallelism: the per-stage orders of forward and backward passes (GPipe, 1F1B,
interleaved 1F1B) and the stage-to-stage messages that carry activations and gradients."""
