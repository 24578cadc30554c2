"""JOB diagnose: why is a server group not serving? Collected evidence (server log tail, process
state, nvidia-smi, /health, /server_info, /metrics deltas) classified by pure rules
(:mod:`.rules`), each finding citing its evidence line and the public report it follows, and
naming the runbook to run. Collection over SSH/HTTP lives in :mod:`.collect`."""
