"""Fixtures of the Linear module tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from module_cases import RecompileLog
from torch._dynamo.utils import counters

from transformer_engine_ops.modules.autocast import STATE
from transformer_engine_ops.runtime.fallback import reset_warnings


@pytest.fixture(autouse=True)
def fresh_compile_state() -> Iterator[None]:
    """Each test starts with no compiled code, empty counters and unwarned fallbacks."""
    torch._dynamo.reset()
    counters.clear()
    reset_warnings()
    saved = (STATE.autocast, STATE.model_init)
    yield
    STATE.autocast, STATE.model_init = saved
    torch._dynamo.reset()


@pytest.fixture
def recompile_log() -> Iterator[RecompileLog]:
    """Dynamo's recompile reasons, as logged by ``torch._logging``'s recompiles artifact."""
    handler = RecompileLog()
    torch._logging.set_logs(recompiles=True)
    logger = logging.getLogger(RecompileLog.LOGGER)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()
