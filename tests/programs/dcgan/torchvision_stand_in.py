"""Stand-ins for what dcgan/main.py takes from torchvision (not part of PyTorch or xgrad): ``FakeData``
(random images in [0, 1), one by default: shuffling, whose order cannot match PyTorch's, has nothing to
reorder), ``ToTensor`` (the images are tensors already) and ``save_image`` (checks the shape, writes nothing)."""
import numpy as np
import xgrad as torch


def FakeData(size=1, image_size=(3, 224, 224), num_classes=10, transform=None, random_offset=0):
    rng = np.random.default_rng(random_offset)
    images = torch.from_numpy(rng.random((size, *image_size)))
    labels = torch.from_numpy(rng.integers(0, num_classes, size))
    return torch.utils.data.TensorDataset(transform(images) if transform else images, labels)


def ToTensor():
    return lambda images: images


def save_image(tensor, fp, nrow=8, **kwargs):
    assert tensor.dim() == 4 and tensor.shape[1] in (1, 3), tensor.shape
