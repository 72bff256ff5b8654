"""The NCCL stage: ranks as processes, correctness, bus bandwidth, hangs as verdicts."""
