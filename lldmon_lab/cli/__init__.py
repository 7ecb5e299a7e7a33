"""The `lldmon` commands of the experiment tooling (`lab`, `eval`, `demo`). `monitor.cli` finds them
through the `lldmon.commands` entry points, so `monitor` never imports this package."""
