"""The lab's grid: seeds x settings, from presets, a TOML/JSON grid file and command-line lists.

A `Setting` is everything that defines one training run except its seed; a `RunSpec` is a setting and
a seed. `GridSpec` holds one list per axis (learning rate, steps per rollout batch, group size,
`num_iterations`, completion length, reward design, KL coefficient beta, LLDS mode, LLDS lambda) and
the fixed options (model, steps, warm-up, batch size, extra script flags); `expand` takes their cross
product.

Reward designs (`REWARD_DESIGNS`, the script's `--reward-design`; `reward_setup` there computes them):
`exact` (exact match, 0/1: the script's default), `composite` (format + exact match, 0..2), `penalty`
(exact match - 0.1 per invalid action), `centred` (exact match minus a running baseline) and `success`
(the share of the trajectory's actions that succeeded). A setting's key names the design and beta only
when they are not the defaults (`exact`, beta 0), so the keys of runs made before these axes existed,
and the fixtures named by them, stay what they were.

Layering, later wins: `PRESETS[name]` < grid file < command-line options. The regimes' settings were
found with the lab itself (README "Collapse lab"); edit `PRESETS` (one place) as more seeds come in.

LLDS modes and what they pass to `examples/search_r1_grpo.py`:
- `off`:  `--llds off --policy alert` (lldmon watches and alerts; nothing is switched on);
- `on`:   `--llds on --llds-lambda L --policy alert` (static LLDS from step 0, the paper's setting);
- `auto`: `--llds auto --policy auto` (the detector's directive switches LLDS on; `--llds-lambda L` if
  given);
- `heal`: `--llds auto --policy heal` (`auto`, plus a rollback to the last healthy checkpoint on a
  collapse critical; `--llds-lambda L` if given).
A setting's `policy` overrides the policy above (`MODE_POLICY`). The policies a setting accepts are the
service's directive policies (`contracts.wire.DIRECTIVE_POLICIES`) and those of the modes, so a mode's
policy is valid here whatever that list holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import tomllib

from contracts.wire import DIRECTIVE_POLICIES

__all__ = [
    "AXES",
    "LLDS_MODES",
    "MODE_POLICY",
    "PRESETS",
    "GridError",
    "GridSpec",
    "RunSpec",
    "Setting",
    "expand",
    "load_grid_file",
    "parse_list",
    "resolve_grid",
]

LLDSMode = Literal["off", "on", "auto", "heal"]
LLDS_MODES: Final[tuple[LLDSMode, ...]] = ("off", "on", "auto", "heal")
MODE_POLICY: Final[Mapping[str, str]] = {"off": "alert", "on": "alert", "auto": "auto", "heal": "heal"}
"""The directive policy (`--policy`) of each LLDS mode when a setting names none."""
_SCRIPT_LLDS: Final[Mapping[str, str]] = {"off": "off", "on": "on", "auto": "auto", "heal": "auto"}
"""The script's `--llds` of each mode: `heal` is `auto` with another policy."""
REWARD_DESIGNS: Final = ("exact", "composite", "penalty", "centred", "success")
"""The script's `--reward-design` choices (its `REWARD_DESIGNS`; a test checks they agree)."""
REWARD_FLOORS: Final[dict[str, float]] = {"exact": 0.0, "composite": 0.0, "success": 0.0}
"""The floor of each design whose floor is fixed (the detector's `reward_floor`, declared for its runs as a
user would): the lowest reward a batch can score. `penalty` (its floor depends on the number of invalid
actions) and `centred` (signed around a moving baseline) have none: they are judged scale-free."""
DEFAULT_REWARD_DESIGN: Final = "exact"
POLICIES: Final = tuple(dict.fromkeys((*DIRECTIVE_POLICIES, *MODE_POLICY.values())))
"""Policies a setting accepts: the service's, and every mode's own (module docstring)."""


class GridError(ValueError):
    """A grid that cannot be built; the message says which key or value is wrong."""


