"""The transfer benchmark's parts (benchmarks/transfer.py runs them): the peer processes, one per system under
test (peer, systems), the data they move (workload), the pairs that drive them (pair), the machine's facts
(machine), the bandwidth and TTFT parts (bandwidth, ttft, measurement), and the result's tables and file
(tables, result)."""
