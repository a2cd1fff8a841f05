# The embedded engine: one append-only log of checksummed records in segment
# files, its in-memory index and index checkpoints, recovery and compaction.
