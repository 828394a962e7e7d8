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
from ..vllm.facts import NEWEST_OMNI_VERSION, OMNI_VERSIONS, gib_text
from ..emit.targets import TARGETS
from .common import OneLineErrors, attach_fixes, once, report_no_plan, run_command
from .output_files import check_output_path, write_output

@click.group(cls=OneLineErrors, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--gpus", multiple=True, metavar="NxNAME[,...]",
              help="GPUs in CUDA order, e.g. 2xH100-80GB or 1xH100-80GB,1xA100-40GB; `local` reads them through NVML; "
                   "hosts: node0=8xH100-80GB;node1=4xL40S.")
@click.option("--nodes", multiple=True, metavar="N", help="N identical hosts, each with the --gpus given (vLLM-Omni 0.26+).")
@click.option("--model", multiple=True, metavar="NAME|DIR|ORG/NAME",
              help="A catalog pipeline (see `omni-autoconf models`), a local Hugging Face model directory, or a Hub id.")
@click.option("--omni-version", multiple=True, metavar="X.Y",
              help=f"vLLM-Omni version to plan for ({', '.join(OMNI_VERSIONS)}). Default: {NEWEST_OMNI_VERSION}.")
@click.option("--schema", multiple=True, type=click.Choice(["deploy", "stage-args"]),
              help="Output schema. Default: deploy for vLLM-Omni 0.26+, stage-args before; each version reads only some.")
@click.option("--format", "fmt", multiple=True, type=click.Choice(list(TARGETS)), help="Default: yaml.")
@click.option("-o", "--output", multiple=True, metavar="FILE", help="Write here (atomically; `-` is stdout) instead of stdout.")
@click.option("--tp", multiple=True, metavar="STAGE=N", help="Fix a stage's tensor_parallel_size (stage name or id).")
@click.option("--devices", multiple=True, metavar="STAGE=I[,J]", help="Pin a stage to these GPU indices (its TP = their count).")
@click.option("--enforce-eager", multiple=True, metavar="STAGE=true|false", help="enforce_eager (default: the bundled config's).")
@click.option("--dtype", multiple=True, metavar="[STAGE=]NAME",
              help="vLLM's --dtype per stage: auto, bfloat16, float16 (half), float32 (float). Default: auto.")
@click.option("--quantization", multiple=True, metavar="[STAGE=]METHOD",
              help="vLLM's --quantization per stage: fp8 quantizes an unquantized model at load; on a quantized "
              "checkpoint only its own method (or its Marlin kernel). Default: the checkpoint's.")
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
@click.option("--buffer", multiple=True, metavar="GIB",
              help=f"GiB kept free per GPU beyond vLLM-Omni's 2 GiB admission reserve. Default: {D.DEFAULT_BUFFER_GIB}.")
@click.option("--resolution", multiple=True, metavar="STEP", help=f"Step of gpu_memory_utilization. Default: {1 / D.DEFAULT_RESOLUTION}.")
@click.option("--time-limit", multiple=True, metavar="SECONDS",
              help=f"Solver time limit; the explanation and the fix search of a request with no plan get as much again each. Default: {D.DEFAULT_TIME_LIMIT_S:g}.")
@click.option("--workers", multiple=True, metavar="N", help="CP-SAT workers (default: the cores available, at most 8). The plan does not depend on it.")
@click.option("--image", multiple=True, metavar="IMAGE",
              help="k8s, helm-values: the container image. Default: the official vllm/vllm-omni tag of the version.")
@click.option("--namespace", multiple=True, metavar="NAME", help="k8s: the namespace (default: kubectl's current one).")
@click.option("--name", multiple=True, metavar="NAME", help="k8s: the name of the objects (default: from the model's).")
@click.option("--model-pvc", multiple=True, metavar="CLAIM",
              help="k8s: a PersistentVolumeClaim holding the model directory at its root (default: the Hub id).")
@click.option("--hf-token-secret", multiple=True, metavar="SECRET",
              help="k8s, helm-values: a Secret whose key `token` becomes HF_TOKEN (gated models).")
@click.option("--target-rate", multiple=True, metavar="REQ/S",
              help="Plan replicas (and, with --gpus TYPE without a count, the fewest GPUs) for this many requests/s, "
                   "from a performance profile (docs/rate-planning.md).")
@click.option("--ttfp-p50", multiple=True, metavar="MS", help="With --target-rate: median time to first audio packet, ms.")
@click.option("--rtf", multiple=True, metavar="X", help="With --target-rate: median real-time factor (default: 1 where measured).")
@click.option("--profile", multiple=True, metavar="FILE",
              help="With --target-rate: the performance profile (default: the model's shipped example).")
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


