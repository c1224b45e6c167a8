"""Silence timeouts for the healthy peers of tests that run live cells, satellites or shards: 30 s, not the shipped
5 s (cells, members) or 10 s (shards). A loaded machine (CI, two test workers on two cores) can leave a healthy
process unscheduled for seconds, and silence is all these timeouts see. A test of a fault lowers only its victim's
key, and keeps it at 20 s or more where healthy peers of the same kind share it."""

from __future__ import annotations

CELL_TIMEOUT_S = 30  # controller.cell_timeout_s
MEMBER_TIMEOUT_S = 30  # trainer.member_timeout_s (satellites also judge the core silent after twice this)
SHARD_TIMEOUT_S = 30  # shards.timeout_s

# as overrides: load_config(..., overrides), --set, a Live cluster's BASE
ROBUST = [
    f"controller.cell_timeout_s={CELL_TIMEOUT_S}",
    f"trainer.member_timeout_s={MEMBER_TIMEOUT_S}",
    f"shards.timeout_s={SHARD_TIMEOUT_S}",
]

# as TOML: one line for each table's body, to merge into a config's own [controller], [trainer] and [shards] (TOML
# refuses a table defined twice), or all three tables for a config that has none of them
CONTROLLER_TOML = f"cell_timeout_s = {CELL_TIMEOUT_S}"
TRAINER_TOML = f"member_timeout_s = {MEMBER_TIMEOUT_S}"
SHARDS_TOML = f"timeout_s = {SHARD_TIMEOUT_S}"
ROBUST_TOML = f"[controller]\n{CONTROLLER_TOML}\n\n[trainer]\n{TRAINER_TOML}\n\n[shards]\n{SHARDS_TOML}\n"
