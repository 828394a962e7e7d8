"""`omni-autoconf check CONFIG`: predict whether an existing stage config starts.

Parse, read the file, simulate (`startup.simulate`), render; with --fix, plan the best
config that keeps what the file pins. Exit 0: no predicted problem; 1: a problem; 2:
invalid input.
"""

from __future__ import annotations

import json

import click

from .cli import _attach_fixes, _gpus, _run, main, no_plan_dict, write_atomically
from .errors import InputError, NoPlanError
from .vllm_facts import NEWEST_OMNI_VERSION


@main.command("check")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--gpus", "gpus_text", required=True, metavar="NxNAME[,...]", help="GPUs in CUDA order, or `local`.")
@click.option("--model", "model_name", required=True, metavar="NAME", help="Pipeline from the catalog.")
@click.option("--omni-version", default=NEWEST_OMNI_VERSION, show_default=True, metavar="X.Y")
@click.option("--platform", default="cuda", show_default=True, help="Which `platforms:` overrides of a deploy file apply.")
@click.option("--upstream", is_flag=True, help="Upstream vLLM start-up: refuse when free < requested (default: vLLM-Omni caps).")
@click.option("--parallel-init", is_flag=True, help="Check vLLM-Omni's parallel_stage_init admission rule too.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--fix", is_flag=True, help="Write the optimal plan that keeps what the file pins (see --keep).")
@click.option("--keep", default="devices,tp", show_default=True, metavar="devices,tp|none",
              help="With --fix: what of the file stays pinned.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="With --fix: write here.")
@click.option("-q", "--quiet", is_flag=True)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def check_command(**o) -> None:
    """Predict whether CONFIG (deploy or stage_args YAML) starts, and each stage's KV.

    Exit 0: starts with no predicted problem; 1: a problem is predicted (each with a
    stable code); 2: invalid input.
    """
    _run(o["debug"], lambda: _check(**o))


def _check(**o) -> int:
    from .catalog import lookup_model
    from .configfile import read_config
    from .render import check_dict, render_check_table
    from .startup import simulate
    from .vllm_facts import omni_version

    gpus = _gpus(o["gpus_text"])
    pipeline = lookup_model(o["model_name"])
    version = omni_version(o["omni_version"])
    config = read_config(o["config"], o["platform"])
    report = simulate(pipeline, list(gpus), version, config, upstream=True if o["upstream"] else None,
                      parallel_init=o["parallel_init"])
    if o["fix"]:
        return _fix(report, pipeline, gpus, version, config, o)
    if o["fmt"] == "json":
        click.echo(json.dumps(check_dict(report), indent=2))
    else:
        click.echo(render_check_table(report), nl=False)
    return 0 if report.ok else 1


def _fix(report, pipeline, gpus, version, config, o: dict) -> int:
    from .planner import Request, plan
    from .render import RENDERERS, render_gain_table
    from .startup import resolve_settings

    keep = {k.strip() for k in o["keep"].split(",") if k.strip()} - {"none"}
    if keep - {"devices", "tp"}:
        raise InputError(f"--keep {o['keep']!r}: name devices, tp, both, or none")
    settings = resolve_settings(pipeline, config, version)
    layout_ok = {o_.spec.name for o_ in report.stages if o_.memory is not None} - {
        p.stage for p in report.problems if p.code in ("unknown-device", "tp-mismatch", "tp-not-divisible")
    }
    request = Request(
        pipeline=pipeline,
        gpus=gpus,
        version=version,
        schema=config.schema,
        tp={rs.spec.name: rs.tensor_parallel_size for rs in settings
            if "tp" in keep and rs.explicit_tp and rs.spec.name in layout_ok},
        devices={rs.spec.name: rs.devices for rs in settings
                 if "devices" in keep and rs.explicit_devices and rs.spec.name in layout_ok},
        max_model_len={rs.spec.name: rs.knobs.max_model_len for rs in settings if rs.spec.has_kv_cache},
        max_num_seqs={rs.spec.name: rs.knobs.max_num_seqs for rs in settings},
        max_num_batched_tokens={rs.spec.name: rs.knobs.max_num_batched_tokens for rs in settings},
        enforce_eager={rs.spec.name: rs.knobs.enforce_eager for rs in settings},
        kv_cache_dtype="fp8" if any(rs.knobs.kv_cache_dtype == "fp8" for rs in settings) else "auto",
    )
    try:
        result = plan(request)
    except NoPlanError as exc:
        _attach_fixes(exc, request, o["quiet"])
        if o["fmt"] == "json":
            click.echo(json.dumps(no_plan_dict(exc), indent=2))
        raise
    text = RENDERERS[request.schema](result)
    if o["output"]:
        write_atomically(o["output"], text)
    else:
        click.echo(text, nl=False)
    if not o["quiet"]:
        click.echo(render_gain_table(report, result), err=True, nl=False)
        if o["output"]:
            click.echo(f"omni-autoconf: wrote {o['output']}", err=True)
    return 0
