"""`check --format junit`: a JUnit XML report for CI systems that read one (GitLab, Jenkins,
Azure Pipelines): one testsuite per checked file, one testcase per stage, a failure for each
stage with a predicted error (with --strict, a warning too), warnings in its system-out.
Pure: reports -> text. A problem of a GPU belongs to the stages placed on it, a problem of the
whole file (a schema, a top-level key) to every stage."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ..planning.check import CheckReport

# characters XML 1.0 does not allow (https://www.w3.org/TR/xml/#charsets): shown escaped
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _belongs(p, o) -> bool:
    if p.stage is not None:
        return p.stage in (o.run.name, f"stage{o.run.stage_id}")
    return p.gpu is None or p.gpu in o.run.devices


def check_suite(report: CheckReport, strict: bool = False) -> ET.Element:
    path = _text(report.config.path)
    suite = ET.Element("testsuite", name=f"omni-autoconf check {path}", errors="0", skipped="0", time="0")
    failures = 0
    for o in sorted(report.stages, key=lambda o: o.run.stage_id):
        case = ET.SubElement(suite, "testcase", name=f"{o.run.stage_id} {o.run.name}", classname=path, time="0")
        mine = [p for p in report.problems if _belongs(p, o)]
        failing = [p for p in mine if p.severity == "error" or strict]
        if failing:
            failures += 1
            failure = ET.SubElement(case, "failure", type=failing[0].code, message=_text(failing[0].message))
            failure.text = _text("".join(f"[{p.code}] {p.message}\n" for p in failing))
        warnings = [p for p in mine if p.severity != "error"]
        if warnings:
            ET.SubElement(case, "system-out").text = _text("".join(f"warning: [{p.code}] {p.message}\n" for p in warnings))
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    return suite


def render_check_junit(reports: list[CheckReport], strict: bool = False) -> str:
    """One file: its testsuite; several: a testsuites element holding one each."""
    if len(reports) == 1:
        root = check_suite(reports[0], strict)
    else:
        root = ET.Element("testsuites", name="omni-autoconf check")
        root.extend(check_suite(r, strict) for r in reports)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