@dataclass(frozen=True)
class Setting:
    """One training configuration (everything but the seed). None: the script's default."""

    model: str = "tiny"
    steps: int = 400
    warmup_steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    steps_per_generation: int = 2
    num_generations: int = 4
    num_iterations: int | None = None
    """Passed as `--num-iterations` only when set; the script must support it (checked at start)."""
    max_completion_length: int = 96
    llds: LLDSMode = "off"
    llds_lambda: float | None = None
    policy: str | None = None
    """lldmon directive policy; None: from the LLDS mode (module docstring)."""
    reward_design: str = DEFAULT_REWARD_DESIGN
    beta: float | None = None
    """KL coefficient (`--beta`); None: the script's default, 0 (a 0 given is stored as None)."""
    extra: tuple[str, ...] = ()
    """More script flags, verbatim (e.g. `--temperature`, `1.2`)."""

    def __post_init__(self) -> None:
        if self.llds not in LLDS_MODES:
            raise GridError(f"llds must be one of {', '.join(LLDS_MODES)}, not {self.llds!r}")
        if self.policy is not None and self.policy not in POLICIES:
            raise GridError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        for name in ("steps", "steps_per_generation", "num_generations", "max_completion_length"):
            if int(getattr(self, name)) < 1:
                raise GridError(f"{name} must be >= 1")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise GridError("warmup_steps must be >= 0")
        if self.lr is not None and not self.lr > 0:
            raise GridError("lr must be > 0")
        if self.reward_design not in REWARD_DESIGNS:
            raise GridError(
                f"reward_design must be one of {', '.join(REWARD_DESIGNS)}, not {self.reward_design!r}"
            )
        if self.beta is not None:
            if not self.beta >= 0:
                raise GridError("beta must be >= 0")
            if self.beta == 0:
                # beta 0 is the script's default: one setting, one key
                object.__setattr__(self, "beta", None)

    @property
    def effective_policy(self) -> str:
        if self.policy is not None:
            return self.policy
        return MODE_POLICY[self.llds]

    @property
    def key(self) -> str:
        """A short, stable name for the setting (part of run names and file names)."""
        parts = [
            _slug(self.model),
            f"lr{_num(self.lr)}",
            f"spg{self.steps_per_generation}",
            f"g{self.num_generations}",
        ]
        if self.num_iterations is not None:
            parts.append(f"it{self.num_iterations}")
        parts.append(f"len{self.max_completion_length}")
        if self.reward_design != DEFAULT_REWARD_DESIGN:
            parts.append(f"rw-{self.reward_design}")
        if self.beta is not None:
            parts.append(f"beta{_num(self.beta)}")
        llds = f"llds-{self.llds}"
        if self.llds_lambda is not None:
            llds += _num(self.llds_lambda)
        parts.append(llds)
        if self.policy is not None:
            parts.append(f"pol-{self.policy}")
        parts.append(f"n{self.steps}")
        if self.warmup_steps is not None:
            parts.append(f"wu{self.warmup_steps}")
        if self.batch_size is not None:
            parts.append(f"bs{self.batch_size}")
        if self.extra:
            parts.append("x" + hashlib.sha256("\0".join(self.extra).encode()).hexdigest()[:8])
        return "_".join(parts)

    def script_args(self) -> list[str]:
        """Flags of `examples/search_r1_grpo.py` for this setting (no seed, service or output)."""
        args = ["--model", self.model, "--steps", str(self.steps)]
        if self.warmup_steps is not None:
            args += ["--warmup-steps", str(self.warmup_steps)]
        if self.batch_size is not None:
            args += ["--batch-size", str(self.batch_size)]
        if self.lr is not None:
            args += ["--lr", repr(self.lr)]
        args += [
            "--steps-per-generation",
            str(self.steps_per_generation),
            "--num-generations",
            str(self.num_generations),
        ]
        if self.num_iterations is not None:
            args += ["--num-iterations", str(self.num_iterations)]
        args += ["--max-completion-length", str(self.max_completion_length)]
        if self.reward_design != DEFAULT_REWARD_DESIGN:
            args += ["--reward-design", self.reward_design]
        if self.beta is not None:
            args += ["--beta", repr(self.beta)]
        args += ["--llds", _SCRIPT_LLDS[self.llds], "--policy", self.effective_policy]
        if self.llds_lambda is not None and self.llds != "off":
            args += ["--llds-lambda", repr(self.llds_lambda)]
        return args + list(self.extra)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["extra"] = list(self.extra)
        out["policy"] = self.effective_policy
        return out


@dataclass(frozen=True)
class RunSpec:
    setting: Setting
    seed: int

    @property
    def key(self) -> str:
        return f"{self.setting.key}_s{self.seed}"


@dataclass(frozen=True)
class GridSpec:
    """Axes (tuples, crossed) and fixed options of a grid."""

    seeds: tuple[int, ...] = (0,)
    lr: tuple[float | None, ...] = (None,)
    steps_per_generation: tuple[int, ...] = (2,)
    num_generations: tuple[int, ...] = (4,)
    num_iterations: tuple[int | None, ...] = (None,)
    max_completion_length: tuple[int, ...] = (96,)
    reward_design: tuple[str, ...] = (DEFAULT_REWARD_DESIGN,)
    beta: tuple[float | None, ...] = (None,)
    llds: tuple[LLDSMode, ...] = ("off",)
    llds_lambda: tuple[float | None, ...] = (None,)
    model: str = "tiny"
    steps: int = 400
    warmup_steps: int | None = None
    batch_size: int | None = None
    policy: str | None = None
    extra: tuple[str, ...] = field(default=())


