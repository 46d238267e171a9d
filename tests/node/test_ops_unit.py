"""The systemd unit shipped in docs/ops: its example config is one `accord serve` accepts."""

from __future__ import annotations

from pathlib import Path

from accord.node.config import load_config

UNIT = Path(__file__).resolve().parents[2] / "docs" / "ops" / "accord.service"


def test_the_units_example_config_loads(tmp_path: Path) -> None:
    text = UNIT.read_text()
    lines = text.split("# Example /etc/accord/accord.toml", 1)[1].splitlines()[2:]
    toml = []
    for line in lines:
        body = line.removeprefix("#").strip()
        if not body:
            break
        if not body.startswith("#"):
            toml.append(body)
    path = tmp_path / "accord.toml"
    path.write_text("\n".join(toml) + "\n")
    cfg = load_config(["--config-file", str(path)], environ={})
    assert cfg.name == "n1" and len(cfg.members()) == 3
    assert cfg.data_dir == "/var/lib/accord/n1" and cfg.cluster_token == "prod-1"
    assert "ExecStart=/usr/local/bin/accord serve --config-file /etc/accord/accord.toml" in text
