"""The command line: parse, load, call `planner.plan`, render. Nothing else lives here.

    omni-autoconf --gpus 2xH100-80GB --model qwen3-omni-moe [options]
    omni-autoconf check CONFIG --gpus ... --model ...   # see cli_check.py
    omni-autoconf gpus      # the GPU catalog
    omni-autoconf models    # the model catalog

Exit codes: 0 plan written; 1 no plan written (infeasible, proven; or unknown: the time
limit came first); 2 invalid input or an internal error; 130 interrupted.
"""

from __future__ import annotations

import click

from .. import __version__
from .. import defaults as D
from ..errors import InputError, NoPlanError
from ..vllm.facts import NEWEST_OMNI_VERSION, OMNI_VERSIONS, GiB
from .common import (
    OneLineErrors,
    attach_fixes,
    bounded,
    calibration_option,
    exclusive_groups,
    expand_global,
    gpus_option,
    once,
    parse_float,
    parse_int,
    per_stage,
    report_no_plan,
    run_command,
    time_limit_option,
)
from .output_files import check_output_path, write_output

LIMITS = {
    "tp": (1, 64),
    "max-model-len": (16, 10_000_000),
    "max-num-seqs": (1, 65_536),
    "max-num-batched-tokens": (1, 10_000_000),
    "min-concurrency": (1, 100_000),
    "weight": (0.01, 100.0),
}


def _devices(values: tuple[str, ...], pipeline) -> dict[str, tuple[int, ...]]:
    """Parse `--devices STAGE=0,1` (one stage per option) into {name: (0, 1)}."""
    out: dict[str, tuple[int, ...]] = {}
    for text in values:
        key, sep, raw = text.partition("=")
        if not sep:
            raise InputError(f"--devices: expected STAGE=INDEX[,INDEX...], got {text!r}")
        devices = tuple(parse_int(p, f"--devices {text}") for p in raw.split(","))
        name = pipeline.stage(key.strip()).name
        if name in out:
            raise InputError(f"--devices: {name} is given twice")
        out[name] = devices
    return out


def _bools(option: str, values: tuple[str, ...], pipeline) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for text in values:
        for term in text.split(","):
            key, sep, raw = term.partition("=")
            if not sep or raw.strip().lower() not in ("true", "false"):
                raise InputError(f"--{option}: expected STAGE=true|false, got {term!r}")
            name = pipeline.stage(key.strip()).name
            if name in out:
                raise InputError(f"--{option}: {name} is given twice")
            out[name] = raw.strip().lower() == "true"
    return out


def resolution_option(text: str) -> int:
    step = parse_float(text, "--resolution")
    steps = round(1 / step) if step > 0 else 0
    if not 1 <= steps <= D.MAX_RESOLUTION or abs(steps * step - 1) > 1e-9:
        raise InputError(f"--resolution {text}: must be 1/N for a whole N from 1 to {D.MAX_RESOLUTION} (e.g. 0.01, 0.005)")
    return steps


def replicas_option(text: str | None) -> str | None:
    if text is None or text.strip().lower() == "auto":
        return None if text is None else "auto"
    return str(bounded(parse_int(text, "--replicas"), 1, D.MAX_GPUS, "--replicas"))


def workers_option(text: str | None) -> int | None:
    return None if text is None else bounded(parse_int(text, "--workers"), 1, 64, "--workers")


@click.group(cls=OneLineErrors, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--gpus", "gpus_text", multiple=True, metavar="NxNAME[,...]",
              help="GPUs in CUDA order, e.g. 2xH100-80GB or 1xH100-80GB,1xA100-40GB; `local` reads them through NVML; "
                   "hosts: node0=8xH100-80GB;node1=4xL40S.")
@click.option("--nodes", multiple=True, metavar="N", help="N identical hosts, each with the --gpus given (vLLM-Omni 0.26+).")
@click.option("--model", "model_name", multiple=True, metavar="NAME|DIR|ORG/NAME",
              help="A catalog pipeline (see `omni-autoconf models`), a local Hugging Face model directory, or a Hub id.")
