"""Several processes (and GPUs) through torch.distributed: the process group, data sharding, DDP,
and a launcher (torch's elastic agent, as ``torchrun``)."""
