"""Past one process: tensor parallelism over `torch.distributed`. Every layer is split across
ranks (Megatron-style), one scheduler on rank 0 decides each step and the other ranks run the
same forward on their slices."""
