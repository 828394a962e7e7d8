"""The command line: parse, load, call `planner.plan`, render. Nothing else lives here.

    omni-autoconf --gpus 2xH100-80GB --model qwen3-omni-moe [options]
    omni-autoconf check CONFIG --gpus ... --model ...   # see cli_check.py
    omni-autoconf gpus      # the GPU catalog
    omni-autoconf models    # the model catalog

Exit codes: 0 plan written; 1 no plan fits (with the reason); 2 invalid input.
Domain errors become one line on stderr; tracebacks only with --debug.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Callable, TypeVar

import click

from . import __version__
from .errors import AutoconfError, InputError, NoPlanError
from .vllm_facts import GiB, NEWEST_OMNI_VERSION, OMNI_VERSIONS

T = TypeVar("T")

LIMITS = {
    "tp": (1, 64),
    "max-model-len": (16, 10_000_000),
    "max-num-seqs": (1, 65_536),
    "max-num-batched-tokens": (1, 10_000_000),
    "min-concurrency": (1, 100_000),
    "weight": (0.01, 100.0),
}


def _per_stage(
    option: str,
    values: tuple[str, ...],
    pipeline,
    cast: Callable[[str], T],
    *,
    kv_only: bool = False,
    allow_global: bool = True,
) -> dict[str, T]:
    """Parse `N` (every stage) or `STAGE=N[,STAGE=N]` (STAGE: name or id) into {name: value}."""
    lo, hi = LIMITS[option]
    out: dict[str, T] = {}
    for text in values:
        for term in text.split(","):
            term = term.strip()
            if not term:
                raise InputError(f"--{option}: empty term in {text!r}")
            key, sep, raw = term.rpartition("=")
            try:
                value = cast(raw)
            except ValueError:
                raise InputError(f"--{option}: {raw!r} is not a valid number (in {term!r})") from None
            if not lo <= value <= hi:
                raise InputError(f"--{option}: {value} is out of range [{lo}, {hi}]")
            if sep:
                stage = pipeline.stage(key.strip())
                if kv_only and not stage.has_kv_cache:
                    raise InputError(f"--{option} {term}: {stage.name} has no KV cache, so it has no {option}")
                out[stage.name] = value
            elif allow_global:
                for st in pipeline.stages:
                    if st.has_kv_cache or not kv_only:
                        out.setdefault(st.name, value)
            else:
                raise InputError(f"--{option}: expected STAGE=VALUE, got {term!r}")
    return out


def _devices(values: tuple[str, ...], pipeline) -> dict[str, tuple[int, ...]]:
    """Parse `--devices STAGE=0,1` (one stage per option) into {name: (0, 1)}."""
    out: dict[str, tuple[int, ...]] = {}
    for text in values:
        key, sep, raw = text.partition("=")
        if not sep:
            raise InputError(f"--devices: expected STAGE=INDEX[,INDEX...], got {text!r}")
        try:
            devices = tuple(int(p) for p in raw.split(","))
        except ValueError:
            raise InputError(f"--devices {text!r}: GPU indices must be whole numbers") from None
        out[pipeline.stage(key.strip()).name] = devices
    return out


def _exclusive_groups(values: tuple[str, ...], pipeline) -> tuple[tuple[str, ...], ...]:
    groups = []
    for text in values:
        names = [pipeline.stage(k.strip()).name for k in text.split(",") if k.strip()]
        if len(names) < 2 or len(set(names)) != len(names):
            raise InputError(f"--exclusive {text!r}: name at least two different stages, e.g. thinker,code2wav")
        groups.append(tuple(names))
    return tuple(groups)


def _resolution(step: float) -> int:
    steps = round(1 / step) if step > 0 else 0
    if not 1 <= steps <= 1000 or abs(steps * step - 1) > 1e-9:
        raise InputError(f"--resolution {step:g}: must be 1/N for a whole N from 1 to 1000 (e.g. 0.01, 0.005)")
    return steps


def write_atomically(path: str, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".omni-autoconf-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _no_plan_text(exc: NoPlanError) -> str:
    from .fixes import FIX_KINDS

    lines = [f"omni-autoconf: no plan: {exc.message}"]
    lines += [f"  - {r}" for r in exc.reasons]
    if exc.fixes:
        lines.append("Fixes, each proven to give a plan (smallest change first):")
        for f in exc.fixes:
            lines.append(f"  * {f.summary}:")
            lines.append(f"      {f.command}")
    else:
        lines.append(f"No fix within the fix list ({FIX_KINDS}) gives a plan.")
    return "\n".join(lines) + "\n"


def _run(debug: bool, action: Callable[[], int]) -> None:
    """Run `action`, turning domain errors into one line and an exit code."""
    try:
        code = action()
    except AutoconfError as exc:
        if debug:
            raise
        if isinstance(exc, NoPlanError):
            click.echo(_no_plan_text(exc), err=True, nl=False)
        else:
            click.echo(f"omni-autoconf: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (OSError, KeyboardInterrupt) as exc:
        if debug:
            raise
        click.echo(f"omni-autoconf: error: {exc or type(exc).__name__}", err=True)
        sys.exit(2)
    except Exception as exc:  # a bug: say so in one line, keep the traceback for --debug
        if debug:
            raise
        click.echo(f"omni-autoconf: internal error: {type(exc).__name__}: {exc} (re-run with --debug)", err=True)
        sys.exit(3)
    sys.exit(code)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--gpus", "gpus_text", metavar="NxNAME[,...]", help="GPUs in CUDA order, e.g. 2xH100-80GB or 1xH100-80GB,1xA100-40GB; `local` reads them through NVML.")
@click.option("--model", "model_name", metavar="NAME", help="Pipeline from the catalog (see `omni-autoconf models`).")
@click.option("--omni-version", default=NEWEST_OMNI_VERSION, show_default=True, metavar="X.Y",
              help=f"vLLM-Omni version to plan for ({', '.join(OMNI_VERSIONS)}).")
@click.option("--schema", type=click.Choice(["deploy", "stage-args"]),
              help="Output schema. Default: deploy for vLLM-Omni 0.26+, stage-args before.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write here (atomically) instead of stdout.")
@click.option("--tp", multiple=True, metavar="STAGE=N", help="Fix a stage's tensor_parallel_size (stage name or id).")
@click.option("--devices", multiple=True, metavar="STAGE=I[,J]", help="Pin a stage to these GPU indices (its TP = their count).")
@click.option("--enforce-eager", multiple=True, metavar="STAGE=true|false", help="enforce_eager (default: the bundled config's).")
@click.option("--max-model-len", multiple=True, metavar="[STAGE=]N", help="max_model_len (default: the model's maximum position).")
@click.option("--max-num-seqs", multiple=True, metavar="[STAGE=]N", help="max_num_seqs (default: the bundled config's).")
@click.option("--max-num-batched-tokens", multiple=True, metavar="[STAGE=]N", help="max_num_batched_tokens (default: the bundled config's).")
@click.option("--min-concurrency", multiple=True, metavar="[STAGE=]N", help="Requests of max_model_len each KV stage must hold (default 1).")
@click.option("--weight", multiple=True, metavar="STAGE=W", help="Weight of a stage in the objective (default 1).")
@click.option("--exclusive", multiple=True, metavar="A,B", help="Stages never resident at the same time (separate launches, sleep mode).")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True)
@click.option("--buffer", "buffer_gib", type=float, default=0.5, show_default=True,
              help="GiB kept free per GPU beyond vLLM-Omni's 2 GiB admission reserve.")
@click.option("--resolution", type=float, default=0.01, show_default=True, help="Step of gpu_memory_utilization.")
@click.option("--time-limit", type=float, default=30.0, show_default=True, help="Solver time limit, seconds.")
@click.option("-q", "--quiet", is_flag=True, help="No progress line or summary table on stderr.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(__version__, prog_name="omni-autoconf")
@click.pass_context
def main(ctx: click.Context, **opts) -> None:
    """Plan GPU placement and gpu_memory_utilization for a vLLM-Omni pipeline.

    Writes the stage config that maximises the smallest KV-cache headroom (in
    requests of max_model_len) over the KV stages, proven optimal by CP-SAT.
    """
    if ctx.invoked_subcommand is not None:
        return
    _run(opts["debug"], lambda: _plan_command(**opts))


def _plan_command(**o) -> int:
    from .catalog import lookup_model
    from .planner import Request, plan
    from .render import RENDERERS, render_json, render_table
    from .vllm_facts import omni_version

    if not o["gpus_text"] or not o["model_name"]:
        raise InputError("both --gpus and --model are required (see --help)")
    gpus = _gpus(o["gpus_text"])
    pipeline = lookup_model(o["model_name"])
    version = omni_version(o["omni_version"])
    if not 0 <= o["buffer_gib"] <= 64:
        raise InputError(f"--buffer {o['buffer_gib']:g}: must be between 0 and 64 GiB")
    if not 0.1 <= o["time_limit"] <= 3600:
        raise InputError(f"--time-limit {o['time_limit']:g}: must be between 0.1 and 3600 seconds")
    request = Request(
        pipeline=pipeline,
        gpus=gpus,
        version=version,
        schema=o["schema"] or version.schema,
        buffer_bytes=int(o["buffer_gib"] * GiB),
        resolution=_resolution(o["resolution"]),
        tp=_per_stage("tp", o["tp"], pipeline, int, allow_global=False),
        devices=_devices(o["devices"], pipeline),
        enforce_eager=_bool_per_stage("enforce-eager", o["enforce_eager"], pipeline),
        max_model_len=_per_stage("max-model-len", o["max_model_len"], pipeline, int, kv_only=True),
        max_num_seqs=_per_stage("max-num-seqs", o["max_num_seqs"], pipeline, int),
        max_num_batched_tokens=_per_stage("max-num-batched-tokens", o["max_num_batched_tokens"], pipeline, int),
        min_concurrency=_per_stage("min-concurrency", o["min_concurrency"], pipeline, int, kv_only=True),
        weight=_per_stage("weight", o["weight"], pipeline, float, kv_only=True),
        exclusive=_exclusive_groups(o["exclusive"], pipeline),
        kv_cache_dtype=o["kv_cache_dtype"],
        time_limit_s=o["time_limit"],
    )
    def progress(problem) -> None:
        if not o["quiet"]:
            click.echo(
                f"omni-autoconf: planning {pipeline.name} on {len(problem.gpus)} GPU(s) with CP-SAT "
                f"(time limit {request.time_limit_s:g} s) ...",
                err=True,
            )

    try:
        result = plan(request, on_solve=progress)
    except NoPlanError as exc:
        _attach_fixes(exc, request, o["quiet"])
        if o["fmt"] == "json":
            click.echo(json.dumps(no_plan_dict(exc), indent=2))
        raise
    text = render_json(result) if o["fmt"] == "json" else RENDERERS[request.schema](result)
    if o["output"]:
        write_atomically(o["output"], text)
    else:
        click.echo(text, nl=False)
    if not o["quiet"]:
        click.echo(render_table(result), err=True, nl=False)
        if o["output"]:
            click.echo(f"omni-autoconf: wrote {o['output']}", err=True)
    return 0


def _attach_fixes(exc: NoPlanError, request, quiet: bool) -> None:
    from .fixes import propose_fixes

    if not quiet:
        click.echo("omni-autoconf: no plan; searching for fixes (each proven by re-solving) ...", err=True)
    exc.fixes = propose_fixes(request)


def no_plan_dict(exc: NoPlanError) -> dict:
    """A failed plan as data (`--format json`)."""
    from .fixes import FIX_KINDS

    return {
        "status": "infeasible",
        "message": exc.message,
        "conflict": exc.conflict,
        "reasons": exc.reasons,
        "fixes": [f.as_dict() for f in exc.fixes],
        "fixes_tried": FIX_KINDS,
    }


def _bool_per_stage(option: str, values: tuple[str, ...], pipeline) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for text in values:
        for term in text.split(","):
            key, sep, raw = term.partition("=")
            if not sep or raw.strip().lower() not in ("true", "false"):
                raise InputError(f"--{option}: expected STAGE=true|false, got {term!r}")
            out[pipeline.stage(key.strip()).name] = raw.strip().lower() == "true"
    return out


def _gpus(text: str):
    from .gpus import parse_gpus

    if text.strip().lower() == "local":
        from .nvml import read_local_gpus

        return tuple(read_local_gpus())
    return tuple(parse_gpus(text))


@main.command("gpus")
def list_gpus() -> None:
    """List the GPU catalog: names, aliases and the CUDA total used."""
    from .gpus import gpu_catalog

    for spec in gpu_catalog().values():
        printed = spec.total_gib if spec.total_gib is not None else spec.capacity_bytes / GiB
        est = " (estimated)" if spec.estimated else ""
        aliases = ", ".join([*spec.aliases, *spec.nvml_names])
        click.echo(f"{spec.name:<15} {printed:7.2f} GiB = {spec.capacity_bytes:>12} B planned{est}  aliases: {aliases}")


@main.command("models")
def list_models() -> None:
    """List the model catalog with each pipeline's stages."""
    from .catalog import model_catalog

    for spec in model_catalog().values():
        stages = " -> ".join(f"{s.name} (TP {'/'.join(map(str, s.tp_degrees))})" for s in spec.stages)
        click.echo(f"{spec.name:<18} {spec.hf_id}: {stages}")


from . import cli_check  # noqa: E402,F401  registers `omni-autoconf check` on `main`

__all__ = ["main", "cli_check"]
