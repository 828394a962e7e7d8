"""The output targets of a plan (`--format`), one registry: each target turns a Plan into
named files. A new target is one module with a render function and one entry here.

A target that writes one file on one host writes a folder of files when the plan spans
several hosts (`folder`); the command line then needs a directory for `-o`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..inputs.gpus import node_names

if TYPE_CHECKING:  # the renderers load on use: the command line reads the names at start-up
    from ..planning.planner import Plan
    from ..planning.request import Request

# The file name each schema's single-host file takes in the Python API's `files`.
SCHEMA_FILE_NAMES = {"deploy": "deploy.yaml", "stage-args": "stage_args.yaml"}


@dataclass(frozen=True)
class Target:
    name: str
    help: str
    render: Callable[[Plan], dict[str, str]]  # file name -> text
    folder: Callable[[Request], bool] = lambda request: False  # a folder of files for this request


def _several_hosts(request: Request) -> bool:
    return len(node_names(request.gpus)) > 1


def _yaml_files(plan: Plan) -> dict[str, str]:
    """The stage config vLLM-Omni reads: one file, or one per host and launch.sh."""
    from . import multihost
    from .render import RENDERERS, header, render_deploy

    if _several_hosts(plan.request):
        layouts = multihost.layouts(plan)
        files = {multihost.file_name(layout): render_deploy(plan, layout) for layout in layouts}
        files["launch.sh"] = multihost.launch_script(plan, header(plan), layouts)
        return files
    return {SCHEMA_FILE_NAMES[plan.request.schema]: RENDERERS[plan.request.schema](plan)}


def _json(plan: Plan) -> str:
    from .summary import render_json

    return render_json(plan)


TARGETS: dict[str, Target] = {
    "yaml": Target("yaml", "the stage config (deploy or stage_args YAML; a folder of host files for several hosts)",
                   _yaml_files, _several_hosts),
    "json": Target("json", "the plan as data", lambda plan: {"plan.json": _json(plan)}),
}


def render_files(plan: Plan, fmt: str) -> dict[str, str]:
    """The files of `plan` in format `fmt` (a TARGETS key), by name."""
    return TARGETS[fmt].render(plan)