# Options the plan command passes to the Python API's Request as given (once each), and the
# repeatable ones it passes as tuples of terms.
SINGLE = ("gpus", "model", "omni_version", "nodes", "schema", "kv_cache_dtype", "replicas", "calibration", "buffer",
          "resolution", "time_limit", "workers")
# Options of the output target (emit/targets.py Target.options), passed to its render.
RENDER_OPTIONS = ("image", "namespace", "name", "model_pvc", "hf_token_secret")
REPEATABLE = ("tp", "devices", "enforce_eager", "dtype", "quantization", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
              "min_concurrency", "weight", "exclusive")


def build_request(o: dict):
    """The API's Request from the plan command's options; its validation error as the one
    line the command line prints."""
    from pydantic import ValidationError

    from ..api import Request

    values = {name: once(o[name], "--" + name.replace("_", "-")) for name in SINGLE}
    fields = {name: v for name, v in values.items() if v is not None}
    fields.update({name: o[name] for name in REPEATABLE if o[name]})
    fields.update(allow_untested_tp=o["allow_untested_tp"], pin_kv=o["pin_kv"])
    if not values["gpus"] or not values["model"]:
        raise InputError("both --gpus and --model are required (see --help)")
    try:
        return Request(**fields)
    except ValidationError as exc:
        raise InputError(exc.errors()[0]["msg"]) from None


def _plan_command(**o) -> int:
    from ..emit.summary import render_table
    from ..emit.targets import TARGETS
    from ..inputs.gpus import node_names
    from ..planning.planner import plan
    from .output_files import check_output_folder, write_folder

    from ..emit.targets import check_options

    request = build_request(o).resolved
    fmt = once(o["fmt"], "--format", "yaml")
    target = TARGETS[fmt]
    render_options = check_options(fmt, request, {name: once(o[name], "--" + name.replace("_", "-"))
                                                  for name in RENDER_OPTIONS})
    output = once(o["output"], "-o/--output")
    folder = target.folder(request)
    if folder:
        check_output_folder(output, len(node_names(request.gpus)))
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

    from .profile import rate_target

    rate = rate_target(o, request.pipeline.name)
    try:
        if rate is not None:
            from ..planning.rate import gpu_type_only, plan_for_rate

            result = plan_for_rate(request, rate, gpu_type_only(once(o["gpus"], "--gpus")), on_solve=progress)
        else:
            result = plan(request, on_solve=progress)
    except NoPlanError as exc:
        attach_fixes(exc, request, o["quiet"])
        raise
    files = target.render(result, render_options)
    if folder:
        written = write_folder(output, files)
    else:
        write_output(output, next(iter(files.values())))
        written = [] if output in (None, "-") else [output]
    if not o["quiet"]:
        click.echo(render_table(result), err=True, nl=False)
        if written:
            click.echo(f"omni-autoconf: wrote {', '.join(written)}", err=True)
    return 0


@main.command("gpus")
def list_gpus() -> None:
    """List the GPU catalog: names, aliases and the CUDA total used."""
    from ..inputs.gpus import gpu_catalog

    for spec in gpu_catalog().values():
        est = (" (estimated)" if spec.estimated else "") + ("" if spec.bf16 else " (no bfloat16)")
        aliases = ", ".join([*spec.aliases, *spec.nvml_names])
        click.echo(f"{spec.name:<15} {gib_text(spec.capacity_bytes):>7} GiB = {spec.capacity_bytes:>12} B planned{est}  "
                   f"aliases: {aliases}")


@main.command("models")
def list_models() -> None:
    """List the model catalog with each pipeline's stages and tested TP degrees, and how its memory
    terms are known: measured (a start-up log), derived (config, tensor sizes, code) or estimated."""
    from ..inputs.catalog import model_catalog
    from ..inputs.catalog_provenance import provenance
    from ..vllm.facts import range_text

    width = max(len(name) for name in model_catalog())
    for spec in model_catalog().values():
        stages = " -> ".join(
            f"{s.name} (TP {'/'.join(map(str, s.tested_tp_degrees(NEWEST_OMNI_VERSION)))})" for s in spec.stages
        )
        served = f"deploy {range_text(spec.deploy_versions)}" + (
            f", stage_args {range_text(spec.legacy_versions)}" if spec.legacy_versions else "")
        terms = provenance(spec)
        click.echo(f"{spec.name:<{width}}  {spec.hf_id}: {stages}  [{served}]  memory terms: "
                   f"{terms['measured']} measured, {terms['derived']} derived, {terms['estimated']} estimated")


def _register() -> None:
    from .bench import bench_group
    from .calibrate import calibrate_command
    from .check import check_command
    from .profile import profile_group

    main.add_command(check_command)
    main.add_command(bench_group)
    main.add_command(calibrate_command)
    main.add_command(profile_group)


_register()
