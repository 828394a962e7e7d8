"""`omni-autoconf check CONFIG`: predict whether an existing stage config starts.

Parse, read the file, check (`configcheck.check_config`, on the start-up model the
planner uses), render; with --fix, plan the best config that keeps what the file pins.
Exit 0: no predicted problem (warnings may be listed); 1: a problem; 2: invalid input or
an internal error; 130: interrupted.
"""

from __future__ import annotations

import click

from .. import defaults as D
from ..errors import InputError, NoPlanError
from ..vllm.facts import NEWEST_OMNI_VERSION, GiB
from .common import attach_fixes, once, report_no_plan, run_command
from .output_files import check_output_path, write_output


@click.command("check")
@click.argument("config")
@click.option("--gpus", multiple=True, metavar="NxNAME[,...]", help="GPUs in CUDA order, or `local`.  [required]")
@click.option("--model", multiple=True, metavar="NAME|DIR|ORG/NAME", help="Pipeline: catalog name, model directory or Hub id.  [required]")
@click.option("--omni-version", multiple=True, metavar="X.Y", help=f"Default: {NEWEST_OMNI_VERSION}.")
@click.option("--platform", multiple=True, help="Which `platforms:` overrides of a deploy file apply. Default: cuda.")
@click.option("--upstream", is_flag=True, help="Upstream vLLM start-up: refuse when free < requested (default: vLLM-Omni caps).")
@click.option("--parallel-init", is_flag=True, help="Check vLLM-Omni's parallel_stage_init admission rule too.")
@click.option("--exclusive", multiple=True, metavar="A,B", help="Stages never resident at the same time (as for planning).")
@click.option("--buffer", multiple=True, metavar="GIB",
              help=f"GiB each GPU should keep free beyond vLLM-Omni's 2 GiB reserve (a warning below it). Default: {D.DEFAULT_BUFFER_GIB}.")
@click.option("--calibration", multiple=True, metavar="FILE", help="Apply the corrections `omni-autoconf calibrate` measured.")
@click.option("--format", "fmt", multiple=True, type=click.Choice(["table", "json"]), help="Default: table.")
@click.option("--fix", is_flag=True, help="Write the optimal plan that keeps what the file pins (see --keep).")
@click.option("--keep", multiple=True, metavar="devices,tp|none", help="With --fix: what of the file stays pinned. Default: devices,tp.")
@click.option("--time-limit", multiple=True, metavar="SECONDS", help=f"With --fix: solver time limit. Default: {D.DEFAULT_TIME_LIMIT_S:g}.")
@click.option("-o", "--output", multiple=True, metavar="FILE", help="With --fix: write here (`-` is stdout).")
@click.option("-q", "--quiet", is_flag=True)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def check_command(**o) -> None:
    """Predict whether CONFIG (deploy or stage_args YAML) starts, and each stage's KV.

    Exit 0: starts with no predicted problem; 1: a problem is predicted (each with a
    stable code); 2: invalid input.
    """
    fmt = o["fmt"][0] if len(o["fmt"]) == 1 else "table"
    run_command(o["debug"], lambda: _check(**o), on_no_plan=lambda exc: report_no_plan(exc, "json" if fmt == "json" else "yaml"))


def _check(**o) -> int:
    from ..emit.check_report import render_check_json, render_check_table
    from ..planning.check import check_config
    from ..planning.options import resolve_check

    fmt = once(o["fmt"], "--format", "table")
    output = once(o["output"], "-o/--output")

    def before_reading() -> None:
        if output is not None and not o["fix"]:
            raise InputError("check -o writes the file that --fix produces: add --fix, or drop -o (the report goes to "
                             "stdout)")
        check_output_path(output)

    values = {"gpus": once(o["gpus"], "--gpus"), "model": once(o["model"], "--model"), "config": o["config"],
              "omni_version": once(o["omni_version"], "--omni-version"), "buffer": once(o["buffer"], "--buffer"),
              "platform": once(o["platform"], "--platform"), "exclusive": o["exclusive"],
              "calibration": once(o["calibration"], "--calibration")}
    inputs = resolve_check(values, before_reading)
    report = check_config(inputs.pipeline, list(inputs.gpus), inputs.version, inputs.config,
                          upstream=True if o["upstream"] else None, parallel_init=o["parallel_init"],
                          buffer_bytes=int(inputs.buffer_gib * GiB), exclusive=inputs.exclusive,
                          calibration=inputs.calibration)
    if o["fix"]:
        return _fix(report, inputs, o)
    write_output(None, render_check_json(report) if fmt == "json" else render_check_table(report))
    return 0 if report.ok else 1


def _fix(report, inputs, o: dict) -> int:
    from ..emit.check_report import render_gain_table
    from ..emit.render import RENDERERS
    from ..planning.request import ensure_renderable
    from ..planning.options import time_limit_option
    from ..planning.planner import plan
    from ..planning.request import Request

    pipeline, gpus, version, config = inputs.pipeline, inputs.gpus, inputs.version, inputs.config
    time_limit = time_limit_option(once(o["time_limit"], "--time-limit"))
    keep_text = once(o["keep"], "--keep", "devices,tp")
    keep = {k.strip() for k in keep_text.split(",") if k.strip()} - {"none"}
    if keep - {"devices", "tp"}:
        raise InputError(f"--keep {keep_text!r}: name devices, tp, both, or none")
    settings = report.settings
    bad_layout = {p.stage for p in report.problems if p.code in ("unknown-device", "tp-mismatch", "tp-not-divisible")}
    kept = [rs for rs in settings if rs.spec.name not in bad_layout and rs.replicas == 1]
    request = Request(
        pipeline=pipeline,
        model_ref=o["model"][0],
        gpus=gpus,
        version=version,
        schema=config.schema,
        buffer_gib=inputs.buffer_gib,
        tp={rs.spec.name: rs.tensor_parallel_size for rs in kept if "tp" in keep and rs.explicit_tp},
        devices={rs.spec.name: rs.devices for rs in kept if "devices" in keep and rs.explicit_devices},
        max_model_len={rs.spec.name: rs.knobs.max_model_len for rs in settings if rs.spec.has_kv_cache},
        max_num_seqs={rs.spec.name: rs.knobs.max_num_seqs for rs in settings},
        max_num_batched_tokens={rs.spec.name: rs.knobs.max_num_batched_tokens for rs in settings
                                if rs.spec.batch_rule_error(rs.knobs.max_num_batched_tokens) is None},
        enforce_eager={rs.spec.name: rs.knobs.enforce_eager for rs in settings},
        kv_cache_dtype="fp8" if any(rs.knobs.kv_cache_dtype == "fp8" for rs in settings) else "auto",
        exclusive=inputs.exclusive,
        allow_untested_tp=any(rs.tensor_parallel_size not in rs.spec.tested_tp_degrees(version.name) for rs in kept),
        pin_kv=any(rs.kv_pinned_bytes for rs in settings),
        replicas="auto" if any(rs.replicas > 1 for rs in settings) else None,
        calibration=inputs.calibration,
        time_limit_s=time_limit,
    )
    ensure_renderable(request)
    try:
        result = plan(request)
    except NoPlanError as exc:
        attach_fixes(exc, request, o["quiet"])
        raise
    output = once(o["output"], "-o/--output")
    write_output(output, RENDERERS[request.schema](result))
    if not o["quiet"]:
        click.echo(render_gain_table(report, result), err=True, nl=False)
        if output not in (None, "-"):
            click.echo(f"omni-autoconf: wrote {output}", err=True)
    return 0
