"""SSH connection failures in the operator's words (issue 18): no library class names, no
``[Errno None]``; and a dry run never writes known_hosts (issue 13)."""

from __future__ import annotations

import errno
import socket

import pytest

from dsv4ctl.errors import RemoteError
from dsv4ctl.remote.ssh import SSHTransport, connect_reason
from tests.hostile.server import closed_port


def test_connection_refused_is_one_operator_line(tmp_path):
    # Before: "h: cannot connect to 127.0.0.1:P: NoValidConnectionsError: [Errno None] Unable to
    # connect to port P on 127.0.0.1"
    port = closed_port()
    t = SSHTransport("h", "127.0.0.1", port=port, known_hosts=str(tmp_path / "kh"), connect_timeout=3)
    with pytest.raises(RemoteError) as e:
        t.run("true")
    assert str(e.value) == f"h: cannot connect to 127.0.0.1:{port} (connection refused)"
    assert e.value.exit_code == 3 and not (tmp_path / "kh").exists()


def test_connect_reason_words():
    from paramiko.ssh_exception import NoValidConnectionsError
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
    both = NoValidConnectionsError({("127.0.0.1", 22): refused, ("::1", 22, 0, 0): refused})
    assert connect_reason(both) == "connection refused"
    mixed = NoValidConnectionsError({("10.0.0.1", 22): refused,
                                     ("::1", 22, 0, 0): OSError(errno.ENETUNREACH, "x")})
    assert connect_reason(mixed) == "connection refused; network is unreachable"
    assert connect_reason(socket.timeout("timed out"), 10) == "timed out after 10 s"
    assert connect_reason(socket.gaierror(socket.EAI_NONAME, "Name or service not known")) == \
        "cannot resolve the name: name or service not known"
    from paramiko.ssh_exception import SSHException
    assert connect_reason(SSHException("Error reading SSH protocol banner")) == \
        "not an SSH server? (Error reading SSH protocol banner)"
    assert connect_reason(EOFError()) == "EOFError"
