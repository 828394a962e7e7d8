"""`omni-autoconf check CONFIG`: predict whether an existing stage config starts.

Parse, read each file, check (`planning.check.check_config`, on the start-up model the
planner uses), render; with --fix, plan the best config that keeps what the file pins.
Exit 0: no predicted problem (warnings may be listed); 1: a problem (with --strict, a warning
too) in any file; 2: invalid input or an internal error; 130: interrupted. Several files (as
pre-commit passes them) are judged one by one with the same options.
"""

from __future__ import annotations

import click

from .. import defaults as D
from ..errors import InputError, NoPlanError
from ..vllm.facts import NEWEST_OMNI_VERSION, GiB
from .common import attach_fixes, once, report_no_plan, run_command
from .output_files import check_output_path, write_output


@click.command("check")
@click.argument("config", nargs=-1, required=True)
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
@click.option("--format", "fmt", multiple=True, type=click.Choice(["table", "json", "github", "junit", "svg"]),
              help="github: GitHub Actions annotations; junit: JUnit XML; svg: each GPU's memory as a bar (one file "
                   "only). Default: table.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1): for CI gates.")
@click.option("--fix", is_flag=True, help="Write the optimal plan that keeps what the file pins (see --keep).")
@click.option("--keep", multiple=True, metavar="devices,tp|none", help="With --fix: what of the file stays pinned. Default: devices,tp.")
@click.option("--time-limit", multiple=True, metavar="SECONDS", help=f"With --fix: solver time limit. Default: {D.DEFAULT_TIME_LIMIT_S:g}.")
@click.option("-o", "--output", multiple=True, metavar="FILE", help="With --fix: write here (`-` is stdout).")
@click.option("-q", "--quiet", is_flag=True)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def check_command(**o) -> None:
    """Predict whether CONFIG (deploy or stage_args YAML; several: each) starts, and each stage's KV.

    Exit 0: starts with no predicted problem; 1: a problem is predicted (each with a
    stable code; with --strict, a warning too); 2: invalid input.
    """
    fmt = o["fmt"][0] if len(o["fmt"]) == 1 else "table"
    run_command(o["debug"], lambda: _check(**o), on_no_plan=lambda exc: report_no_plan(exc, "json" if fmt == "json" else "yaml"))


def _check(**o) -> int:
    from ..planning.check import check_config
    from ..planning.check_options import resolve_check

    fmt = once(o["fmt"], "--format", "table")
    output = once(o["output"], "-o/--output")

    def before_reading() -> None:
        if output is not None and not o["fix"]:
            raise InputError("check -o writes the file that --fix produces: add --fix, or drop -o (the report goes to "
                             "stdout)")
        if o["fix"] and len(o["config"]) > 1:
            raise InputError(f"--fix writes the plan of one file; {len(o['config'])} were given")
        check_output_path(output)

    reports = []
    for config in o["config"]:
        values = {"gpus": once(o["gpus"], "--gpus"), "model": once(o["model"], "--model"), "config": config,
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
        reports.append(report)
    write_output(None, _render(reports, fmt, o["strict"]))
    warned = sum(len(r.problems) - len(r.errors) for r in reports)
    if o["strict"] and warned and all(r.ok for r in reports) and not o["quiet"]:
        click.echo(f"omni-autoconf: --strict: {warned} warning(s) fail the check", err=True)
    return 0 if all(r.ok and not (o["strict"] and r.problems) for r in reports) else 1


def _render(reports: list, fmt: str, strict: bool) -> str:
    """The reports of the files checked, in one output of `fmt`."""
    import json

    from ..emit.check_github import render_check_github
    from ..emit.check_junit import render_check_junit
    from ..emit.check_report import check_dict, render_check_json, render_check_table

    if fmt == "junit":
        return render_check_junit(reports, strict)
    if fmt == "json":  # one file: its object, as ever; several: a list of them
        return render_check_json(reports[0]) if len(reports) == 1 else json.dumps(
            [check_dict(r) for r in reports], indent=2) + "\n"
    if fmt == "github":
        return "".join(render_check_github(r) for r in reports)
    if fmt == "svg":
        from ..emit.svg import render_check_svg

        if len(reports) > 1:
            raise InputError(f"--format svg draws one file's GPUs; {len(reports)} files were given")
        return render_check_svg(reports[0])
    return "\n".join(render_check_table(r) for r in reports)


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
    # Only what the file itself sets is pinned: the defaults check filled in are vLLM's for the
    # file as written, and the plan is written with the catalog's other fields (chunked prefill).
    file = {st.stage_id: st for st in config.stages}
    own = {rs.spec.name: file[rs.spec.stage_id] for rs in settings}
    tokens = {}
    for rs in settings:
        value = own[rs.spec.name].max_num_batched_tokens
        if value is None or rs.spec.batch_rule_error(value) is not None:
            continue
        if not pipeline.chunked_prefill(rs.spec, config.schema) and value < rs.knobs.max_model_len:
            # the written file turns chunked prefill off, and vLLM then refuses it
            # (vllm/config/scheduler.py verify_max_model_len; startup/engine_checks.py)
            if not o["quiet"]:
                click.echo(f"omni-autoconf: {rs.spec.name}: max_num_batched_tokens {value} not kept: the fixed file "
                           f"runs it without chunked prefill (as {pipeline.name}'s own file does), which needs at least "
                           f"max_model_len ({rs.knobs.max_model_len})", err=True)
            continue
        tokens[rs.spec.name] = value
    request = Request(
        pipeline=pipeline,
        model_ref=o["model"][0],
        gpus=gpus,
        version=version,
        schema=config.schema,
        buffer_gib=inputs.buffer_gib,
        tp={rs.spec.name: rs.tensor_parallel_size for rs in kept if "tp" in keep and rs.explicit_tp},
        devices={rs.spec.name: rs.devices for rs in kept if "devices" in keep and rs.explicit_devices},
        max_model_len={n: st.max_model_len for n, st in own.items() if st.max_model_len is not None
                       and pipeline.stage(n).has_kv_cache},
        max_num_seqs={n: st.max_num_seqs for n, st in own.items() if st.max_num_seqs is not None},
        max_num_batched_tokens=tokens,
        enforce_eager={n: st.enforce_eager for n, st in own.items() if st.enforce_eager is not None},
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
