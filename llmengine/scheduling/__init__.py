"""Who runs in the next forward: requests and their lifecycle, the scheduler and its parts
(decision objects, allocation policy, block manager, swap space). Integers only, no tensors."""
