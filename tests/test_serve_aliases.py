"""The serve-config alias map is SGLang 0.5.23's own: every argparse alias of the shipped argument
table (dsv4ctl/data/server_args-0.5.23.json) but the ``no-X`` negations of boolean options."""

from __future__ import annotations

import json

from dsv4ctl.profile.serveconfig import ALIASES, canonical
from tests.conftest import REPO


def test_aliases_are_the_tables():
    table = json.loads((REPO / "dsv4ctl/data/server_args-0.5.23.json").read_text())
    want = {al: a["name"] for a in table["arguments"] for al in a["aliases"] if not al.startswith("no-")}
    assert ALIASES == want
    assert canonical("attention-data-parallel-size") == "attn-dp-size"
    assert canonical("nccl-init-addr") == "dist-init-addr" and canonical("tp-size") == "tp-size"
