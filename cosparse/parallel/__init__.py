"""Many ranks on torch.distributed: the world (torchrun's ranks, gloo or NCCL), each table's
sharding plan, the sharded embedding collection that distributes IDs in and pooled rows out
around each rank's own table placements, and the dense model's data parallelism.

One process needs none of it: ``cosparse.train`` uses this package only under ``torchrun``.
"""
