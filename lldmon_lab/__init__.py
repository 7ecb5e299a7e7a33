"""lldmon's experiment tooling: the detector's evaluation harness, its labelled runs and the tools that
make them, kept apart from the service so that `monitor` ships the detector and nothing that scores it.

- `labels`: the one collapse rule (the label of a run); `scenarios`: generated labelled GRPO runs;
  `replay`: a run as a trainer that logs every few steps would send it.
- `evaluation` (`lldmon eval`): the detector scored on labelled runs, per source; `eval_harder`: the
  false-critical budget of the controls; `run_labels`: the labels file of real runs (`eval_labels/`).
- `lab` (`lldmon lab`): grids of real GRPO runs streaming to one service, and their fixtures.
- `demo` (`lldmon demo`): the service, a real GRPO agent on CPU and a replayed collapse.
- `cli`: those commands, registered with `lldmon` through the `lldmon.commands` entry points.

Depends on `monitor`, never the reverse. Never imports torch: trainings run in separate processes.
"""
