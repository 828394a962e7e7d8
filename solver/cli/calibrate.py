"""`omni-autoconf calibrate LOGFILE... --config FILE --gpus ... --model ...`.

Reads the start-up logs of the config that produced them, compares every stage's printed
figures with the model's prediction for that config, and writes the calibration file that
`--calibration FILE` applies. Lines that match no known format are counted and reported.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from ..vllm.facts import NEWEST_OMNI_VERSION
from .common import once, run_command
from .output_files import check_output_path, write_output


LOG_FORMATS = """\
LOGS are vLLM / vLLM-Omni start-up logs as the server prints them (stdout or a log file; several
files are read as one). The lines read, vLLM 0.14.1-0.31 and V0: "Model loading took X GiB"
(V0: "Loading model weights took X GB"), "Available KV cache memory: X GiB", "GPU KV cache size: N
tokens", "Maximum concurrency for L tokens per request: Cx", "Free memory on device (F/T GiB) on
startup. Desired GPU memory utilization is (u, R GiB). Actual usage is ...", "Graph capturing
finished in S secs, took G GiB" and V0's "Memory profiling results: ...". Stages are told apart
by vLLM-Omni's "[Stage-N]" and "StageEngineCoreProc_stageN" tags, or by start-up order. Other
lines are counted, never fatal. `omni-autoconf bench entry LOG --config config.json` turns such
a log into an accuracy-set entry instead."""


@click.command("calibrate", epilog=LOG_FORMATS)
@click.argument("logs", nargs=-1, required=True)
@click.option("--config", "config_path", multiple=True, metavar="FILE", help="The stage config the logged start-up used.  [required]")
@click.option("--gpus", "gpus_text", multiple=True, metavar="NxNAME[,...]", help="The GPUs it ran on.  [required]")
@click.option("--model", "model_name", multiple=True, metavar="NAME", help="Pipeline from the catalog.  [required]")
@click.option("--omni-version", multiple=True, metavar="X.Y", help=f"Default: {NEWEST_OMNI_VERSION}.")
@click.option("--platform", multiple=True, help="Which `platforms:` overrides apply. Default: cuda.")
@click.option("-o", "--output", multiple=True, metavar="FILE", help="Write the calibration here (`-` is stdout).")
@click.option("-q", "--quiet", is_flag=True)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def calibrate_command(**o) -> None:
    """Fit per-stage memory corrections from real start-up LOGS and write a calibration
    file (apply it with --calibration FILE)."""
    run_command(o["debug"], lambda: _calibrate(**o))


def _calibrate(**o) -> int:
    from ..inputs.configfile import read_config
    from ..inputs.logparse import parse_log
    from ..inputs.model_source import resolve
    from ..inputs.yamlio import read_text
    from ..memory.calibration import fit, to_yaml
    from ..memory.stage_memory import stage_memory
    from ..planning.check import resolve_settings
    from ..planning.options import gpus_option
    from ..vllm.facts import omni_version

    config_path, gpus_text = once(o["config_path"], "--config"), once(o["gpus_text"], "--gpus")
    model_name = once(o["model_name"], "--model")
    if not config_path or not gpus_text or not model_name:
        raise InputError("calibrate needs --config, --gpus and --model (the start-up the logs come from)")
    output = once(o["output"], "-o/--output")
    check_output_path(output)
    source = resolve(model_name)
    pipeline = source.pipeline
    version = omni_version(once(o["omni_version"], "--omni-version", NEWEST_OMNI_VERSION))
    gpus = list(gpus_option(gpus_text, hosts=False))
    config = read_config(config_path, once(o["platform"], "--platform", "cuda"),
                         engine_extras=version.deploy_reads_engine_extras)
    unjudged = pipeline.judged_reason(config.schema, version)
    if unjudged is None and not version.reads(config.schema):
        unjudged = f"vLLM-Omni {version.name} does not read {config.schema} files: no start-up to calibrate from"
    if unjudged is not None:  # as check, and a start-up that cannot have happened
        raise InputError(unjudged)
    settings = resolve_settings(pipeline, config, version, gpus)
    memories = {rs.spec.name: stage_memory(rs.spec, rs.tensor_parallel_size, rs.knobs, version, rs.sequence_parallel)
                for rs in settings}
    text = "\n".join(read_text(p) for p in o["logs"])
    parsed = parse_log(text)
    gpu = gpus[settings[0].devices[0]].name if settings and settings[0].devices else gpus[0].name
    name = Path(output).name if output not in (None, "-") else "calibration.yaml"
    cal = fit(parsed, settings, memories, pipeline.name, gpu, version.name, name)
    header = (f"Written by omni-autoconf calibrate from {', '.join(Path(p).name for p in o['logs'])}: "
              f"{parsed.lines_read} lines, {parsed.lines_used} with start-up figures, {parsed.lines_unparsed} not "
              "parsed.\nApply with --calibration FILE; each stage's evidence says which lines it rests on.")
    write_output(output, to_yaml(cal, header))
    if not o["quiet"]:
        click.echo(f"omni-autoconf: calibrated {', '.join(sorted(cal.stages))} from {parsed.lines_used} of "
                   f"{parsed.lines_read} lines ({parsed.lines_unparsed} not parsed)", err=True)
    return 0