@click.option("--omni-version", multiple=True, metavar="X.Y",
              help=f"vLLM-Omni version to plan for ({', '.join(OMNI_VERSIONS)}). Default: {NEWEST_OMNI_VERSION}.")
@click.option("--schema", multiple=True, type=click.Choice(["deploy", "stage-args"]),
              help="Output schema. Default: deploy for vLLM-Omni 0.26+, stage-args before; each version reads only some.")
@click.option("--format", "fmt", multiple=True, type=click.Choice(["yaml", "json"]), help="Default: yaml.")
@click.option("-o", "--output", multiple=True, metavar="FILE", help="Write here (atomically; `-` is stdout) instead of stdout.")
@click.option("--tp", multiple=True, metavar="STAGE=N", help="Fix a stage's tensor_parallel_size (stage name or id).")
@click.option("--devices", multiple=True, metavar="STAGE=I[,J]", help="Pin a stage to these GPU indices (its TP = their count).")
@click.option("--enforce-eager", multiple=True, metavar="STAGE=true|false", help="enforce_eager (default: the bundled config's).")
@click.option("--max-model-len", multiple=True, metavar="[STAGE=]N", help="max_model_len of KV stages (default: the bundled config's, else the model's maximum position).")
@click.option("--max-num-seqs", multiple=True, metavar="[STAGE=]N", help="max_num_seqs (default: the bundled config's), where the model can batch that many.")
@click.option("--max-num-batched-tokens", multiple=True, metavar="[STAGE=]N", help="max_num_batched_tokens (default: the bundled config's).")
@click.option("--min-concurrency", multiple=True, metavar="[STAGE=]N", help="Requests of max_model_len each KV stage must hold (default 1; a stage "
              "whose requests take two KV rows, CFG's, counts rows: default 2).")
@click.option("--weight", multiple=True, metavar="STAGE=W", help="Weight of a stage in the objective (default 1).")
@click.option("--exclusive", multiple=True, metavar="A,B", help="Stages never resident at the same time (separate launches, sleep mode).")
@click.option("--kv-cache-dtype", multiple=True, type=click.Choice(["auto", "fp8"]), help="Default: auto.")
@click.option("--allow-untested-tp", is_flag=True, help="Also plan TP degrees no upstream config or test runs (the header says so).")
@click.option("--replicas", multiple=True, metavar="N|auto",
              help="Replicas per stage (vLLM-Omni 0.20+): N of every stage, or auto: the solver chooses. Default: auto "
                   "from 0.20 (a replica that adds no headroom is never planned), 1 before.")
@click.option("--pin-kv", is_flag=True, help="Write each KV stage's planned kv_cache_memory_bytes (vLLM then sizes no KV itself).")
@click.option("--calibration", multiple=True, metavar="FILE", help="Apply the corrections `omni-autoconf calibrate` measured.")
@click.option("--buffer", "buffer_gib", multiple=True, metavar="GIB",
              help=f"GiB kept free per GPU beyond vLLM-Omni's 2 GiB admission reserve. Default: {D.DEFAULT_BUFFER_GIB}.")
@click.option("--resolution", multiple=True, metavar="STEP", help=f"Step of gpu_memory_utilization. Default: {1 / D.DEFAULT_RESOLUTION}.")
@click.option("--time-limit", multiple=True, metavar="SECONDS",
              help=f"Solver time limit; the explanation and the fix search of a request with no plan get as much again each. Default: {D.DEFAULT_TIME_LIMIT_S:g}.")
