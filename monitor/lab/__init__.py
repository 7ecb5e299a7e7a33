"""Collapse lab: grids of real GRPO search-agent runs (examples/search_r1_grpo.py, as subprocesses)
streaming to one lldmon service, with a mechanical collapse label and a summary per setting.

Modules: `labels` (the collapse rule, pure), `grid` (settings, presets, grid files), `results` (records
and summaries, pure), `runner` (processes, service, progress), `cli` (`lldmon lab`). Never imports
torch: the training runs in separate processes.
"""

from monitor.lab.labels import sustained_collapse_step

__all__ = ["sustained_collapse_step"]
