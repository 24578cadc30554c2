"""The SGLang server-argument tables, for the serve job's modules: they live in
:mod:`dsv4ctl.plan.argtable` (one home), which the start-up validation shared by plan, lint, the
preflight and ``config set`` (:mod:`dsv4ctl.plan.startup`) reads."""

from __future__ import annotations

from ..plan.argtable import (DATA, TABLE_PATH, Arg, ConvertError, Table, convert, load_table,  # noqa: F401
                             table_for, table_path)