@click.option("--workers", multiple=True, metavar="N", help="CP-SAT workers (default: the cores available, at most 8). The plan does not depend on it.")
@click.option("-q", "--quiet", is_flag=True, help="No progress line or summary table on stderr.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(__version__, prog_name="omni-autoconf")
@click.pass_context
def main(ctx: click.Context, **opts) -> None:
    """Plan GPU placement and gpu_memory_utilization for a vLLM-Omni pipeline.

    Writes the stage config that maximises the smallest KV-cache headroom (in
    requests of max_model_len, counting no more than max_num_seqs of them without
    prefix caching) over the KV stages, proven optimal by CP-SAT.
    """
    if ctx.invoked_subcommand is not None:
        return
    fmt = "yaml"
    try:
        fmt = once(opts["fmt"], "--format", "yaml")
    except InputError:
        pass
    run_command(opts["debug"], lambda: _plan_command(**opts), on_no_plan=lambda exc: report_no_plan(exc, fmt))


def build_request(o: dict):
    """The planner's Request from the plan command's options (every value checked)."""
    from ..inputs.model_source import resolve
    from ..plan.planner import Request
    from ..vllm.facts import omni_version

    gpus_text, model_name = once(o["gpus_text"], "--gpus"), once(o["model_name"], "--model")
    if not gpus_text or not model_name:
        raise InputError("both --gpus and --model are required (see --help)")
    source = resolve(model_name)
    pipeline = source.pipeline
    version = omni_version(once(o["omni_version"], "--omni-version", NEWEST_OMNI_VERSION))
    buffer_gib = bounded(parse_float(once(o["buffer_gib"], "--buffer", str(D.DEFAULT_BUFFER_GIB)), "--buffer"),
                         0.0, D.MAX_BUFFER_GIB, "--buffer")

    def stagewise(option, cast, *, kv_only=False, allow_global=True):
        values, everything = per_stage(option, o[option.replace("-", "_")], pipeline, cast, LIMITS[option],
                                       kv_only=kv_only, allow_global=allow_global)
        return values, everything

    tp, _ = stagewise("tp", parse_int, allow_global=False)
    globals_: dict[str, int] = {}
    knob_values = {}
    for option, kv_only in (("max-model-len", True), ("max-num-seqs", False), ("max-num-batched-tokens", False)):
        values, everything = stagewise(option, parse_int, kv_only=kv_only)
        knob_values[option] = values
        if everything is not None:
            globals_[option.replace("-", "_")] = everything
    min_conc, min_conc_all = stagewise("min-concurrency", parse_int, kv_only=True)
    weight, weight_all = stagewise("weight", parse_float, kv_only=True)
    nodes = once(o["nodes"], "--nodes")
    gpus = gpus_option(gpus_text, None if nodes is None else bounded(parse_int(nodes, "--nodes"), 1, D.MAX_GPUS, "--nodes"))
    return Request(
        pipeline=pipeline,
        model_ref=source.reference,
        model_notes=source.notes,
        gpus=gpus,
        version=version,
        # several hosts are written in the deploy schema (the only one with headless stages)
        schema=once(o["schema"], "--schema") or ("deploy" if len({g.node for g in gpus}) > 1 and
                                                  version.reads("deploy") else version.schema),
        buffer_gib=buffer_gib,
        resolution=resolution_option(once(o["resolution"], "--resolution", str(1 / D.DEFAULT_RESOLUTION))),
        tp=tp,
        devices=_devices(o["devices"], pipeline),
        enforce_eager=_bools("enforce-eager", o["enforce_eager"], pipeline),
        max_model_len=knob_values["max-model-len"],
        max_num_seqs=knob_values["max-num-seqs"],
        max_num_batched_tokens=knob_values["max-num-batched-tokens"],
        global_values=globals_,
        min_concurrency=expand_global(min_conc, min_conc_all, pipeline, kv_only=True),
        weight=expand_global(weight, weight_all, pipeline, kv_only=True),
        exclusive=exclusive_groups(o["exclusive"], pipeline),
        kv_cache_dtype=once(o["kv_cache_dtype"], "--kv-cache-dtype", "auto"),
        allow_untested_tp=o["allow_untested_tp"],
        pin_kv=o["pin_kv"],
        replicas=replicas_option(once(o["replicas"], "--replicas")),
        calibration=calibration_option(once(o["calibration"], "--calibration"), pipeline, version, gpus),
        time_limit_s=time_limit_option(once(o["time_limit"], "--time-limit", str(D.DEFAULT_TIME_LIMIT_S))),
        workers=workers_option(once(o["workers"], "--workers")),
    )


def _plan_command(**o) -> int:
    from ..emit.render import RENDERERS, ensure_renderable
    from ..emit.summary import render_json, render_table
    from ..inputs.gpus import node_names
    from ..plan.planner import plan

    request = build_request(o)
    fmt = once(o["fmt"], "--format", "yaml")
    output = once(o["output"], "-o/--output")
    hosts = len(node_names(request.gpus))
    ensure_renderable(request)
    if hosts > 1 and fmt == "yaml":
        from .output_files import check_output_folder

        check_output_folder(output, hosts)
    else:
        check_output_path(output)

    def replicas_note(problem) -> str:
        if any(st.may_replicate for st in problem.stages):
            return ", replicas per stage"
        return ""

    def progress(problem) -> None:
        if not o["quiet"]:
            click.echo(
                f"omni-autoconf: planning {request.pipeline.name} on {len(problem.gpus)} GPU(s) with CP-SAT"
                f"{replicas_note(problem)} (time limit {request.time_limit_s:g} s) ...",
                err=True,
            )

    try:
        result = plan(request, on_solve=progress)
    except NoPlanError as exc:
        attach_fixes(exc, request, o["quiet"])
        raise
    if hosts > 1 and fmt == "yaml":
        written = write_host_files(result, output)
    else:
        write_output(output, render_json(result) if fmt == "json" else RENDERERS[request.schema](result))
        written = [] if output in (None, "-") else [output]
    if not o["quiet"]:
        click.echo(render_table(result), err=True, nl=False)
        if written:
            click.echo(f"omni-autoconf: wrote {', '.join(written)}", err=True)
    return 0


def write_host_files(result, folder: str) -> list[str]:
    """One deploy file per host and launch.sh, written as one set."""
    from ..emit.multihost import file_name, launch_script, layouts
    from ..emit.render import header, render_deploy
    from .output_files import write_folder

    all_layouts = layouts(result)
    files = {file_name(layout): render_deploy(result, layout) for layout in all_layouts}
    files["launch.sh"] = launch_script(result, header(result), all_layouts)
    return write_folder(folder, files)


@main.command("gpus")
def list_gpus() -> None:
    """List the GPU catalog: names, aliases and the CUDA total used."""
    from ..inputs.gpus import gpu_catalog

    for spec in gpu_catalog().values():
        printed = spec.total_gib if spec.total_gib is not None else spec.capacity_bytes / GiB
        est = (" (estimated)" if spec.estimated else "") + ("" if spec.bf16 else " (no bfloat16)")
        aliases = ", ".join([*spec.aliases, *spec.nvml_names])
        click.echo(f"{spec.name:<15} {printed:7.2f} GiB = {spec.capacity_bytes:>12} B planned{est}  aliases: {aliases}")


@main.command("models")
def list_models() -> None:
    """List the model catalog with each pipeline's stages and tested TP degrees."""
    from ..inputs.catalog import model_catalog
    from ..vllm.facts import range_text

    width = max(len(name) for name in model_catalog())
    for spec in model_catalog().values():
        stages = " -> ".join(
            f"{s.name} (TP {'/'.join(map(str, s.tested_tp_degrees(NEWEST_OMNI_VERSION)))})" for s in spec.stages
        )
        served = f"deploy {range_text(spec.deploy_versions)}" + (
            f", stage_args {range_text(spec.legacy_versions)}" if spec.legacy_versions else "")
        click.echo(f"{spec.name:<{width}}  {spec.hf_id}: {stages}  [{served}]")


def _register() -> None:
    from .bench import bench_group
    from .calibrate import calibrate_command
    from .check import check_command

    main.add_command(check_command)
    main.add_command(bench_group)
    main.add_command(calibrate_command)


_register()
