"""Real OpenSSH sshd processes for the remote/deploy tests (see harness.py)."""
