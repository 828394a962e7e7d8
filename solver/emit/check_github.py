"""`check --format github`: each predicted problem as a GitHub Actions workflow command, which the
runner shows as an annotation on the file and line ("Workflow commands for GitHub Actions",
https://docs.github.com/en/actions/reference/workflow-commands-for-github-actions: `::warning
file={name},line={line},title={title}::{message}`, and `::error`, `::notice` alike). Pure: report -> text.

The message escapes `%`, CR and LF, a property also `:` and `,`, as the Actions toolkit does
(https://github.com/actions/toolkit/blob/main/packages/core/src/command.ts escapeData, escapeProperty),
so no text of the file can end a command or start another."""

from __future__ import annotations

from ..planning.check import CheckReport


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _command(level: str, path: str, line: int, title: str, message: str) -> str:
    return (f"::{level} file={escape_property(path)},line={line},title={escape_property(title)}::"
            f"{escape_data(message)}")


def render_check_github(report: CheckReport) -> str:
    """One annotation per problem: at the key's line (unknown-key), else at its stage's entry,
    a GPU's problem at the first stage placed on that GPU, a file's at line 1; a notice when
    none is predicted."""
    path = report.config.path
    entry = {st.stage_id: st.line for st in report.config.stages}
    first_on: dict[int, int | None] = {}
    for o in sorted(report.stages, key=lambda o: o.run.stage_id):
        for d in o.run.devices:
            first_on.setdefault(d, entry.get(o.run.stage_id))
    out = []
    for p in report.problems:
        line = p.line or (first_on.get(p.gpu) if p.gpu is not None else None) or 1
        where = " ".join(x for x in (p.stage or "", f"GPU {p.gpu}" if p.gpu is not None else "") if x)
        out.append(_command("error" if p.severity == "error" else "warning", path, line,
                            f"{p.code} ({where})" if where else p.code, p.message))
    if not report.problems:
        out.append(_command("notice", path, 1, "omni-autoconf check",
                            f"starts with no predicted problem on vLLM-Omni {report.version.name}"))
    return "".join(line + "\n" for line in out)
