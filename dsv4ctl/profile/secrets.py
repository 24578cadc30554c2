"""What counts as a secret in a profile or serve config: the one rule every output masks by."""

from __future__ import annotations

import re

_SECRET_NAME = re.compile(r"(secret|password|passwd|credential)|((^|[-_.])(api[-_]?key|access[-_]?key|private[-_]?key"
                          r"|auth[-_]?key|token|pwd))$", re.I)

def is_secret_key(name: str) -> bool:
    """True for a key whose value must not be shown: ``api-key``, ``admin-api-key``,
    ``ssl-keyfile-password``, anything with secret/password/credential, or ending in
    ``token``/``access-key``/``private-key`` (``max-total-tokens``, ``routing-key`` are not secret)."""
    return bool(_SECRET_NAME.search(name))


def secret_strings(data) -> set[str]:
    """Every value (as a string, 4+ characters) under a secret key anywhere in ``data`` (nested
    mappings and lists, and JSON documents held in string values such as
    ``hicache-storage-backend-extra-config``): what no output may show."""
    import json
    out: set[str] = set()

    def walk(x, secret: bool) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, secret or is_secret_key(str(k)))
        elif isinstance(x, list):
            for v in x:
                walk(v, secret)
        elif isinstance(x, str) and not secret and x.lstrip().startswith(("{", "[")):
            try:
                walk(json.loads(x), False)
            except ValueError:
                pass
        elif secret and x is not None and not isinstance(x, bool) and len(str(x)) >= 4:
            out.add(str(x))
    walk(data, False)
    return out
