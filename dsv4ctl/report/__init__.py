"""Pictures of dsv4ctl's results: one self-contained HTML file of inline SVG charts and tables
(``dsv4ctl report``), the terminal memory bar and corruption sparkline, and CSV exports.

Pure builders from dsv4ctl's own JSON documents (kind told by their ``schema`` field) to SVG,
HTML, text and CSV strings; :mod:`.inputs` is the only module that reads files. No plotting
library: the SVG is written directly, so nothing here costs start-up time.

* :mod:`.svg` — SVG primitives, palette, axis ticks
* :mod:`.memory` — a plan rank as stacked GiB segments (chart, terminal bar and CSV share it)
* :mod:`.charts` — one builder per chart
* :mod:`.page` — the HTML page: header (inputs, versions, time), one section per input
* :mod:`.terminal` — ``plan``'s memory bar, ``check load``'s sparkline
* :mod:`.csvout` — ``plan --csv``, ``check load --csv`` / ``--turns-csv``
* :mod:`.inputs` — read and classify input files
"""

from __future__ import annotations

#: ``schema`` field -> input kind. Fields are only added within a schema version, so a
#: builder written for /1 reads every /1 document.
KINDS = {
    "dsv4ctl.plan/1": "plan",
    "dsv4ctl.plan/2": "plan",     # /2 changed what headroom_gib counts; the fields the report reads are in both
    "dsv4ctl.check.load/1": "load",
    "dsv4ctl.check.smoke/1": "smoke",
    "dsv4ctl.incident/1": "incident",
    "dsv4ctl.plan-log/1": "plan-log",
}


def kind_of(doc: object) -> str:
    """The input kind of a parsed JSON document (``plan``, ``load``, ``smoke``, ``incident``,
    ``plan-log``). ValueError (one line) for anything else."""
    if not isinstance(doc, dict):
        raise ValueError("not a dsv4ctl JSON document (expected an object with a 'schema' field)")
    schema = doc.get("schema")
    if schema in KINDS:
        return KINDS[schema]
    if not isinstance(schema, str):
        raise ValueError("no 'schema' field: not a dsv4ctl JSON document")
    known = ", ".join(sorted(KINDS))
    raise ValueError(f"schema {schema!r} is not one dsv4ctl report draws (known: {known})")
