"""The compile cache's tag: the user's own ``cache_key_tag`` keeps every character, and
the lowered kernels' fingerprint is its last ``+`` part, replaced (never repeated) when
it changes."""

from __future__ import annotations

import pytest
import torch

from transformer_engine_ops.runtime import lowering

OLD, NEW = "0123456789abcdef", "fedcba9876543210"


@pytest.mark.parametrize(
    "user",
    ["", "users-own", "team+run++7", "+", "x+", "+lead", "a++", "teops-lowered-x", "ü+ß"],
)
def test_the_users_tag_keeps_every_character_and_ours_comes_last(user):
    once = lowering.tagged(user, OLD)
    assert once == (f"{user}+teops-lowered-{OLD}" if user else f"teops-lowered-{OLD}")
    assert lowering.tagged(once, OLD) == once, "tagging again changes nothing"
    assert lowering.tagged(once, NEW) == once.replace(OLD, NEW), "a new digest replaces ours"


def test_a_part_the_user_appended_after_ours_is_kept_and_ours_moves_last():
    tag = lowering.tagged(f"teops-lowered-{OLD}+later", NEW)
    assert tag == f"later+teops-lowered-{NEW}"
    tag = lowering.tagged(f"a+teops-lowered-{OLD}+b", NEW)
    assert tag == f"a+b+teops-lowered-{NEW}"


def test_a_lowered_fake_tags_the_users_config_without_losing_characters():
    with torch.compiler.config.patch(cache_key_tag="team+run++7"):
        lowering._tag_cache_key()
        assert torch.compiler.config.cache_key_tag == (
            f"team+run++7+teops-lowered-{lowering.source_fingerprint()}"
        )
