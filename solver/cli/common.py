"""What every command shares: strict value parsing, one-line errors, exit codes, output.

Exit codes (errors.py): 0 success; 1 no plan / a problem predicted; 2 no answer (invalid
input or an internal error); 130 interrupted. Every error is one line on stderr; the
traceback only with --debug.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Callable, TypeVar

import click

from .. import defaults as D
from ..errors import (
    EXIT_INTERRUPTED,
    EXIT_NO_ANSWER,
    AutoconfError,
    InputError,
    NoPlanError,
)
from . import interrupts

T = TypeVar("T")

# ASCII only: Python's int() and float() also accept full-width and other Unicode digits.
_INT = re.compile(r"[+-]?[0-9]{1,12}")
_FLOAT = re.compile(r"[+-]?([0-9]{1,12}(\.[0-9]{0,17})?|\.[0-9]{1,17})([eE][+-]?[0-9]{1,3})?")


def parse_int(text: str, what: str) -> int:
    if not _INT.fullmatch(text.strip()):
        raise InputError(f"{what}: {text!r} is not a whole number")
    return int(text.strip())


def parse_float(text: str, what: str) -> float:
    if not _FLOAT.fullmatch(text.strip()):
        raise InputError(f"{what}: {text!r} is not a number")
    value = float(text.strip())
    if value != value or value in (float("inf"), float("-inf")):
        raise InputError(f"{what}: {text!r} is not a finite number")
    return value + 0.0  # -0.0 -> 0.0; the range check says what a negative value may not be


def bounded(value: T, lo, hi, what: str) -> T:
    if not lo <= value <= hi:
        raise InputError(f"{what}: {value} is out of range [{lo}, {hi}]")
    return value


def per_stage(option: str, values: tuple[str, ...], pipeline, cast: Callable[[str, str], T], limits, *,
              kv_only: bool = False, allow_global: bool = True) -> tuple[dict[str, T], T | None]:
    """Parse `N` (every stage) and `STAGE=N` terms (STAGE: name or id), joined by commas or
    given as repeated options, into ({stage name: value}, global value or None).

    A stage given twice, or two global values, is a conflict (an error, not last-wins)."""
    what = f"--{option}"
    out: dict[str, T] = {}
    everything: T | None = None
    for text in values:
        for term in text.split(","):
            term = term.strip()
            if not term:
                raise InputError(f"{what}: empty term in {text!r}")
            key, sep, raw = term.rpartition("=")
            value = bounded(cast(raw, what), *limits, what)
            if sep:
                stage = pipeline.stage(key.strip())
                if kv_only and not stage.has_kv_cache:
                    raise InputError(f"{what} {term}: {stage.name} has no KV cache, so it has no {option}")
                if stage.name in out:
                    raise InputError(f"{what}: {stage.name} is given twice ({out[stage.name]} and {value})")
                out[stage.name] = value
            elif not allow_global:
                raise InputError(f"{what}: expected STAGE=VALUE, got {term!r}")
            elif everything is not None:
                raise InputError(f"{what}: given twice for every stage ({everything} and {value})")
            else:
                everything = value
    return out, everything


def expand_global(values: dict[str, T], everything: T | None, pipeline, *, kv_only: bool) -> dict[str, T]:
    """A global value set on every (KV) stage that has no value of its own."""
    out = dict(values)
    if everything is not None:
        for st in pipeline.stages:
            if st.has_kv_cache or not kv_only:
                out.setdefault(st.name, everything)
    return out


def run_command(debug: bool, action: Callable[[], int], on_no_plan: Callable[[NoPlanError], None] | None = None) -> None:
    """Run `action`, turning every outcome into one exit code and, on error, one line."""
    def traceback_if(wanted: bool) -> None:
        """--debug: the traceback too, with the exit code the error has without it."""
        if wanted:
            import traceback

            traceback.print_exc()

    try:
        code = action()
    except NoPlanError as exc:
        traceback_if(debug)
        if on_no_plan is not None:
            on_no_plan(exc)
        sys.exit(exc.exit_code)
    except AutoconfError as exc:
        traceback_if(debug)
        click.echo(f"omni-autoconf: error: {one_line(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        exit_interrupted()
    except OSError as exc:
        traceback_if(debug)
        click.echo(f"omni-autoconf: error: {one_line(str(exc) or type(exc).__name__)}", err=True)
        sys.exit(EXIT_NO_ANSWER)
    except Exception as exc:  # a bug: say so in one line, keep the traceback for --debug
        if interrupts.received():  # an interrupt Python turned into another exception
            exit_interrupted()
        traceback_if(debug)
        click.echo(f"omni-autoconf: internal error: {type(exc).__name__}: {one_line(str(exc))} "
                   "(a bug; re-run with --debug and report it)", err=True)
        sys.exit(EXIT_NO_ANSWER)
    sys.exit(code)


def exit_interrupted() -> None:
    """One line, exit 130, at once. os._exit: a CP-SAT search stopped midway leaves native
    threads that abort the process in its exit handlers (seen with OR-Tools 9.15), and
    nothing is left to flush but the standard streams."""
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    finally:
        sys.stderr.write(interrupts.message() + "\n")
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)


def one_line(text: str) -> str:
    return " ".join(text.split())


class OneLineErrors(click.Group):
    """A click group whose usage errors are one line (not click's usage block) and whose
    interrupts end with exit 130."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            click.echo(f"omni-autoconf: error: {one_line(exc.format_message())} (see --help)", err=True)
            sys.exit(EXIT_NO_ANSWER)
        except (click.Abort, KeyboardInterrupt):
            exit_interrupted()


def once(values: tuple[str, ...], option: str, default: str | None = None) -> str | None:
    """The value of an option that may be given at most once (repeats are conflicts)."""
    if len(values) > 1:
        raise InputError(f"{option} is given {len(values)} times ({', '.join(values)}); give it once")
    return values[0] if values else default


def gpus_option(text: str, nodes: int | None = None, hosts: bool = True):
    """The inventory of --gpus (and --nodes); `hosts=False` for commands that judge one host."""
    from ..inputs.gpus import node_names, parse_inventory

    if text.strip().lower() == "local":
        if nodes is not None:
            raise InputError("--gpus local reads this host only; with --nodes name the GPUs of one host")
        from ..inputs.nvml import read_local_gpus

        return tuple(read_local_gpus())
    gpus = tuple(parse_inventory(text, nodes))
    if not hosts and len(node_names(gpus)) > 1:
        raise InputError("--gpus names several hosts, but this command judges the pipeline of one host: give that "
                         "host's GPUs (e.g. --gpus 4xH100-80GB)")
    return gpus


def _no_plan_text(exc: NoPlanError) -> str:
    from ..plan.fixes import FIX_KINDS

    word = "no plan" if exc.status == "infeasible" else "no plan found (status unknown)"
    lines = [f"omni-autoconf: {word}: {exc.message}"]
    lines += [f"  - {r}" for r in exc.reasons]
    if exc.status != "infeasible":
        return "\n".join(lines) + "\n"
    if exc.fixes:
        lines.append("Fixes, each proven to give a plan (smallest change first):")
        for f in exc.fixes:
            lines.append(f"  * {f.summary}:")
            lines.append(f"      {f.command}")
    else:
        lines.append(f"No fix within the fix list ({FIX_KINDS}) gives a plan.")
    if exc.fix_search_note:
        lines.append(exc.fix_search_note)
    return "\n".join(lines) + "\n"


def no_plan_dict(exc: NoPlanError) -> dict:
    """A failed plan as data (`--format json`): status "infeasible" or "unknown"."""
    from ..plan.fixes import FIX_KINDS

    out = {"status": exc.status, "message": exc.message, "reasons": exc.reasons}
    if exc.status == "infeasible":
        out.update({"conflict": exc.conflict, "fixes": [f.as_dict() for f in exc.fixes], "fixes_tried": FIX_KINDS,
                    "fix_search_note": exc.fix_search_note})
    return out


def report_no_plan(exc: NoPlanError, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(no_plan_dict(exc), indent=2))
    click.echo(_no_plan_text(exc), err=True, nl=False)


def attach_fixes(exc: NoPlanError, request, quiet: bool) -> None:
    """Search fixes for a proven-infeasible request (not for `unknown`: nothing was proven)."""
    from ..plan.fixes import propose_fixes

    if exc.status != "infeasible":
        return
    if not quiet:
        click.echo(f"omni-autoconf: no plan; searching for fixes, each proven by re-solving (at most "
                   f"{request.time_limit_s:g} s) ...", err=True)
    exc.fixes, exc.fix_search_note = propose_fixes(request)


def exclusive_groups(values: tuple[str, ...], pipeline) -> tuple[tuple[str, ...], ...]:
    groups = []
    for text in values:
        names = [pipeline.stage(k.strip()).name for k in text.split(",") if k.strip()]
        if len(names) < 2 or len(set(names)) != len(names):
            raise InputError(f"--exclusive {text!r}: name at least two different stages, e.g. thinker,code2wav")
        groups.append(tuple(names))
    return tuple(groups)


def time_limit_option(text: str) -> float:
    return bounded(parse_float(text, "--time-limit"), D.MIN_TIME_LIMIT_S, D.MAX_TIME_LIMIT_S, "--time-limit")


def calibration_option(path: str | None, pipeline, version, gpus):
    if path is None:
        return None
    from ..memory.calibration import load

    cal = load(path, [st.name for st in pipeline.stages])
    if cal.model != pipeline.name:
        raise InputError(f"--calibration {path}: measured for {cal.model}, not {pipeline.name}")
    # It holds for the vLLM-Omni version it was measured on (the memory accounting
    # differs by version) and, for its non-torch and graph terms, the GPU.
    if cal.omni_version != version.name:
        raise InputError(f"--calibration {cal.path}: measured on vLLM-Omni {cal.omni_version}, planning for "
                         f"{version.name}: calibrate a start-up log of {version.name} (or pass --omni-version "
                         f"{cal.omni_version})")
    kinds = sorted({g.name for g in gpus})
    if cal.gpu not in kinds:
        raise InputError(f"--calibration {cal.path}: measured on {cal.gpu}, planning for {', '.join(kinds)}: "
                         "calibrate a start-up log of those GPUs")
    return cal