AXES: Final = (
    "seeds",
    "lr",
    "steps_per_generation",
    "num_generations",
    "num_iterations",
    "max_completion_length",
    "reward_design",
    "beta",
    "llds",
    "llds_lambda",
)
"""GridSpec fields that are lists (crossed); the others are fixed for the whole grid."""
_FIELDS: Final = {f.name for f in dataclasses.fields(GridSpec)}
_INT_AXES: Final = {
    "seeds",
    "steps_per_generation",
    "num_generations",
    "num_iterations",
    "max_completion_length",
}
_FLOAT_AXES: Final = {"lr", "llds_lambda", "beta"}
_NONE_WORDS: Final = {"none", "default", "-"}


PRESETS: Final[Mapping[str, Mapping[str, Any]]] = {
    # Smoke test: two short runs (LLDS off and auto), seconds of warm-up; < 1 minute on 2 cores.
    "quick": {
        "seeds": [0],
        "llds": ["off", "auto"],
        "steps": 6,
        "warmup_steps": 30,
        "steps_per_generation": [2],
    },
    # Regimes of the tiny model, measured with this lab (README "Collapse lab": rates over seeds).
    # healthy: 0 of 5 seeds collapsed in 400 steps (best 10-step reward 0.45-0.73); 0 of 12 in 300 steps
    # at lr 3e-4 / 5e-4 with 2 or 4 steps per rollout batch.
    "healthy": {"seeds": [0, 1, 2, 3, 4], "steps": 400, "lr": [3e-4], "steps_per_generation": [2]},
    # late: lr 7e-4, 4 steps per rollout batch: 3 of 5 seeds collapsed (steps 93, 309, 341) in the
    # recorded runs; in one lab session over seeds 0-4, LLDS off 2/5, static on 0/5, auto 0/5 (README
    # "Collapse lab"). Five seeds cannot separate the arms (one-sided Fisher p ~0.22 for 2/5 vs 0/5), so
    # 20 seeds x off / static on / auto / heal (80 runs; resumable over sessions).
    "late": {
        "seeds": list(range(20)),
        "steps": 400,
        "lr": [7e-4],
        "steps_per_generation": [4],
        "llds": ["off", "on", "auto", "heal"],
        "llds_lambda": [0.2],
    },
    # early: lr 1e-3, 4 steps per rollout batch: 5 of 5 seeds collapsed at steps 13-21 (reward ~0.3 -> 0)
    # with LLDS off. 10 seeds x off / static on / auto / heal (40 runs): whether anything helps when
    # the run is dead before phase-II evidence can exist.
    "early": {
        "seeds": list(range(10)),
        "steps": 80,
        "lr": [1e-3],
        "steps_per_generation": [4],
        "llds": ["off", "on", "auto", "heal"],
    },
}
"""Named grids (same keys as a grid file). Edit here when the regimes are found."""


def parse_list(text: str, kind: type[int] | type[float] | type[str]) -> list[Any]:
    """'1e-3,3e-4' -> [0.001, 0.0003]; 'none' / 'default' / '-' -> None (the script's default)."""
    out: list[Any] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item.lower() in _NONE_WORDS:
            out.append(None)
            continue
        try:
            out.append(kind(item))
        except ValueError:
            raise GridError(f"{item!r} is not a valid {kind.__name__}") from None
    if not out:
        raise GridError(f"empty list {text!r}")
    return out


