"""The transfer benchmark's peers: one process per system under test (benchmarks/transfer.py starts them)."""
