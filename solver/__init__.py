"""omni-autoconf: proven-optimal GPU memory plans for vLLM-Omni multi-stage pipelines.

The pure core: specs (`gpus`, `catalog`) -> memory model (`memory`) -> CP-SAT model
(`cpsat`) -> plan (`planner.plan`). Input and output live at the edges (`cli`,
`render`, `nvml`).
"""

__version__ = "0.1.0"
