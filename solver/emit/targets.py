"""The output targets of a plan (`--format`), one registry: each target turns a Plan into
named files. A new target is one module with a render function and one entry here.

A target that writes one file on one host writes a folder of files when the plan spans
several hosts (`folder`); the command line then needs a directory for `-o`. A target may take
render options (`options`: their names; the command line's --image, --namespace, ...), which
its render function gets as a dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..inputs.gpus import node_names

if TYPE_CHECKING:  # the renderers load on use: the command line reads the names at start-up
    from ..planning.planner import Plan
    from ..planning.request import Request

@dataclass(frozen=True)
class Target:
    name: str
    help: str
    render: Callable[..., dict[str, str]]  # (plan, options dict) -> {file name: text}
    folder: Callable[[Request], bool] = lambda request: False  # a folder of files for this request
    options: tuple[str, ...] = ()  # the render options it takes
    check: Callable[[Request, dict], None] = lambda request, options: None  # refuses bad options before planning


def _several_hosts(request: Request) -> bool:
    return len(node_names(request.gpus)) > 1


def _yaml_files(plan: Plan, options: dict | None = None) -> dict[str, str]:
    """The stage config vLLM-Omni reads: one file, or one per host and launch.sh."""
    from . import multihost
    from .render import header

    files = multihost.deploy_files(plan)
    if _several_hosts(plan.request):
        files["launch.sh"] = multihost.launch_script(plan, header(plan), multihost.layouts(plan))
    return files


def _json(plan: Plan) -> str:
    from .summary import render_json

    return render_json(plan)


K8S_OPTIONS = ("image", "namespace", "name", "model_pvc", "hf_token_secret")


def _k8s(plan: Plan, options: dict | None = None) -> dict[str, str]:
    from .k8s import render

    return {"k8s.yaml": render(plan, options)}


def _k8s_check(request: Request, options: dict) -> None:
    from .k8s import resolve

    resolve(request, options)


def _helm(plan: Plan, options: dict | None = None) -> dict[str, str]:
    from .helm_values import render

    return {"values.yaml": render(plan, options)}


def _helm_check(request: Request, options: dict) -> None:
    from .helm_values import check

    check(request, options)


def _svg(plan: Plan, options: dict | None = None) -> dict[str, str]:
    from .svg import render_plan_svg

    return {"plan.svg": render_plan_svg(plan)}


TARGETS: dict[str, Target] = {
    "yaml": Target("yaml", "the stage config (deploy or stage_args YAML; a folder of host files for several hosts)",
                   _yaml_files, _several_hosts),
    "json": Target("json", "the plan as data", lambda plan, options=None: {"plan.json": _json(plan)}),
    "k8s": Target("k8s", "Kubernetes objects, one multi-document YAML for kubectl apply (several hosts: a "
                  "LeaderWorkerSet)", _k8s, options=K8S_OPTIONS, check=_k8s_check),
    "helm-values": Target("helm-values", "values.yaml for vLLM-Omni's Helm chart (examples/online_serving/chart-helm; "
                          "one host)", _helm, options=("image", "hf_token_secret"), check=_helm_check),
    "svg": Target("svg", "the per-GPU memory map as a picture (SVG)", _svg),
}


def check_options(fmt: str, request: Request, options: dict | None) -> dict:
    """The render options that are set, refused where `fmt` takes none of them (InputError)."""
    from ..errors import InputError

    if fmt not in TARGETS:
        raise InputError(f"format {fmt!r} is not one of {', '.join(TARGETS)}")
    given = {k: v for k, v in (options or {}).items() if v is not None}
    target = TARGETS[fmt]
    extra = sorted(set(given) - set(target.options))
    if extra:
        flags = ", ".join("--" + name.replace("_", "-") for name in extra)
        raise InputError(f"{flags}: not an option of --format {fmt}"
                         + (f" (it takes {', '.join('--' + n.replace('_', '-') for n in target.options)})"
                            if target.options else ""))
    target.check(request, given)
    return given


def render_files(plan: Plan, fmt: str, options: dict | None = None) -> dict[str, str]:
    """The files of `plan` in format `fmt` (a TARGETS key), by name; `options`: its render
    options (Target.options), checked."""
    return TARGETS[fmt].render(plan, check_options(fmt, plan.request, options))
