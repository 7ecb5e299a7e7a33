"""The public surface of `trainer_hooks.verl` is pinned, and importing it never needs verl.

Runs in the main virtualenv (no verl there); the verl-dependent classes are checked against the real
package in test_verl.py. A name leaving or joining `__all__` is an API change users see.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import trainer_hooks.verl as tv

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = sorted(
    [
        "ADV_NEG_MASS",
        "ADV_NEG_MASS_ANSWER",
        "ADV_POS_MASS",
        "ADV_POS_MASS_ANSWER",
        "AnswerSpanFinder",
        "DirectiveLevers",
        "DELTA_METRICS",
        "LEVEL_METRICS",
        "LLDS_METRICS",
        "LOSS_METRICS",
        "LOSS_NAME",
        "LossExtras",
        "LossSettings",
        "MetricSink",
        "SETTING_KEYS",
        "ScalarSink",
        "VERL_TO_CANONICAL",
        "XMB_METRICS",
        "attach",
        "attach_new_trackings",
        "current_loss_extras",
        "detach",
        "directive_file_writer",
        "get_llds_override",
        "install",
        "llds_from_directive",
        "loss_extras",
        "map_verl_metrics",
        "policy_loss_config_class",
        "register",
        "set_llds_override",
        "training_worker_class",
        "weight_key",
        "write_directive",
        "write_llds_directive",
    ]
)

LAZY = ["LLDMonPolicyLossConfig", "LLDMonTrainingWorker"]
"""Subclasses of verl classes, built on first access (`_target_` paths in users' verl configs), kept out
of `__all__` so that `from trainer_hooks.verl import *` never imports verl."""


def test_public_api_is_pinned_and_resolves() -> None:
    assert sorted(tv.__all__) == PUBLIC
    assert len(set(tv.__all__)) == len(tv.__all__)
    for name in tv.__all__:
        assert getattr(tv, name) is not None, name


def test_star_import_needs_no_verl() -> None:
    namespace: dict[str, object] = {}
    exec("from trainer_hooks.verl import *", namespace)
    assert set(PUBLIC) <= set(namespace)


def test_importing_the_package_does_not_import_verl() -> None:
    code = (
        "import sys, trainer_hooks.verl, trainer_hooks.verl.actor, trainer_hooks.verl.config\n"
        "assert 'verl' not in sys.modules, 'verl imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed here")
@pytest.mark.parametrize("name", LAZY)
def test_verl_classes_need_verl_only_when_accessed(name: str) -> None:
    with pytest.raises(ImportError):
        getattr(tv, name)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        tv.no_such_name  # noqa: B018
