"""PyTorch's ``torch.nn.modules.dropout`` path (the classes live in ``xgrad.nn.dropout``)."""

from xgrad.nn.dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout

__all__ = ["AlphaDropout", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "FeatureAlphaDropout"]
