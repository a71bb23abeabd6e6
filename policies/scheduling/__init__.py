"""Scheduling order: which waiting request is admitted first (and, for `priority`, which
running request is preempted first). A sixth policy family, named by `--scheduling-policy`.

Every order is a small class registered under family "scheduling" (`kvlab policies` lists
them) and named by a spec `NAME[:key=value,...]` (`kvlab.policies.scheduling.spec`). The
scheduler asks an order to arrange its waiting queue before it admits from it each step;
`fcfs` (the default) arranges nothing, so the scheduler then runs exactly as it always has.
"""

from __future__ import annotations

from kvlab.policies.scheduling import fcfs, lpm, priority, sjf  # noqa: F401  (registers them)
