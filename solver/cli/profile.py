"""`omni-autoconf profile import RESULTS...` and the plan command's rate options.

    omni-autoconf profile import r8.json r16.json --gpu H100-80GB [--model NAME] [--stage NAME] -o p.yaml
    omni-autoconf --model qwen3-tts-1.7b --gpus H100-80GB --target-rate 12 [--profile p.yaml]

docs/rate-planning.md describes the profile format and how a plan uses it.
"""

from __future__ import annotations

import click

from ..errors import InputError
from .common import once, run_command
from .output_files import check_output_path, write_output


def _float(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{option} {text[:40]!r}: expected a number") from None
    if not value > 0 or value == float("inf"):
        raise InputError(f"{option} {text[:40]!r}: must be a finite number above 0")
    return value


def rate_target(o: dict, pipeline: str):
    """The plan command's RateTarget, or None without --target-rate."""
    from ..inputs.perf_profile import load_profile, shipped_profiles
    from ..planning.rate import RateTarget

    rate = _float(once(o["target_rate"], "--target-rate"), "--target-rate")
    others = [name for name in ("ttfp_p50", "rtf", "profile") if o[name]]
    if rate is None:
        if others:
            raise InputError(f"--{others[0].replace('_', '-')} is a rate-planning option: give --target-rate too")
        return None
    path = once(o["profile"], "--profile")
    if path is None:
        shipped = shipped_profiles()
        if pipeline not in shipped:
            raise InputError(f"--target-rate: no example profile ships for {pipeline} (they exist for "
                             f"{', '.join(shipped)}); measure one and pass --profile FILE (docs/rate-planning.md)")
        profile, name = load_profile(shipped[pipeline]), f"shipped example {pipeline}"
    else:
        profile, name = load_profile(path), path
    return RateTarget(rate=rate, profile=profile, profile_name=name,
                      ttfp_p50_ms=_float(once(o["ttfp_p50"], "--ttfp-p50"), "--ttfp-p50"),
                      rtf=_float(once(o["rtf"], "--rtf"), "--rtf"))


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key.strip():
            raise InputError(f"{option} {value[:40]!r}: expected STAGE=VALUE")
        out[key.strip()] = rest.strip()
    return out


def _int(text: str, option: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise InputError(f"{option} {text[:40]!r}: expected a whole number from 1 to 1024")
    return int(text)


@click.group("profile")
def profile_group() -> None:
    """Performance profiles for --target-rate (docs/rate-planning.md)."""


@profile_group.command("import")
@click.argument("results", nargs=-1, required=True)
@click.option("--gpu", multiple=True, metavar="NAME", help="The GPU type the runs used (the files do not say).  [required]")
@click.option("--model", multiple=True, metavar="NAME", help="The catalog pipeline. Default: the one whose Hub id is the files' model_id.")
@click.option("--stage", multiple=True, metavar="NAME", help="A stage-level entry: these runs measured this stage "
              "(the others had spare replicas). Default: the whole pipeline as one unit.")
@click.option("--devices", multiple=True, metavar="STAGE=I[,J]", help="The measured layout: a stage's GPUs. Default: GPU 0.")
@click.option("--replicas", multiple=True, metavar="STAGE=N", help="The measured layout: a stage's replicas. Default: 1.")
@click.option("--tp", multiple=True, metavar="N", help="tensor_parallel_size of the --stage measured. Default: 1.")
@click.option("--max-num-seqs", multiple=True, metavar="N", help="max_num_seqs it ran with. Default: not recorded.")
@click.option("--omni-version", multiple=True, metavar="X.Y", help="The vLLM-Omni version served. Default: unknown.")
@click.option("--dataset", multiple=True, metavar="NAME", help="The benchmark's dataset (the files do not say).")
@click.option("-o", "--output", multiple=True, metavar="FILE", help="Write the profile here (`-` is stdout).")
@click.option("--debug", is_flag=True)
def import_command(results, **o) -> None:
    """Build a profile from `vllm bench serve --omni --save-result` JSON files (one sweep)."""
    run_command(o["debug"], lambda: _import(results, o))


def _import(paths: tuple[str, ...], o: dict) -> int:
    from ..inputs.bench_import import build_entry, profile_of, read_result
    from ..inputs.catalog import model_catalog
    from ..inputs.gpus import lookup_gpu
    from ..inputs.perf_profile import PIPELINE_UNIT, dump_profile

    output = once(o["output"], "-o/--output")
    check_output_path(output)
    gpu = once(o["gpu"], "--gpu")
    if gpu is None:
        raise InputError("--gpu is required: the result files do not name the GPU type")
    gpu = lookup_gpu(gpu).name
    results = [read_result(p) for p in paths]
    model_ids = sorted({str(d["model_id"]) for d in results})
    if len(model_ids) > 1:
        raise InputError(f"the files are of several models ({', '.join(model_ids)}); import one sweep at a time")
    catalog = model_catalog()
    name = once(o["model"], "--model")
    if name is None:
        name = next((n for n, spec in catalog.items() if spec.hf_id == model_ids[0]), None)
        if name is None:
            raise InputError(f"model_id {model_ids[0]!r} is no catalog pipeline's Hub id; name one with --model")
    if name not in catalog:
        raise InputError(f"--model {name!r}: not in the catalog (see `omni-autoconf models`)")
    stages = [st.name for st in catalog[name].stages]
    unit = once(o["stage"], "--stage", PIPELINE_UNIT)
    for given in [unit] * (unit != PIPELINE_UNIT) + list(_pairs(o["devices"], "--devices")) + list(
            _pairs(o["replicas"], "--replicas")):
        if given not in stages:
            raise InputError(f"{given!r} is no stage of {name} ({', '.join(stages)})")
    devices = {s: tuple(_int(str(int(d) + 1) if d.strip().isdigit() else d, "--devices") - 1 for d in v.split(","))
               for s, v in _pairs(o["devices"], "--devices").items()}
    replicas = {s: _int(v, "--replicas") for s, v in _pairs(o["replicas"], "--replicas").items()}
    tp = once(o["tp"], "--tp")
    seqs = once(o["max_num_seqs"], "--max-num-seqs")
    entry = build_entry(list(paths), results, pipeline=name, stages=stages, gpu=gpu, unit=unit,
                        tp=_int(tp, "--tp") if tp else 1, max_num_seqs=_int(seqs, "--max-num-seqs") if seqs else None,
                        devices=devices, replicas=replicas,
                        omni_version=once(o["omni_version"], "--omni-version", "unknown"),
                        dataset=once(o["dataset"], "--dataset", "unknown"))
    write_output(output, dump_profile(profile_of([entry], f"{name} on {gpu}, imported from {len(paths)} file(s)")))
    return 0
