"""A stand-in for ``torchvision.utils.save_image`` (torchvision is not part of PyTorch or xgrad): it
checks the image batch's shape and writes nothing."""


def save_image(tensor, fp, nrow=8, **kwargs):
    assert tensor.dim() == 4 and tensor.shape[1] in (1, 3), tensor.shape
