"""Recorded schedule spaces: real GPU timings of a workload's configs, shipped with tritune (the
`*.jsonl.gz` files here, described in README.md) or written by `tune-cli recording`.

- `format`: the file format, read and written (`read_lines`, `write_lines`, `Recording`);
- `replay`: a builder and runner that replay a recording instead of using a GPU (`RecordedBuilder`,
  `RecordedRunner`), so search is tested in CI with the real tuning loop;
- `pipeline`: writing recordings on a GPU (sample a space, re-time its fastest configs), joining
  parts of one space, loading recordings into a tuning database.
"""
from tritune.tuner.recordings.format import BUNDLED, Recording, RecordingError, read_lines, write_lines
from tritune.tuner.recordings.replay import RecordedBuilder, RecordedRunner

__all__ = ["BUNDLED", "Recording", "RecordingError", "RecordedBuilder", "RecordedRunner", "read_lines", "write_lines"]
