"""The autograd engine: graph nodes, saved tensors, hooks and the scheduler."""
