"""Placement codes shared by the distributed tests: "R" Replicate, "S<d>" Shard(d), "SS<d>"
_StridedShard(d) (the placement FSDP2 + TP gives a parameter sharded twice on one dimension)."""


def placement(code: str, split_factor: int = 2):
    """The DTensor placement of ``code``; ``split_factor`` only for "SS<d>"."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if code == "R":
        return Replicate()
    if code.startswith("SS"):
        return _StridedShard(int(code[2:]), split_factor=split_factor)
    return Shard(int(code[1:]))
