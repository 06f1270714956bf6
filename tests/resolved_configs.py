"""Every shipped config as it resolves (``base:`` chains followed, env defaults expanded), recorded as the
keys that differ from the built-in defaults: ``tests/test_config.py`` checks that nothing changes silently.
After an intended change to a config or a default, regenerate the record and review its diff:

    python tests/resolved_configs.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path(__file__).with_name("data") / "resolved_configs.json"


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def resolved_configs() -> dict[str, dict[str, Any]]:
    """configs/<name>.yaml -> {dotted key: value} for every key whose value is not the default (paths as
    written, i.e. with ``FR2EN_SHARED_DATA`` unset)."""
    from utils.config import from_dict, load_config

    if os.environ.get("FR2EN_SHARED_DATA") is not None:
        raise RuntimeError("unset FR2EN_SHARED_DATA: the record holds the configs' own default paths")
    defaults = _flat(from_dict({}).to_dict())
    out = {}
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        flat = _flat(load_config(path).to_dict())
        out[path.name] = {k: v for k, v in flat.items() if k not in defaults or defaults[k] != v}
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.pop("FR2EN_SHARED_DATA", None)
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(resolved_configs(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD}")
