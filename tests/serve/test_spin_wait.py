"""Served sessions do not spin between runs unless the configuration asks for it."""

from __future__ import annotations

from turboinfer.engines import EngineSettings
from turboinfer.engines.onnxruntime import session_options
from turboinfer.serve.config import EngineSettingsConfig, ModelConfig


def _spinning(settings: EngineSettings) -> bool:
    options = session_options(settings)
    # ONNX Runtime spins unless the entry says "0" (an unset entry reads as missing).
    try:
        return options.get_session_config_entry("session.intra_op.allow_spinning") != "0"
    except RuntimeError:
        return True


def test_served_sessions_do_not_spin_by_default() -> None:
    assert not _spinning(ModelConfig().engine_settings.to_settings())


def test_spinning_is_kept_where_asked_and_for_other_callers() -> None:
    assert _spinning(EngineSettingsConfig(spin_wait=True).to_settings())
    assert _spinning(EngineSettings())  # bench, tune: ONNX Runtime's default
