"""``xgrad.autograd.graph``: the graph's node types and saved-tensor hooks."""

from xgrad.engine.node import AccumulateGrad, Edge, GraphRoot, Node
from xgrad.engine.saved import save_on_cpu, saved_tensors_hooks

__all__ = ["AccumulateGrad", "Edge", "GraphRoot", "Node", "save_on_cpu", "saved_tensors_hooks"]
