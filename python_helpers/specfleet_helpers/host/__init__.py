"""Host runtime: what runs on each host around the stages.

The stage runner, the host lock, the vLLM server lifecycle, process bookkeeping, host
probes, the container, npu-smi parsing, stamps and wheel tags.
"""
