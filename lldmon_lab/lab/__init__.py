"""Collapse lab: grids of real GRPO search-agent runs (examples/search_r1_grpo.py, as subprocesses)
streaming to one lldmon service, labelled by the one collapse rule (`lldmon_lab.labels`), with a
summary per setting and recorded runs as fixtures.

Modules: `grid` (settings, presets, grid files), `results` (records and summaries, pure), `runner`
(processes, service, progress), `fixtures` (recorded runs for tests and `lldmon eval`); `lldmon lab`
is `lldmon_lab.cli.lab`. Never imports torch: the training runs in separate processes.
"""
