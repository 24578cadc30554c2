"""``dsv4ctl watch``: continuous known-answer probes, metrics and shipped alert rules.

Above :mod:`dsv4ctl.check` (it reuses the workload, the driver and the classifier) and
:mod:`dsv4ctl.runbook` (``--on-alert``), below :mod:`dsv4ctl.commands`. Its rules, dashboard
and systemd unit are shipped data (``dsv4ctl/data/watch/``)."""