def _coerce(key: str, value: Any) -> Any:
    if key not in _FIELDS:
        raise GridError(f"unknown grid key {key!r}; known: {', '.join(sorted(_FIELDS))}")
    if key in AXES:
        items = list(value) if isinstance(value, list | tuple) else [value]
        if not items:
            raise GridError(f"{key}: empty list")
        out: list[Any] = []
        for item in items:
            if item is None or (isinstance(item, str) and item.lower() in _NONE_WORDS):
                if key in ("seeds", "llds", "steps_per_generation", "num_generations", "reward_design"):
                    raise GridError(f"{key}: a value is required, not {item!r}")
                out.append(None)
            elif key in _INT_AXES:
                if isinstance(item, bool) or not isinstance(item, int | str):
                    raise GridError(f"{key}: {item!r} is not an integer")
                out.append(int(item))
            elif key in _FLOAT_AXES:
                if isinstance(item, bool) or not isinstance(item, int | float | str):
                    raise GridError(f"{key}: {item!r} is not a number")
                out.append(float(item))
            elif key == "reward_design":
                if item not in REWARD_DESIGNS:
                    raise GridError(f"reward_design: {item!r} is not one of {', '.join(REWARD_DESIGNS)}")
                out.append(item)
            else:
                if item not in LLDS_MODES:
                    raise GridError(f"llds: {item!r} is not one of {', '.join(LLDS_MODES)}")
                out.append(item)
        return tuple(out)
    if key == "extra":
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise GridError("extra: a list of strings (script flags)")
        return tuple(value)
    if value is None:
        return None
    if key in ("steps", "warmup_steps", "batch_size"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise GridError(f"{key}: {value!r} is not an integer")
        return value
    if not isinstance(value, str):
        raise GridError(f"{key}: {value!r} is not a string")
    return value


def _apply(spec: GridSpec, values: Mapping[str, Any]) -> GridSpec:
    return dataclasses.replace(spec, **{k: _coerce(k, v) for k, v in values.items()})


def load_grid_file(path: Path) -> list[dict[str, Any]]:
    """A grid file: TOML (`.toml`) or JSON, a table of grid keys; optionally `grids = [{...}, ...]`, a
    list of sub-grids whose union is run (each inherits the top-level keys)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GridError(f"cannot read the grid file {path}: {exc.strerror or exc}") from None
    try:
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise GridError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise GridError(f"{path}: a table (object) of grid keys is expected")
    grids = data.pop("grids", None)
    if grids is None:
        return [data]
    if not isinstance(grids, list) or not grids or not all(isinstance(g, dict) for g in grids):
        raise GridError(f"{path}: `grids` must be a non-empty list of tables")
    return [{**data, **g} for g in grids]


def resolve_grid(
    preset: str | None = None,
    files: Sequence[Mapping[str, Any]] = (),
    overrides: Mapping[str, Any] | None = None,
) -> list[GridSpec]:
    """GridSpecs from a preset, the tables of a grid file (one GridSpec each) and overrides (later wins)."""
    base = GridSpec()
    if preset is not None:
        if preset not in PRESETS:
            raise GridError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
        base = _apply(base, PRESETS[preset])
    tables: Sequence[Mapping[str, Any]] = files or [{}]
    return [_apply(_apply(base, table), overrides or {}) for table in tables]


def expand(specs: GridSpec | Iterable[GridSpec]) -> list[RunSpec]:
    """The runs of one or more grids (their union, without duplicates), seed-major: every setting's
    first seed before any setting's second; settings in axis order. LLDS lambda is dropped for `off`."""
    grids = [specs] if isinstance(specs, GridSpec) else list(specs)
    runs: list[RunSpec] = []
    for g in grids:
        for setting in _settings(g):
            runs += [RunSpec(setting, seed) for seed in g.seeds]
    runs = list(dict.fromkeys(runs))
    seed_rank = {seed: i for i, seed in enumerate(dict.fromkeys(r.seed for r in runs))}
    setting_rank = {s: i for i, s in enumerate(dict.fromkeys(r.setting for r in runs))}
    return sorted(runs, key=lambda r: (seed_rank[r.seed], setting_rank[r.setting]))


def _settings(g: GridSpec) -> list[Setting]:
    combos = itertools.product(
        g.lr,
        g.steps_per_generation,
        g.num_generations,
        g.num_iterations,
        g.max_completion_length,
        g.reward_design,
        g.beta,
        g.llds,
        g.llds_lambda,
    )
    settings = [
        Setting(
            model=g.model,
            steps=g.steps,
            warmup_steps=g.warmup_steps,
            batch_size=g.batch_size,
            lr=lr,
            steps_per_generation=spg,
            num_generations=gen,
            num_iterations=it,
            max_completion_length=length,
            reward_design=design,
            beta=beta,
            llds=llds,
            llds_lambda=None if llds == "off" else lam,
            policy=g.policy,
            extra=g.extra,
        )
        for lr, spg, gen, it, length, design, beta, llds, lam in combos
    ]
    return list(dict.fromkeys(settings))


def _num(value: float | None) -> str:
    if value is None:
        return "def"
    return f"{value:g}".replace("+", "")


def _slug(text: str) -> str:
    name = Path(text).name or text
    return "".join(c if c.isalnum() or c in "-." else "-" for c in name)[:40]
