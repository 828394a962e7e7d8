"""omni-autoconf: proven-optimal GPU memory plans for vLLM-Omni multi-stage pipelines.

The Python API (api.py): `Request`, `plan`, `check`. The code follows the data flow, one
layer per folder, lowest first: vllm/ (facts) -> inputs/ -> memory/ -> startup/ -> opt/
(CP-SAT) -> planning/ -> emit/ -> cli/ (tests/test_layout.py keeps it so).
"""

__version__ = "0.1.0"
__all__ = ["Request", "PlanResult", "plan", "check", "__version__"]


def __getattr__(name: str):
    # Imported on first use, so that `import omni_autoconf.<module>` (and the command
    # line's --help and refusals) do not pay for pydantic models and CP-SAT up front.
    if name in ("Request", "PlanResult", "plan", "check"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'omni_autoconf' has no attribute {name!r}")
