"""What every command shares: strict value parsing, one-line errors, exit codes, output.

Exit codes (errors.py): 0 success; 1 no plan / a problem predicted; 2 no answer (invalid
input or an internal error); 130 interrupted; 143 terminated (SIGTERM). Every error is one
line on stderr; the traceback only with --debug.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable

import click

from ..errors import (
    EXIT_NO_ANSWER,
    AutoconfError,
    InputError,
    NoPlanError,
)
from . import interrupts




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
    """One line, exit 130 (143 for SIGTERM), at once. os._exit: a CP-SAT search stopped
    midway leaves native threads that abort the process in its exit handlers (seen with
    OR-Tools 9.15), and nothing is left to flush but the standard streams."""
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    finally:
        sys.stderr.write(interrupts.message() + "\n")
        sys.stderr.flush()
        os._exit(interrupts.exit_code())


def one_line(text: str) -> str:
    return " ".join(text.split())


class OneLineErrors(click.Group):
    """A click group whose usage errors are one line (not click's usage block) and whose
    interrupts end with exit 130 (143 for SIGTERM)."""

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


def _no_plan_text(exc: NoPlanError) -> str:
    from ..planning.fixes import FIX_KINDS

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


def report_no_plan(exc: NoPlanError, fmt: str) -> None:
    from ..emit.summary import no_plan_dict

    if fmt == "json":
        click.echo(json.dumps(no_plan_dict(exc), indent=2))
    click.echo(_no_plan_text(exc), err=True, nl=False)


def attach_fixes(exc: NoPlanError, request, quiet: bool) -> None:
    """Search fixes for a proven-infeasible request (not for `unknown`: nothing was proven)."""
    from ..planning.fixes import propose_fixes

    if exc.status != "infeasible":
        return
    if not quiet:
        click.echo(f"omni-autoconf: no plan; searching for fixes, each proven by re-solving (at most "
                   f"{request.time_limit_s:g} s) ...", err=True)
    exc.fixes, exc.fix_search_note = propose_fixes(request)


