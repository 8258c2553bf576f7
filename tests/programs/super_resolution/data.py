# xgrad: a stand-in for pytorch/examples' super_resolution/data.py, which downloads BSDS300 and
# makes (low-resolution input, image) pairs of its luminance with torchvision's transforms. Here
# the image is random (one per set, so that shuffling, whose order cannot match PyTorch's, has
# nothing to reorder) and the input is its mean over each upscale_factor x upscale_factor block.
import numpy as np
import xgrad as torch
import xgrad.utils.data

CROP_SIZE = 12


def _pairs(upscale_factor, seed):
    low = CROP_SIZE // upscale_factor
    target = np.random.default_rng(seed).random((1, 1, low * upscale_factor, low * upscale_factor))
    input = target.reshape(1, 1, low, upscale_factor, low, upscale_factor).mean(axis=(3, 5))
    return torch.utils.data.TensorDataset(torch.from_numpy(input), torch.from_numpy(target))


def get_training_set(upscale_factor):
    return _pairs(upscale_factor, 0)


def get_test_set(upscale_factor):
    return _pairs(upscale_factor, 1)
