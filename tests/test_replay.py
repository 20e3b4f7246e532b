"""A recorded camera cannot take part in the built-in run: every transfer is acknowledged."""

from __future__ import annotations

import pytest
from conftest import make_config

def test_a_replaying_camera_in_the_built_in_run_is_a_config_error(tmp_path):
    from wccl.config import ConfigError
    from wccl.node import builtin_run_check

    (tmp_path / "x.nut").write_bytes(b"")
    cfg = make_config(room={"nodes": [{"name": "alice", "roles": ["server", "worker"]},
                                      {"name": "bob", "roles": ["worker"], "camera": "file",
                                       "camera_file": str(tmp_path / "x.nut")}]})
    with pytest.raises(ConfigError, match="cannot answer its peers"):
        builtin_run_check(cfg)
