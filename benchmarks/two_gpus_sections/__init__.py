"""The sections of benchmarks/gpu_two_gpus.py, each measured on a prefill device and a decode device: the
machine's facts (facts), the peer copy beside the P -> D transfer (link), the transfer's share of TTFT
(ttft), and 1P1D against two colocated instances behind the router (serving)."""

WARM_RUNS = 2  # untimed copies, transfers and requests before the timed ones (link and ttft)
