"""EAGLE-3's accept length from SGLang's scheduler log, where /server_info no longer has it (issue 31)."""

from __future__ import annotations

from compatlab.stages.serve.stage import logged_accept_length


def test_the_last_logged_accept_length_is_read() -> None:
    lines = [
        "[2026-12-01 10:00:01] Decode batch. #running-req: 1, #token: 90, token usage: 0.00, accept len: 1.02, "
        "gen throughput (token/s): 151.20, #queue-req: 0",
        "[2026-12-01 10:00:02] Decode batch. #running-req: 8, #token: 700, token usage: 0.01, accept len: 1.31, "
        "gen throughput (token/s): 901.77, #queue-req: 0",
        "[2026-12-01 10:00:03] Cache flushed successfully!",
    ]
    assert logged_accept_length(lines) == 1.31
    assert logged_accept_length(lines[2:]) is None
    assert logged_accept_length(["Decode batch. accept len: 0.00"]) is None
