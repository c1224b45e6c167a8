"""Example task directories: data for the loaders, not tests to collect."""

collect_ignore_glob = ["*"]
