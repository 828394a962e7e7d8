"""The memory model: what one stage needs per GPU (weights, the profile-run peak, KV pool
layouts, per-process overheads), calibration from real logs, and the accuracy benchmark that
holds the model against observed start-ups. Pure functions of specs and knobs."""
