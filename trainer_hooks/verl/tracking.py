"""Streaming verl's logged scalars to lldmon: `attach` wraps a `verl.utils.tracking.Tracking`'s `log`
so that every logged dict also goes to a sink under canonical names (`map_verl_metrics`), and passes
the service's LLDS directive on (`on_directive`, e.g. `directive_file_writer`); in a job restarted for
a rollback it reports the restored step (`ROLLBACK_METRIC`) with the first step trained again. Where
verl creates its `Tracking` and how to reach it: docs/hooks-verl.md."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from contracts.directive import ROLLBACK_METRIC, Directive, parse_directive
from trainer_hooks import rollback
from trainer_hooks._sink import ScalarSink
from trainer_hooks._warn import WarnOnce
from trainer_hooks.verl.names import map_verl_metrics

__all__ = ["attach", "attach_new_trackings", "default_sink_factory", "detach"]

logger = logging.getLogger("lldmon.verl")

_ORIGINAL_LOG: Final = "_lldmon_original_log"
_ORIGINAL_FINISH: Final = "_lldmon_original_finish"


def _restored_step() -> int | None:
    """The step this job restored for a rollback (`lldmon supervise`'s environment); None: none."""
    try:
        found = rollback.resumed()
    except ValueError as exc:
        logger.warning("lldmon: ignoring a malformed rollback environment: %s", exc)
        return None
    return None if found is None else found.step


def attach(
    tracking: Any,
    sink: ScalarSink,
    *,
    on_directive: Callable[[Any], object] | None = None,
    flush_timeout: float = 10.0,
) -> Any:
    """Make `tracking.log(data, step)` (a `verl.utils.tracking.Tracking`) also feed `sink`.

    After verl's own loggers ran, `sink.log(int(step), map_verl_metrics(data))` is called. With
    `on_directive`, `on_directive(sink.directive)` is then called whenever the sink's directive
    (`contracts.directive.parse_directive`: its LLDS switch, requests or acknowledged version) differs
    from the one last passed: the first time now if the sink already has one from the service (version
    > 0: a client resuming a run fetches it at start-up), else at the first log. Use
    `directive_file_writer(path)` to pass it to the verl workers through `llds_directive_file`
    (docs/hooks-verl.md says what reaches the workers and what not).

    In a job `lldmon supervise` restarted for a rollback (`trainer_hooks.rollback.resumed()`), the first
    log of a step after the restored one also carries `ROLLBACK_METRIC` (the restored step), which tells
    the service which steps are trained again. `tracking.finish()` (verl calls it when `fit` drops its
    `Tracking`) flushes the sink, waiting at most `flush_timeout` seconds, so that the last step's
    metrics leave before the job ends (also when it ends for a rollback).

    Anything lldmon does here is guarded: an error is logged once (logger `lldmon.verl`) and never
    reaches verl; verl's own logging runs first and unguarded. Attaching again replaces the
    previous attachment. Returns `tracking`.
    """
    original = tracking.__dict__.get(_ORIGINAL_LOG)
    if original is None:
        original = tracking.log
        tracking.__dict__[_ORIGINAL_LOG] = original
    warn = WarnOnce(logger)
    last_switch: list[Directive | None] = [None]
    restored: list[int | None] = [_restored_step()]  # reported with the first step after it

    def pass_directive(only_from_service: bool) -> None:
        if on_directive is None:
            return
        try:
            directive = getattr(sink, "directive", None)
            switch = parse_directive(directive) if directive is not None else None
            if only_from_service and (switch is None or switch.version == 0):
                return
            if switch is not None and switch != last_switch[0]:
                on_directive(directive)
                last_switch[0] = switch
        except Exception as exc:
            warn(("directive", type(exc).__name__), "lldmon: on_directive failed: %r", exc)

    def log(data: Any, step: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(data, step, *args, **kwargs)
        try:
            at = int(step)
            metrics = map_verl_metrics(data)
            marker = restored[0]
            if marker is not None and at > marker:
                metrics = {**metrics, ROLLBACK_METRIC: float(marker)}
            sink.log(at, metrics)
            if marker is not None and at > marker:
                restored[0] = None
        except Exception as exc:
            warn(("sink", type(exc).__name__), "lldmon: could not send verl metrics: %r", exc)
        pass_directive(only_from_service=False)
        return result

    original_finish = tracking.__dict__.get(_ORIGINAL_FINISH)
    if original_finish is None:
        original_finish = getattr(tracking, "finish", None)
        if original_finish is not None:
            tracking.__dict__[_ORIGINAL_FINISH] = original_finish

    def finish(*args: Any, **kwargs: Any) -> Any:
        try:
            return original_finish(*args, **kwargs) if original_finish is not None else None
        finally:
            flush = getattr(sink, "flush", None)
            if flush is not None:
                try:
                    flush(flush_timeout)
                except Exception as exc:
                    warn(("flush", type(exc).__name__), "lldmon: could not flush the sink: %r", exc)

    tracking.log = log
    if original_finish is not None:
        tracking.finish = finish
    pass_directive(only_from_service=True)
    return tracking


def _plain_config(config: Any) -> Mapping[str, Any] | None:
    """verl's config (an OmegaConf DictConfig, a dict or None) as plain containers for the run's config."""
    if config is None:
        return None
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            plain = OmegaConf.to_container(config, resolve=True)
            return plain if isinstance(plain, dict) else None
    except Exception:  # unresolvable interpolations, no omegaconf: fall back to the mapping itself
        pass
    return config if isinstance(config, Mapping) else None


def _takes_run_identity(factory: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    kinds = {p.kind for p in params.values()}
    return inspect.Parameter.VAR_KEYWORD in kinds or {"project", "experiment", "config"} <= set(params)


def default_sink_factory(*, project: str | None, experiment: str | None, config: Any) -> ScalarSink:
    """`MonitorClient.from_env(run=experiment, project=project, config=config)`: the run is named like
    verl's experiment, in verl's project (`LLDMON_RUN` / `LLDMON_PROJECT` win when set)."""
    import os

    from trainer_hooks.client import MonitorClient

    return MonitorClient.from_env(
        run=os.environ.get("LLDMON_RUN") or experiment,
        project=os.environ.get("LLDMON_PROJECT") or project,
        config=config,
    )


def attach_new_trackings(
    sink_factory: Callable[..., ScalarSink] | None = None,
    *,
    on_directive: Callable[[Any], object] | None = None,
) -> Callable[[], None]:
    """`attach` every `verl.utils.tracking.Tracking` created from now on **in this process**.

    verl 0.9.1 creates its `Tracking` inside the trainer (`RayPPOTrainer.init()` as
    `trainer.logger` in the default v1 trainer, a local variable of `fit()` in v0), and the trainer
    runs in the `TaskRunner` Ray actor, not in the launching process. So call this in that actor,
    e.g. from a module that the launching shell names in `VERL_USE_EXTERNAL_MODULES` (verl imports
    it in every process at `import verl`; Ray processes started by a local `ray.init` inherit the
    variable)::

        # my_lldmon_setup.py
        from trainer_hooks.client import MonitorClient
        from trainer_hooks.verl import attach_new_trackings, directive_file_writer
        attach_new_trackings(
            lambda: MonitorClient("http://lldmon:8000", "grpo-3b-nq", project="nq"),
            on_directive=directive_file_writer("/shared/lldmon/directive.json"),
        )

    `sink_factory` is called once per new `Tracking` (only the process that builds a trainer
    creates one, so other processes never open a client), with verl's names when it accepts them:
    `sink_factory(project=<trainer.project_name>, experiment=<trainer.experiment_name>, config=<the
    job's config as plain dicts>)`, else with no argument. None (default): `default_sink_factory`,
    a `MonitorClient.from_env()` named after verl's experiment in verl's project, so
    `attach_new_trackings()` with `LLDMON_URL` set is all a job needs. An exception in the factory
    is logged and the `Tracking` stays as verl made it. Returns a function that undoes the patch
    for later instances.
    """
    from verl.utils import tracking as tracking_module

    cls = tracking_module.Tracking
    original_init = cls.__init__
    factory: Callable[..., ScalarSink] = sink_factory if sink_factory is not None else default_sink_factory
    with_identity = _takes_run_identity(factory)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        try:
            if with_identity:
                bound = inspect.signature(original_init).bind(self, *args, **kwargs)
                bound.apply_defaults()
                names = bound.arguments
                sink = factory(
                    project=names.get("project_name"),
                    experiment=names.get("experiment_name"),
                    config=_plain_config(names.get("config")),
                )
            else:
                sink = factory()
            attach(self, sink, on_directive=on_directive)
        except Exception as exc:
            logger.warning("lldmon: could not attach to a verl Tracking: %r", exc)

    cls.__init__ = __init__

    def undo() -> None:
        cls.__init__ = original_init

    return undo


def detach(tracking: Any) -> None:
    """Undo `attach`: `tracking.log` is verl's own again (no-op if not attached)."""
    for name, key in (("log", _ORIGINAL_LOG), ("finish", _ORIGINAL_FINISH)):
        original = tracking.__dict__.pop(key, None)
        if original is not None:
            tracking.__dict__.pop(name, None)
            if getattr(tracking, name, None) != original:  # it was an instance attribute before
                setattr(tracking, name, original)
